"""What the OpenAI frontend's test backends share: a backend with nothing to connect to and always
healthy; each test's subclass says how it streams."""

from __future__ import annotations

# usage's prompt_tokens_details where the prefix cache served nothing
NO_CACHE = {"prompt_tokens_details": {"cached_tokens": 0}}


class StandInBackend:
    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def unhealthy(self) -> str | None:
        return None
