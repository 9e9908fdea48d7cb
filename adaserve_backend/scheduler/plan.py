"""What crosses the scheduler's boundary: the plan of one iteration and the record of what it did."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sequence import Sequence


@dataclass
class IterationPlan:
    """decode: requests verifying a token tree (or decoding one token); prefill: prompt tokens to
    prefill per request; depth/width: the draft's beam search (0: no speculation); failed: requests
    the scheduler ended (message per request) and the engine must report."""

    start: float
    decode: list[Sequence] = field(default_factory=list)
    prefill: dict[Sequence, int] = field(default_factory=dict)
    depth: int = 0
    width: int = 0
    failed: list[tuple[Sequence, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefill.values())


@dataclass(frozen=True)
class IterationStats:
    """One decode iteration, as measured (times in seconds)."""

    n: int  # decoding requests
    depth: int
    width: int
    verified_tokens: int  # tree tokens verified, roots included
    prefill_tokens: int  # prefill chunk tokens riding along
    accepted: int  # tokens produced by the verifications, bonus tokens included
    latency: float
    speculation: float
    selection: float
    verification: float  # with acceptance and commit
