"""How many tokens a request will still produce, when its client gives only a cap.

Real clients send `max_tokens` as a limit and let the model end at its end-of-sequence token, so the
cap says little about a request's real length. Planning with the cap makes every decoding request
look far from its end: admission thinks a request that is behind its TPOT target has many tokens left
to lose time on (or to win it back on), and prefill pacing sizes chunks by that. Instead the
scheduler learns lengths online from the requests that finished, per SLO targets (a class of traffic)
and prompt-length bucket, and plans with a range: given that a request has already produced n tokens
without ending, the `quantile` and the 1 - `quantile` of the lengths seen beyond n. The pessimistic end
of the range is taken each time (slo_slack.planned_remaining): the long end when tokens come slower
than the target, the short end when faster.

With too few observations (a new server, a new class) it plans with the cap, as before. A request
whose length the client fixed (min_tokens, ignore_eos) plans with what it fixed and teaches nothing.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..sequence import Sequence

def prompt_bucket(prompt_tokens: int) -> int:
    """Prompts within a factor of two of each other share a bucket."""
    return max(0, prompt_tokens).bit_length()


class LengthHistory:
    """The last `window` lengths of one kind of request, kept sorted for conditional quantiles."""

    def __init__(self, window: int) -> None:
        self.order: deque[int] = deque()
        self.sorted: list[int] = []
        self.window = window

    def add(self, length: int) -> None:
        self.order.append(length)
        bisect.insort(self.sorted, length)
        if len(self.order) > self.window:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def beyond(self, produced: int) -> list[int]:
        """The lengths longer than `produced` (a request that has produced that many and not ended)."""
        return self.sorted[bisect.bisect_right(self.sorted, produced):]


def quantile(sorted_values: list[int], q: float) -> int:
    """The nearest-rank q-quantile of an ascending, non-empty list."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


class OutputLengthPredictor:
    """Per kind of request (its targets and prompt bucket, falling back to its targets alone, then to
    all requests), the lengths of the last `window` that finished."""

    def __init__(self, quantile: float, window: int = 512, min_samples: int = 16, max_kinds: int = 1024) -> None:
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"output length quantile must be in [0.5, 1), got {quantile}")
        self.q, self.window, self.min_samples, self.max_kinds = quantile, window, min_samples, max_kinds
        # Clients choose their own targets, so the kinds are unbounded: the least recently taught go first.
        self.histories: OrderedDict[tuple, LengthHistory] = OrderedDict()

    @staticmethod
    def keys(seq: Sequence) -> list[tuple]:
        targets = (seq.slo.tpot_ms or math.inf, seq.slo.ttft_ms or math.inf)
        return [(*targets, prompt_bucket(len(seq.request.prompt_ids))), targets, ()]

    @staticmethod
    def fixed(seq: Sequence) -> bool:
        """Its client fixed its length: it ends at the cap, or not before min_tokens."""
        return seq.request.ignore_eos or seq.request.min_tokens >= seq.request.max_tokens

    def observe(self, seq: Sequence) -> None:
        """A request that finished (end of sequence, stop, or its cap) teaches its length."""
        if self.fixed(seq) or not seq.output:
            return
        for key in self.keys(seq):
            self.histories.setdefault(key, LengthHistory(self.window)).add(len(seq.output))
            self.histories.move_to_end(key)
        while len(self.histories) > self.max_kinds:
            self.histories.popitem(last=False)

    def total_range(self, seq: Sequence) -> tuple[int, int, int] | None:
        """Its whole output's length, short end, median and long end, given what it produced so far;
        None: too little seen, plan with the cap."""
        produced = len(seq.output)
        for key in self.keys(seq):
            history = self.histories.get(key)
            beyond = history.beyond(produced) if history else []
            if len(beyond) >= self.min_samples:
                return quantile(beyond, 1.0 - self.q), quantile(beyond, 0.5), quantile(beyond, self.q)
        return None

    def plan(self, seq: Sequence) -> None:
        """Set `seq.remaining_range`: its remaining tokens after the next one, short and long end,
        within its cap and not below min_tokens."""
        cap = seq.remaining
        floor = max(0, min(cap, seq.request.min_tokens - len(seq.output) - 1))
        total = None if self.fixed(seq) else self.total_range(seq)
        if total is None:
            seq.remaining_range = None
            return
        lo, mid, hi = (min(cap, max(floor, t - len(seq.output) - 1)) for t in total)
        seq.remaining_range = (lo, hi)
        if seq.predicted_length is None:  # the first prediction is the one its error is measured on
            seq.predicted_length = len(seq.output) + 1 + mid  # (EngineMetrics.length_error)
