"""Stop strings over a stream of token ids: where a match begins, and how many tokens are safe to send.

Text is matched, not tokens: a stop string may span several tokens, and a token may hold several
characters or only part of one (multi-byte UTF-8). The matched text is stripped, as vLLM and the
TensorRT-LLM backend do by default; since outputs are token ids, stripping is at token granularity:
output ends with the last token that ends before the match (text before the match inside that token is
dropped with it). Tokens whose text could still grow into a match are held back until it is clear,
so nothing already sent has to be taken back.
"""

from __future__ import annotations

from dataclasses import dataclass

INCOMPLETE = "\ufffd"  # what decoding shows for the first bytes of a multi-byte character


@dataclass
class StopScan:
    """Per request: characters of output text before `scan_from` hold no match start (already checked)."""

    scan_from: int = 0


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)  # as the detokenizer renders it


def find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Character index of the earliest stop string beginning at or after `start`."""
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def pending_chars(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that could be the beginning of a stop string: an incomplete
    character, plus the longest suffix before it that is a proper prefix of some stop string."""
    complete = text.rstrip(INCOMPLETE)
    held = len(text) - len(complete)
    longest = max(map(len, stops)) - 1
    for k in range(min(longest, len(complete)), 0, -1):
        if any(s.startswith(complete[-k:]) for s in stops):
            return held + k
    return held


def tokens_within(tokenizer, ids: list[int], chars: int) -> int:
    """The most leading tokens of `ids` whose text fits in the first `chars` characters."""
    k = len(ids)
    while k and len(decode(tokenizer, ids[:k])) > chars:
        k -= 1
    return k


def scan(tokenizer, ids: list[int], stops: tuple[str, ...], state: StopScan, may_stop: bool) -> tuple[int, bool]:
    """(tokens of `ids` safe to send, whether a stop string matched; if so `ids` ends there).
    `may_stop` False (min_tokens not reached) skips matching but still moves the scan on."""
    text = decode(tokenizer, ids)
    settled = len(text) - pending_chars(text, stops)
    if may_stop and (at := find_stop(text, stops, state.scan_from)) is not None:
        return tokens_within(tokenizer, ids, at), True
    # a match starting before `settled` would already be complete, so none can start there any more
    state.scan_from = max(state.scan_from, settled)
    return tokens_within(tokenizer, ids, settled), False
