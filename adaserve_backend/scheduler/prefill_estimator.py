"""The estimator the scheduler and the selection predict with: decoding as DecodeEstimator learns it
(decode_estimator.py: iteration times, the yield at each load, the draft's calibration, how deep
speculation pays), and on top what prefill chunks cost and so when a request's first token comes,
learned from the iterations that carried them.
"""

from __future__ import annotations

from collections.abc import Callable

from ..cost_model.cost_model import CostModel
from .decode_estimator import ITERATION_EMA, DecodeEstimator, ema

PREFILL_CORRECTION_RANGE = (0.2, 5.0)  # one odd measurement (a stall, a page fault storm) moves it at most this far


class Estimator(DecodeEstimator):
    def __init__(
        self, cost: CostModel | None, budget: int, depth_width: Callable[[int], tuple[int, int]], trims: bool = False
    ) -> None:
        super().__init__(cost, budget, depth_width, trims)
        # measured / priced prefill chunks (record_prefill), alone (False) and riding along decodes (True);
        # what this machine's chunks cost, so forget_yield keeps it
        self.prefill_correction: dict[bool, float] = {}

    def record_prefill(self, n: int, depth: int, width: int, chunk: int, latency: float) -> None:
        """An iteration that carried `chunk` prefill tokens beside `n` decoding requests: what the chunk
        took over what the cost model prices it at. Calibration times verification trees (many short
        sequences over cached context), which overprice one prompt's chunk, and the decode iterations'
        correction the chunks borrowed measures per-step overheads a chunk does not multiply
        (docs/scheduling.md#the-estimator-decode_estimatorpy-prefill_estimatorpy). Kept apart for chunks
        alone and beside decodes: beside them the residual also carries what the decode part's price
        missed. An iteration whose decoding requests cost more than its chunk says little about the
        chunk and is skipped."""
        if not self.cost or chunk <= 0:
            return
        raw = self._chunk_ms(n, depth, chunk) / 1e3
        decode = self.iteration_s(n, depth, width) if n else 0.0
        if raw <= 0 or decode > raw:
            return
        measured = min(max((latency - decode) / raw, PREFILL_CORRECTION_RANGE[0]), PREFILL_CORRECTION_RANGE[1])
        old = self.prefill_correction.get(n > 0)
        self.prefill_correction[n > 0] = measured if old is None else ema(old, measured, ITERATION_EMA)

    def _chunk_ms(self, n: int, depth: int, chunk: int) -> float:
        """A prefill chunk as the cost model prices it: what it adds beside `n` decoding requests, or
        with none decoding the chunk's own forward, the draft reading it too."""
        if n == 0:
            return self.cost.verify_ms(chunk) + self.cost.draft_step_ms(chunk)
        return self.cost.chunk_extra_ms(n, self.verify_tokens(n, depth), chunk)

    def chunk_correction(self, n: int) -> float:
        """Measured over priced prefill chunks beside `n` decoding requests (alone or riding along),
        else the other kind's; until a chunk is measured, the plain decode kind's."""
        own, other = self.prefill_correction.get(n > 0), self.prefill_correction.get(n == 0)
        return own if own is not None else other if other is not None else self.correction(False)

    def chunk_extra_ms(self, n: int, depth: int, chunk: int) -> float:
        """What a prefill chunk adds to an iteration of `n` decoding requests (needs a cost model)."""
        return self._chunk_ms(n, depth, chunk) * self.chunk_correction(n)

    def prefill_iteration_s(self, n: int, chunk: int) -> float:
        """One iteration carrying a `chunk`-token prefill chunk beside `n` decoding requests (needs a cost
        model); with none decoding it is the chunk's own forward, the draft reading it too."""
        if n == 0:
            return self._chunk_ms(0, 0, chunk) / 1e3 * self.chunk_correction(0)
        depth, width = self.depth_width(n)
        return self.iteration_s(n, depth, width) + self.chunk_extra_ms(n, depth, chunk) / 1e3

    def first_token_s(self, n: int, tokens: int, chunk: int, behind: int = 0) -> float:
        """From now to the first token of a request whose prompt ends `tokens` prefill tokens from now
        (its own and those prefilled before it), at up to `chunk` tokens per iteration beside `n`
        decoding requests: the iterations that carry them, the last one partly full, or fuller by the
        `behind` tokens of prompts after it that share it (its first token comes when it ends)."""
        full, rest = divmod(max(tokens, 1), chunk)
        last = self.prefill_iteration_s(n, min(chunk, rest + behind)) if rest else 0.0
        return full * self.prefill_iteration_s(n, chunk) + last
