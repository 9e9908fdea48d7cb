"""Log-probabilities in OpenAI's shapes: chat's `logprobs.content` (token, logprob, bytes, top_logprobs)
and completions' `logprobs` (tokens, token_logprobs, top_logprobs, text_offset), from what the backend
reports per response (the `adaserve` model's output_ids, output_log_probs, top_log_probs and
top_log_prob_ids). The values are the engine's (sampling.token_logprobs): the target's own at each
position, as plain decoding gives them, whatever speculation verified."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .field_readers import OpenAIError

# JSON has no -inf (a token top-k or top-p filtered out): OpenAI-compatible servers send this instead.
FLOOR = -9999.0


@dataclass(frozen=True)
class Entry:
    token: int
    logprob: float | None  # None: a prompt's first token, which nothing before it predicts
    top: tuple[tuple[int, float], ...]


def entries(reported: dict) -> list[Entry]:
    """One Entry per token of a response: `reported` holds the arrays ids, logprobs, top_ids, top."""
    ids, lps = np.asarray(reported["ids"]).reshape(-1), np.asarray(reported["logprobs"]).reshape(-1)
    top_ids, top = np.asarray(reported["top_ids"]).reshape(-1), np.asarray(reported["top"]).reshape(-1)
    per = len(top) // len(ids) if len(ids) else 0
    return [Entry(int(i), float(lp), tuple(zip(top_ids[k * per:(k + 1) * per].tolist(),
                                                top[k * per:(k + 1) * per].tolist())))
            for k, (i, lp) in enumerate(zip(ids.tolist(), lps.tolist()))]


def prompt_entries(reported: dict) -> list[Entry]:
    """A prompt's: its first token with no logprob, then one Entry per later token."""
    ids = np.asarray(reported["ids"]).reshape(-1).tolist()
    return [Entry(ids[0], None, ())] + entries({**reported, "ids": ids[1:]}) if ids else []


def _value(lp: float) -> float:
    return max(lp, FLOOR)


@dataclass(frozen=True)
class Renderer:
    """How token ids read as text (the served tokenizer's decoding of each token alone)."""

    text_of: Callable[[int], str]
    decode: Callable[[list[int]], str] | None = None  # a token-id prompt as text (echo)

    @classmethod
    def of(cls, tokenizer) -> Renderer:
        return cls(lambda i: tokenizer.decode([i]), lambda ids: tokenizer.decode(ids))

    def _token(self, token: int, logprob: float) -> dict:
        text = self.text_of(token)
        return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}

    def chat(self, items: list[Entry]) -> dict:
        """A chat choice's (or chunk's) `logprobs`."""
        return {"content": [self._token(e.token, e.logprob) | {"top_logprobs": [self._token(t, v) for t, v in e.top]}
                            for e in items], "refusal": None}

    def completion(self, items: list[Entry], offset: int) -> dict:
        """A completion choice's (or chunk's) `logprobs`, its text starting at character `offset`."""
        tokens = [self.text_of(e.token) for e in items]
        starts = np.cumsum([0] + [len(t) for t in tokens[:-1]]).tolist() if tokens else []
        return {"tokens": tokens, "token_logprobs": [None if e.logprob is None else _value(e.logprob) for e in items],
                # the chosen token among the alternatives (up to N + 1 of them), as OpenAI's completions give it
                "top_logprobs": [None if e.logprob is None else
                                 {self.text_of(t): _value(v) for t, v in e.top} | {tokens[k]: _value(e.logprob)}
                                 for k, e in enumerate(items)],
                "text_offset": [offset + s for s in starts]}


def echo_text(prompt, renderer: Renderer | None) -> str:
    """A prompt's text for echo: as sent, or token ids decoded by the served tokenizer."""
    if isinstance(prompt, str):
        return prompt
    if renderer is None or renderer.decode is None:
        raise OpenAIError(400, "echo of a token-id prompt needs the served tokenizer", "echo")
    return renderer.decode(list(prompt))
