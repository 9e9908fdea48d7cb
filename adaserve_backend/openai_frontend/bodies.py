"""OpenAI response bodies: whole completions, streamed chunks and usage, for `/v1/completions` and
`/v1/chat/completions` (shapes as OpenAI's API reference and vLLM's server give them)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field


@dataclass
class Tally:
    """What one request produced so far; the ensemble reports token counts with its responses."""

    endpoint: str  # "completions" or "chat"
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    @property
    def chat(self) -> bool:
        return self.endpoint == "chat"

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": kind,
                "created": self.created, "model": self.model}

    def whole(self) -> dict:
        """The non-streaming response."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text}, "logprobs": None,
                      "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None, "finish_reason": self.finish_reason}
        return {**self._head(chunk=False), "choices": [choice], "usage": self.usage()}

    def chunk(self, delta: str | None = None, finish_reason: str | None = None, first: bool = False) -> dict:
        """A streamed chunk: a text delta, or the last one carrying the finish reason."""
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(chunk=True), "choices": [choice]}

    def usage_chunk(self) -> dict:
        """`stream_options.include_usage`: a last chunk with no choices and the request's usage."""
        return {**self._head(chunk=True), "choices": [], "usage": self.usage()}


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


DONE = sse("[DONE]")
