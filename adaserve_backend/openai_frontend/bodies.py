"""OpenAI response bodies: whole completions, streamed chunks and usage, for `/v1/completions` and
`/v1/chat/completions` (shapes as OpenAI's API reference and vLLM's server give them)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from .logprobs import Entry, Renderer, entries, prompt_entries
from .tools import ToolUse, parse_calls


@dataclass
class Choice:
    """What one of a request's choices (OpenAI's `n`) produced so far."""

    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    streamed: bool = False  # its first chunk went out (a chat choice's first delta names the role)
    logprobs: list[Entry] = field(default_factory=list)  # every token's so far, where the request asked
    unsent: list[Entry] = field(default_factory=list)  # those no chunk has carried yet
    echo: str = ""  # with echo: the prompt's text, ahead of the choice's own (and its tokens' logprobs)
    echo_logprobs: list[Entry] = field(default_factory=list)
    prediction: dict[str, int] | None = None  # Predicted Outputs' accepted and rejected tokens, once reported

    def add_logprobs(self, items: list[Entry]) -> None:
        self.logprobs += items
        self.unsent += items


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
    continuous_usage: bool = False  # ... continuous_usage_stats (vLLM's): every chunk says the usage so far
    logprobs: Renderer | None = None  # the request asked for logprobs: how they read
    score_only: bool = False  # echo with max_tokens 0: the prompt is the answer; the one token made is dropped
    dropped_tokens: int = 0  # best_of: the tokens of candidates not returned (usage still counts them)
    service_tier: str | None = None  # the tier the response names (service_tiers.served_tier)
    tools: ToolUse | None = None  # chat with tools: an answer that is a call comes back as tool_calls (tools.py)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_counts: list[int] = field(default_factory=list)  # each prompt's tokens
    cached_counts: list[int] = field(default_factory=list)  # ... of those, taken from the prefix cache
    choices: list[Choice] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.choices = self.choices or [Choice() for _ in range(self.prompts * self.n)]
        self.n = len(self.choices) // self.prompts
        self.prompt_counts = self.prompt_counts or [0] * self.prompts
        self.cached_counts = self.cached_counts or [0] * self.prompts

    def echo(self, prompts: list[str]) -> None:
        """Each choice's text starts with its prompt's."""
        for i, c in enumerate(self.choices):
            c.echo = prompts[i // self.n]

    def take(self, index: int, text: str | None, extra: dict) -> str | None:
        """A backend response of choice `index` (its text delta, None once it ended; `extra`: counts,
        finish reason, logprobs), recorded; returns the delta to send."""
        c = self.choices[index]
        if "prompt_logprobs" in extra:
            c.echo_logprobs = prompt_entries(extra["prompt_logprobs"])
        if "num_input_tokens" in extra:
            self.count_prompt(index, int(extra["num_input_tokens"]))
        if "num_cached_tokens" in extra and index % self.n == 0:  # a prompt's, as its first choice found it
            self.cached_counts[index // self.n] = int(extra["num_cached_tokens"])
        if self.score_only:
            c.finish_reason = "length"
            return None if text is None else ""
        c.text += text or ""
        if "logprobs" in extra:
            c.add_logprobs(entries(extra["logprobs"]))
        if "num_output_tokens" in extra:
            c.completion_tokens = int(extra["num_output_tokens"])
        if "accepted_prediction_tokens" in extra:
            c.prediction = {k: int(extra[k]) for k in ("accepted_prediction_tokens", "rejected_prediction_tokens")}
        if "finish_reason" in extra:
            reason = extra["finish_reason"]
            c.finish_reason = (reason.decode() if isinstance(reason, bytes) else str(reason)) or None
        return text

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
        return sum(c.completion_tokens for c in self.choices) + self.dropped_tokens

    def keep_best(self, n: int) -> None:
        """best_of: of each prompt's candidates the n with the highest log-probability per token, as
        OpenAI ranks them; every candidate's tokens still count in usage, as OpenAI counts them."""
        total, kept = self.completion_tokens, []
        for p in range(self.prompts):
            candidates = self.choices[p * self.n:(p + 1) * self.n]
            kept += sorted(candidates, key=lambda c: -sum(e.logprob for e in c.logprobs) / max(len(c.logprobs), 1))[:n]
        self.choices, self.n = kept, n
        self.dropped_tokens = total - sum(c.completion_tokens for c in kept)

    def usage(self) -> dict:
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens,
               "prompt_tokens_details": {"cached_tokens": sum(self.cached_counts)}}
        predicted = [c.prediction for c in self.choices if c.prediction is not None]
        if predicted:  # as OpenAI reports Predicted Outputs
            out["completion_tokens_details"] = {k: sum(p[k] for p in predicted) for k in predicted[0]}
        return out

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        head = {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": kind,
                "created": self.created, "model": self.model}
        return head | ({"service_tier": self.service_tier} if self.service_tier else {})

    def whole(self) -> dict:
        """The non-streaming response."""
        choices = []
        for i, c in enumerate(self.choices):
            logprobs = self._logprobs(c.echo_logprobs + c.logprobs, 0)
            if self.chat:
                calls = parse_calls(c.text, self.tools) if self.tools is not None else None
                message = ({"role": "assistant", "content": c.text} if calls is None
                           else {"role": "assistant", "content": None, "tool_calls": calls})
                choices.append({"index": i, "message": message, "logprobs": logprobs,
                                "finish_reason": c.finish_reason if calls is None else "tool_calls"})
            else:
                choices.append({"index": i, "text": c.echo + c.text, "logprobs": logprobs,
                                "finish_reason": c.finish_reason})
        return {**self._head(chunk=False), "choices": choices, "usage": self.usage()}

    def chunks(self, delta: str | None, finish_reason: str | None = None, index: int = 0) -> list[dict]:
        """What goes out for choice `index`'s text delta (None: it ended, with `finish_reason`). With
        tools the text is held: whether the answer is a call is known at its end, then it goes out as
        tool_calls deltas, or as the text."""
        c = self.choices[index]
        if self.tools is None:
            if delta is not None and not delta and (c.streamed or not self.chat):
                return []
            return [self.chunk(delta, finish_reason, index)]
        if delta is not None:
            return []
        calls = parse_calls(c.text, self.tools)
        if calls is None:
            return [self.chunk(c.text, index=index), self.chunk(finish_reason=finish_reason, index=index)]
        c.streamed, c.unsent = True, []
        deltas = [{"index": k, **call} for k, call in enumerate(calls)]
        head = {**self._head(chunk=True), **({"usage": None} if self.include_usage else {})}
        first = {"index": index, "delta": {"role": "assistant", "content": None, "tool_calls": deltas},
                 "logprobs": None, "finish_reason": None}
        return [{**head, "choices": [first]}, self.chunk(finish_reason="tool_calls", index=index)]

    def chunk(self, delta: str | None = None, finish_reason: str | None = None, index: int = 0) -> dict:
        """A streamed chunk of choice `index`: a text delta, or its last one carrying the finish reason.
        A chat choice's first chunk names the role."""
        c = self.choices[index]
        first, c.streamed = not c.streamed, True
        unsent, offset = c.unsent, len(c.echo) + len(c.text) - len(delta or "")
        if first and c.echo:  # the prompt leaves first, as it would have been generated
            delta, unsent, offset = c.echo + (delta or ""), c.echo_logprobs + unsent, 0
        logprobs, c.unsent = self._logprobs(unsent, offset, chunk=True), []
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": delta or "", "logprobs": logprobs, "finish_reason": finish_reason}
        # as OpenAI's stream: with usage asked for, content chunks carry "usage": null, the last one the counts
        usage = ({"usage": self.usage()} if self.continuous_usage
                 else {"usage": None} if self.include_usage else {})
        return {**self._head(chunk=True), "choices": [choice], **usage}

    def _logprobs(self, items: list[Entry], offset: int, chunk: bool = False) -> dict | None:
        if self.logprobs is None or (chunk and not items):  # a chunk without tokens says null, as OpenAI's
            return None
        return self.logprobs.chat(items) if self.chat else self.logprobs.completion(items, offset)

    def usage_chunk(self) -> dict:
        """`stream_options.include_usage`: a last chunk with no choices and the request's usage."""
        return {**self._head(chunk=True), "choices": [], "usage": self.usage()}


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


DONE = sse("[DONE]")
