"""What the OpenAI frontend's test backends share: a backend with nothing to connect to and always
healthy; each test's subclass says how it streams."""

from __future__ import annotations


class StandInBackend:
    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def unhealthy(self) -> str | None:
        return None
