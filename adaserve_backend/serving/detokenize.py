"""Byte-exact incremental detokenization across stateless ensemble steps.

The scheduler keeps, per request, which output ids have been rendered; each response carries the new
ids plus a short window of already-rendered context ids, and the detokenizer returns
decode(context + new) minus decode(context). The context window makes leading spaces come out right
(SentencePiece drops the space of a sequence's first token), and ids whose text ends in an incomplete
UTF-8 character are held back until the character completes, so concatenated deltas always equal
decoding the whole output at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

CONTEXT_WINDOW = 6  # ids; enough for any multi-token character or merge across the boundary
REPLACEMENT = "\ufffd"


def text_delta(tokenizer, context_ids: list[int], new_ids: list[int]) -> str:
    """The text `new_ids` add after `context_ids`."""
    if not new_ids:
        return ""
    before = tokenizer.decode(context_ids, skip_special_tokens=True) if context_ids else ""
    after = tokenizer.decode(context_ids + new_ids, skip_special_tokens=True)
    return after[len(before) :]


class Rendered(NamedTuple):
    """What one response carries: the ids it renders, the context they render after, their text."""

    context_ids: list[int]
    ids: list[int]
    text: str


@dataclass
class StreamState:
    """Per request: ids already sent for rendering, and the tail held back."""

    rendered: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)

    def hold(self, new_ids: list[int]) -> None:
        """Keep ids for a later push, without rendering them now."""
        self.held.extend(new_ids)

    def push(self, tokenizer, new_ids: list[int], final: bool) -> Rendered | None:
        """What to send now, or None when everything is held back for now."""
        self.held.extend(new_ids)
        context = self.rendered[-CONTEXT_WINDOW:]
        delta = text_delta(tokenizer, context, self.held)
        if not final and (not delta or delta.endswith(REPLACEMENT)):  # nothing visible yet, or half a character
            return None
        ids, self.held = self.held, []
        self.rendered.extend(ids)
        return Rendered(context, ids, delta)
