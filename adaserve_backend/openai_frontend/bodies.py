"""OpenAI response bodies: whole completions, streamed chunks and usage, for `/v1/completions` and
`/v1/chat/completions` (shapes as OpenAI's API reference and vLLM's server give them)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field


@dataclass
class Choice:
    """What one of a request's choices (OpenAI's `n`) produced so far."""

    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    streamed: bool = False  # its first chunk went out (a chat choice's first delta names the role)


@dataclass
class Tally:
    """What one request produced so far; the ensemble reports token counts with its responses. Choice i
    reads prompt i // n (a batched completion's prompts, each with its n choices, in order); a prompt is
    counted once however many choices read it, as OpenAI and vLLM count it."""

    endpoint: str  # "completions" or "chat"
    model: str
    n: int = 1  # choices of each prompt
    prompts: int = 1
    include_usage: bool = False  # streamed with stream_options.include_usage: every chunk says "usage"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_counts: list[int] = field(default_factory=list)  # each prompt's tokens
    choices: list[Choice] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.choices = self.choices or [Choice() for _ in range(self.prompts * self.n)]
        self.n = len(self.choices) // self.prompts
        self.prompt_counts = self.prompt_counts or [0] * self.prompts

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_counts)

    def count_prompt(self, index: int, tokens: int) -> None:
        """Choice `index` reported its prompt's tokens."""
        self.prompt_counts[index // self.n] = tokens

    @property
    def chat(self) -> bool:
        return self.endpoint == "chat"

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": kind,
                "created": self.created, "model": self.model}

    def whole(self) -> dict:
        """The non-streaming response."""
        choices = []
        for i, c in enumerate(self.choices):
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                                "finish_reason": c.finish_reason})
            else:
                choices.append({"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason})
        return {**self._head(chunk=False), "choices": choices, "usage": self.usage()}

    def chunk(self, delta: str | None = None, finish_reason: str | None = None, index: int = 0) -> dict:
        """A streamed chunk of choice `index`: a text delta, or its last one carrying the finish reason.
        A chat choice's first chunk names the role."""
        first, self.choices[index].streamed = not self.choices[index].streamed, True
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": index, "delta": d, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": delta or "", "logprobs": None, "finish_reason": finish_reason}
        # as OpenAI's stream: with usage asked for, content chunks carry "usage": null, the last one the counts
        return {**self._head(chunk=True), "choices": [choice], **({"usage": None} if self.include_usage else {})}

    def usage_chunk(self) -> dict:
        """`stream_options.include_usage`: a last chunk with no choices and the request's usage."""
        return {**self._head(chunk=True), "choices": [], "usage": self.usage()}


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


DONE = sse("[DONE]")
