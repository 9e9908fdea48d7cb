"""How much each iteration speculates, decided in one place:

- **B**, the tokens one iteration verifies (`speculation_budget`): the profile's knee, where a
  verification forward stops costing about one decode, else the configured budget.
- **Depth and width** for n decoding requests (`adaptive_depth_width`, the paper's formula), then
  **trimmed** to the deepest depth whose expected tokens per second beats every other and plain
  decoding, and **explored** now and then so that what pays keeps being measured (`SpeculationSize`,
  on the estimator's measurements).
- **A(r)**, what each request must accept this iteration to stay on its TPOT target
  (`acceptance_caps`), the SLO-customized selection's floor.

The selection (speculation/selection.py) spends B given A(r) and stays pure; the scheduler asks
`SpeculationSize.next_depth_width` for the iteration it plans.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .slo_slack import on_track

if TYPE_CHECKING:
    from ..config import SpeculationConfig
    from ..cost_model.cost_model import CostModel
    from ..sequence import Sequence as Seq
    from .plan import IterationStats

# Speculation that does not pay is trimmed (policies with trims_speculation): a depth is trusted once
# this many (decayed) verifications went that deep; while no depth pays, one decode iteration in
# EXPLORE_EVERY speculates at the policy's depth anyway, so the acceptance keeps being measured (text
# changes, and so does what pays at another load); speculating must beat plain decoding by SPEC_MARGIN.
SPEC_MIN_SAMPLES = 8.0
EXPLORE_EVERY = 16
SPEC_MARGIN = 1.03
# An exploration is not free: the draft first reads every token it skipped while speculation was off
# (every request's tokens since the last one), and at high load the selection then often verifies no
# draft at all, so under sustained load explorations cost drafting and buy nothing (evidence:
# docs/architecture.md#the-model-runtime). So each exploration that did not pay by itself, after which
# speculation still does not pay, doubles the interval (up to EXPLORE_MAX); it restarts at
# EXPLORE_EVERY when one pays, or once the load falls below EXPLORE_RELOAD of the load where the last
# one failed (fewer requests: larger trees each).
EXPLORE_MAX = 512
EXPLORE_RELOAD = 0.75
# The mirror image: while speculating, one decode iteration in PLAIN_EXPLORE_EVERY runs plain, so the
# plain kind's cost correction is measured (a profile taken before the runtime got faster, or on a
# busier machine, would otherwise keep speculation on where plain decoding is faster).
PLAIN_EXPLORE_EVERY = 64
# Likewise between depths: each depth's own measured/predicted time. A profile taken on another machine
# gets the shape wrong, not only the scale (a CPU without AMX pays more for a deeper tree's extra rows
# than an AMX profile says; evidence: docs/speculation.md#speculating-only-as-deep-as-it-pays-the-estimator),
# and one correction for every speculative depth keeps the deeper one; so one speculative iteration in
# DEPTH_EXPLORE_EVERY runs a neighbouring depth (shallower, then deeper, in turn).
DEPTH_EXPLORE_EVERY = 32
# What a tree's root counts toward a request's expected accepted tokens (it yields the bonus token).
ROOT_CREDIT = 1.0


def speculation_budget(cost: CostModel | None, spec: SpeculationConfig) -> int:
    """B: the measured profile's knee, else `speculation.budget`."""
    return cost.budget if cost else spec.budget


def clip(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def adaptive_depth_width(n: int, budget: int, cfg: SpeculationConfig) -> tuple[int, int]:
    """d = clip(floor(B1/(n+c1)) - 1, D_min, D_max), w = clip(floor(B2/n) + c2, 1, W_max)."""
    n = max(n, 1)
    d = clip(budget // (n + cfg.c1) - 1, cfg.d_min, cfg.d_max)
    w = clip(cfg.draft_budget // n + cfg.c2, 1, cfg.w_max)
    return d, w


def required_accepted(elapsed_s: float, t_spec_s: float, tpot_slo_s: float, decoded: int) -> float:
    """A(r) = (l + t_spec) / t_TPOT - o: tokens this iteration must accept for the request to be on its
    SLO afterwards (l: time since its first decode step, o: tokens decoded since then)."""
    return (elapsed_s + t_spec_s) / tpot_slo_s - decoded


def acceptance_caps(decode: Sequence[Seq], heights: Sequence[int], start: float, t_spec_s: float,
                    best_tpot_s: float) -> list[float]:
    """Each decoding request's A(r), at most its candidate tree's height plus the root. A request that
    cannot end within its SLO even at a lone request's pace gets no forced nodes: they would not save
    it, and they cost every other request time (the throughput phase still gives it whatever pays)."""
    return [min(required_accepted(start - s.first_token_time, t_spec_s, s.planned_tpot_s, len(s.output) - 1), h + 1)
            if on_track(s, start, best_tpot_s) else ROOT_CREDIT for s, h in zip(decode, heights)]


class Measured(Protocol):
    """What the estimator measures and SpeculationSize decides with."""

    cost: CostModel | None
    per_depth: bool
    tried: list[float]

    def reach(self, depth: int) -> list[float]: ...

    def plain_rate(self, n: int) -> float: ...

    def iteration_s(self, n: int, depth: int, width: int) -> float: ...


class SpeculationSize:
    """The depth and width each load speculates with: the policy's, trimmed to what pays on the
    measurements, and the explorations that keep measuring the rest."""

    def __init__(self, policy_depth_width: Callable[[int], tuple[int, int]], trims: bool, measured: Measured) -> None:
        self.policy_depth_width = policy_depth_width  # the policy's (depth, width) for a number of decoding requests
        self.trims = trims and measured.cost is not None  # comparing depths needs a cost model
        self.measured = measured
        self.forget()

    def forget(self) -> None:
        """Back to the priors on when to explore (with the estimator's forget_yield)."""
        self.since_speculation = 0  # decode iterations since the last speculative one
        self.explore_every = EXPLORE_EVERY  # see EXPLORE_MAX
        self.exploring = False  # an exploration was planned and is not recorded yet
        self.failed_at = 0  # the load where the last exploration found speculation still not paying
        self.since_plain = 0  # ... since the last plain one
        self.since_depth_explore = 0  # speculative iterations since a neighbouring depth was explored
        self.explore_deeper = False  # which neighbour the next depth exploration runs
        # depth_width(n) until the next measurement changes what it depends on: admission and first-token
        # deadlines ask it dozens of times a step, a large share of the scheduling time (evidence:
        # docs/speculation.md#speculating-only-as-deep-as-it-pays-the-estimator)
        self._depth_width: dict[int, tuple[int, int]] = {}

    def changed(self) -> None:
        """The measurements moved: every load's depth is decided again."""
        self._depth_width.clear()

    def recorded(self, it: IterationStats) -> None:
        """After the estimator learned from `it`: the exploration counters."""
        spec = it.depth > 0
        self.since_speculation = 0 if spec else self.since_speculation + 1
        self.since_plain = self.since_plain + 1 if spec else 0
        self.since_depth_explore += spec
        if spec and self.exploring:
            self._explored(it)

    def _explored(self, it: IterationStats) -> None:
        """An exploration that paid by itself (more tokens per second than plain decoding's) keeps them
        coming; one that did not, while speculation still does not pay, makes the next one wait longer."""
        self.exploring = False
        m = self.measured
        paid = m.cost is not None and it.accepted / it.latency > it.n * m.plain_rate(it.n)
        if paid or self.depth_width(it.n)[0]:
            self.explore_every, self.failed_at = EXPLORE_EVERY, 0
        else:
            self.explore_every, self.failed_at = min(2 * self.explore_every, EXPLORE_MAX), it.n

    def paying_depth(self, n: int, depth: int, width: int) -> int:
        """The depth up to the policy's `depth` whose expected tokens per second beats every other,
        0 (no speculation) unless some depth beats plain decoding by SPEC_MARGIN. Unmeasured: `depth`."""
        m = self.measured
        if not self.trims or depth == 0 or not m.tried or m.tried[0] < SPEC_MIN_SAMPLES:
            return depth
        plain = m.plain_rate(n)
        tokens, best, best_rate = 1.0, 0, 0.0
        for k, p in enumerate(m.reach(depth), start=1):
            tokens += p
            rate = tokens / m.iteration_s(n, k, width)
            if rate > best_rate:
                best, best_rate = k, rate
        return best if best_rate > plain * SPEC_MARGIN else 0

    def depth_width(self, n: int) -> tuple[int, int]:
        """The (depth, width) `n` decoding requests speculate with: the policy's, trimmed to what pays."""
        if n not in self._depth_width:
            depth, width = self.policy_depth_width(n)
            depth = self.paying_depth(n, depth, width)
            self._depth_width[n] = (depth, width) if depth else (0, 0)
        return self._depth_width[n]

    def next_depth_width(self, n: int) -> tuple[int, int]:
        """`depth_width` for the iteration about to be planned: while speculation is trimmed to none,
        one iteration in `explore_every` (EXPLORE_EVERY, more after explorations that found nothing)
        speculates at the policy's depth to measure it again; while speculating, every
        PLAIN_EXPLORE_EVERY-th runs plain to measure that, and every DEPTH_EXPLORE_EVERY-th speculative
        one a neighbouring depth."""
        depth, width = self.depth_width(n)
        if n < EXPLORE_RELOAD * self.failed_at:
            self.explore_every, self.failed_at = EXPLORE_EVERY, 0
        if self.trims and depth == 0 and self.since_speculation >= self.explore_every - 1:
            self.exploring = True
            return self.policy_depth_width(n)
        if self.trims and depth > 0 and self.since_plain >= PLAIN_EXPLORE_EVERY - 1:
            return 0, 0
        per_depth = self.measured.per_depth
        if self.trims and per_depth and depth > 0 and self.since_depth_explore >= DEPTH_EXPLORE_EVERY - 1:
            self.since_depth_explore, self.explore_deeper = 0, not self.explore_deeper
            deeper = depth + 1 if depth < self.policy_depth_width(n)[0] else None
            shallower = depth - 1 if depth > 1 else None
            neighbour = (deeper or shallower) if self.explore_deeper else (shallower or deeper)
            if neighbour:
                return neighbour, width
        return depth, width
