"""Online estimates of decoding, learned from measured iterations (the Estimator,
prefill_estimator.py, adds what prefill chunks cost and first tokens on top):
the iteration time (the profiled cost model times a measured correction, or without a profile an EMA
of measured iterations), the yield at each load (tokens per request and tree tokens verified, by the
number of decoding requests), the draft's calibration (accepted drafts per unit of draft score), and
how deep verifications reach (how often one accepts at least k drafts). How deep each load then
speculates is speculation_size.py's decision, on these measurements.
"""

from __future__ import annotations

from collections.abc import Callable

from ..cost_model.cost_model import CostModel
from .plan import IterationStats
from .speculation_size import SPEC_MIN_SAMPLES, SpeculationSize

ITERATION_EMA = 0.3  # weight of the newest iteration in the time EMA and the cost correction
RIDE_ALONG_EMA = 0.05  # ... in the share prefill chunks add to decode iterations (a property of the load)
LOAD_EMA = 0.2  # weight of the newest iteration in the per-load yield table
CALIBRATION_DECAY = 0.98  # the draft score and hit sums forget over about 50 iterations
CALIBRATION_RANGE = (0.05, 2.0)


def ema(old: float, new: float, weight: float) -> float:
    return (1 - weight) * old + weight * new


class DecodeEstimator:
    def __init__(
        self, cost: CostModel | None, budget: int, depth_width: Callable[[int], tuple[int, int]], trims: bool = False
    ) -> None:
        self.cost = cost
        self.budget = budget
        # What this machine's iterations cost: kept by forget_yield.
        self.t_iter = 0.0  # EMA of measured decode iterations (s)
        self.cost_correction = 1.0  # EMA of measured / predicted
        # the same per kind of iteration (False: plain decode, True: speculative): a stale profile's
        # shape (what drafting and a larger tree add) is corrected too, not only its scale
        self.kind_correction: dict[bool, float] = {}
        self.depth_correction: dict[int, float] = {}  # measured / predicted per speculative depth
        self.per_depth = True  # price and explore depths apart (False: one speculative correction, as before)
        # how deep each load speculates, decided on these measurements (speculation_size.py)
        self.size = SpeculationSize(depth_width, trims, self)
        self.forget_yield()

    def forget_yield(self) -> None:
        """Back to the priors on what the traffic yields (drafts accepted, tokens per request at each
        load, which depths pay, when to explore), keeping what was learned about the iteration times.
        The engine's warm-up runs random tokens: right for the times, and for the yield a lesson that
        speculation never pays, which kept the first real requests decoding without it."""
        # measured decode iterations over their predicted time without the prefill chunks riding along:
        # what the arrivals' prefills add to every running request's time per token
        self.ride_along = 1.0
        # [k-1]: decayed verifications whose verified tree went k deep. Only those: when a request the
        # selection gave nothing that deep counted too, the measured acceptance fell with the load (B
        # spread thinner), until speculation looked unpaying at every load and a heavy burst left it
        # off for good (evidence: docs/scheduling.md#admission).
        self.tried: list[float] = []
        self.reached: list[float] = []  # [k-1]: ... of them that accepted at least k drafts
        self.by_load: dict[int, tuple[float, float]] = {}  # n -> (tokens per request, tree tokens verified)
        # the same for iterations that do not draft: one token each, unless the suffix index's copies
        # ride along (plan.copies), which under load is where most of its tokens come from
        self.plain_by_load: dict[int, tuple[float, float]] = {}
        self.scored = 0.0  # decaying sum of the draft scores verified (bonus tokens excluded)
        self.hits = 0.0  # decaying sum of the drafts accepted
        self.total_verifications = 0
        self.total_accepted = 0
        self.size.forget()

    # ---- learning ------------------------------------------------------------------------------
    @classmethod
    def for_policy(cls, cost: CostModel | None, budget: int, policy, spec):
        """The estimator an engine (or a simulated replica) running `policy` predicts with."""
        return cls(cost, budget, lambda n: policy.depth_width(n, budget, spec), policy.trims_speculation)

    def record(self, it: IterationStats) -> None:
        self.size.changed()
        self.t_iter = it.latency if self.t_iter == 0 else ema(self.t_iter, it.latency, ITERATION_EMA)
        spec = it.depth > 0
        if self.cost:
            predicted = self.cost.iteration_ms(it.n, it.depth, it.width, it.verified_tokens + it.prefill_tokens) / 1e3
            measured = it.latency / predicted
            self.cost_correction = ema(self.cost_correction, measured, ITERATION_EMA)
            old_kind = self.kind_correction.get(spec, measured)  # the first of a kind is taken as is
            self.kind_correction[spec] = ema(old_kind, measured, ITERATION_EMA)
            if spec:
                self.depth_correction[it.depth] = ema(self.depth_correction.get(it.depth,
                                                                                measured), measured, ITERATION_EMA)
            self.ride_along = ema(self.ride_along,
                                  max(1.0, it.latency / self.iteration_s(it.n, it.depth, it.width)), RIDE_ALONG_EMA)
        if spec:
            self.hits = CALIBRATION_DECAY * self.hits + it.accepted - it.n  # bonus tokens excluded
            self._record_depths(it)
        if it.n:
            table = self.by_load if spec else self.plain_by_load
            now = (it.accepted / it.n, float(it.verified_tokens))
            old = table.get(it.n, now)
            table[it.n] = (ema(old[0], now[0], LOAD_EMA), ema(old[1], now[1], LOAD_EMA))
        self.total_verifications += it.n
        self.total_accepted += it.accepted
        self.size.recorded(it)

    def _record_depths(self, it: IterationStats) -> None:
        while len(self.tried) < it.depth:
            self.tried.append(0.0)
            self.reached.append(0.0)
        for k in range(len(self.tried)):
            self.tried[k] *= CALIBRATION_DECAY
            self.reached[k] *= CALIBRATION_DECAY
        depths = it.draft_depths or (it.depth,) * it.n
        for k in range(it.depth):
            self.tried[k] += sum(d > k for d in depths)
            self.reached[k] += sum(a > k for a in it.accepted_drafts)

    def record_selection(self, expected_drafts: float) -> None:
        """The expected accepted drafts (by uncalibrated draft scores) of the trees just selected."""
        self.scored = CALIBRATION_DECAY * self.scored + expected_drafts

    def reset_totals(self) -> None:
        self.size.changed()
        self.total_verifications = self.total_accepted = 0

    # ---- predictions ---------------------------------------------------------------------------
    def mean_accepted(self) -> float:
        """Mean tokens produced per verification (bonus included) since the last reset."""
        return self.total_accepted / max(self.total_verifications, 1)

    def calibration(self) -> float:
        """Accepted draft tokens per unit of draft score verified: what turns the draft's path
        probabilities into acceptance probabilities (drafts are rarely calibrated). 1 until measured."""
        if self.scored < 1.0:
            return 1.0
        lo, hi = CALIBRATION_RANGE
        return min(max(self.hits / self.scored, lo), hi)

    def at_load(self, n: int, depth: int) -> tuple[float, float]:
        """Tokens per request per iteration and tree tokens verified with `n` decoding requests: as
        measured at that load, else at the nearest measured load with as many tokens per request (the
        fewer requests, the more each gets, so extrapolating the yield upwards would be optimistic and
        admit too many), else all of B at the lifetime yield. Without drafting: as measured the same
        way (the suffix index's copies), else one token each. The admission's time per token and the
        prefill pacing's slack both divide by this: a yield the copies raise but the table ignored made
        both pessimistic, holding back admissions and prefill chunks the copies had paid for."""
        table = self.by_load if depth else self.plain_by_load
        if n in table:
            return table[n]
        if not table:
            return (max(self.mean_accepted(), 1.0), float(max(self.budget, n))) if depth else (1.0, float(n))
        m = min(table, key=lambda k: (abs(k - n), k))
        accepted, verified = table[m]
        return accepted, verified * n / m

    def correction(self, speculative: bool) -> float:
        """Measured over predicted time of this kind of iteration. A prefill chunk's share is the
        target's work, so it takes the plain kind's: with the mixed EMA, each rare speculative
        iteration (the draft catching up, a larger tree) made every chunk look slower for a while, so
        chunks shrank and waiting requests were turned away that a run without speculation served
        (evidence: docs/architecture.md#the-model-runtime)."""
        return self.kind_correction.get(speculative, self.cost_correction)

    def verify_tokens(self, n: int, depth: int) -> int:
        return round(self.at_load(n, depth)[1])

    def iteration_s(self, n: int, depth: int, width: int) -> float:
        """t_spec: the cost model's prediction, corrected by measurements; without a profile, the EMA of
        measured decode iterations."""
        if not self.cost:
            return self.t_iter
        correction = self.correction(depth > 0)
        if depth and self.per_depth:
            correction = self.depth_correction.get(depth, correction)
        tokens = self.verify_tokens(n, depth)
        if depth:
            tokens = min(tokens, n * (1 + depth * width))  # no tree outgrows its beams
        return self.cost.iteration_ms(n, depth, width, tokens) / 1e3 * correction

    # ---- how deep speculation reaches -------------------------------------------------------------
    def reach(self, depth: int) -> list[float]:
        """P(a verification accepts at least k drafts) for k = 1..depth, as measured; a depth measured
        too rarely continues the last measured ratio (acceptance along a path only falls)."""
        probs, prev, prev2 = [], 1.0, 1.0
        for k in range(depth):
            if k < len(self.tried) and self.tried[k] >= SPEC_MIN_SAMPLES:
                p = self.reached[k] / self.tried[k]
            else:
                p = prev * prev / prev2 if prev2 > 0 else 0.0
            p = min(p, prev)
            probs.append(p)
            prev2, prev = prev, p
        return probs

    def plain_rate(self, n: int) -> float:
        """Tokens per second each of `n` requests gets without drafting (copies included, at_load)."""
        return self.at_load(n, 0)[0] / self.iteration_s(n, 0, 0)

    def depth_width(self, n: int) -> tuple[int, int]:
        """The (depth, width) `n` decoding requests speculate with (speculation_size.py)."""
        return self.size.depth_width(n)

    def next_depth_width(self, n: int) -> tuple[int, int]:
        """The (depth, width) of the iteration about to be planned, explorations included."""
        return self.size.next_depth_width(n)

    def policy_depth_width(self, n: int) -> tuple[int, int]:
        return self.size.policy_depth_width(n)

    def tpot_at(self, n: int) -> float:
        """Predicted time per token of each of `n` decoding requests: an iteration over the tokens it
        yields per request, as measured at that load."""
        depth, width = self.depth_width(n)
        return self.iteration_s(n, depth, width) / self.at_load(n, depth)[0]

    def best_tpot_at(self, n: int) -> float:
        """The time per token `n` requests get at the least, for admission's "can this target be met at
        all": `tpot_at` or, if faster, plain decoding's (always there to fall back to). Under sustained
        load a lone request's speculative yield came from a stale few-request entry (a burst's first
        iterations, trees cut to their roots), which priced it over the tightest class's target: all of
        that class then looked hopeless, was let in without holding the batch and missed
        (docs/scheduling.md#admission)."""
        return min(self.tpot_at(n), 1 / self.plain_rate(n))
