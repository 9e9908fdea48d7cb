"""The estimator trims speculation that does not pay: hand-built iteration records, a hand-made cost
model, no model and no clock."""

from __future__ import annotations

from adaserve_backend.config import SpeculationConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.scheduler.plan import IterationStats
from adaserve_backend.scheduler.policies import make_policy
from adaserve_backend.scheduler.prefill_estimator import Estimator
from adaserve_backend.scheduler.speculation_size import (
    DEPTH_EXPLORE_EVERY,
    EXPLORE_EVERY,
    PLAIN_EXPLORE_EVERY,
    SPEC_MIN_SAMPLES,
)

SPEC = SpeculationConfig(budget=16)
# A CPU-like profile: a verification of t tokens costs 30 ms + 1 ms per token, a draft step 4 ms.
COST = CostModel(Roofline(30.0, 1, 1.0), Roofline(4.0, 64, 0.0), budget=16)


def estimator(policy: str = "adaserve") -> Estimator:
    return Estimator.for_policy(COST, COST.budget, make_policy(policy), SPEC)


def spec_iteration(est: Estimator, n: int, depth: int, width: int, accepted_drafts: list[int],
                   draft_depths: tuple[int, ...] = (), verified: int | None = None) -> IterationStats:
    """A speculative iteration that took exactly what the cost model predicts (correction stays 1);
    `draft_depths`: how deep the selection let each request's tree go (default: the whole depth)."""
    verified = verified or n * (1 + depth * width)
    latency = COST.iteration_ms(n, depth, width, verified) / 1e3
    return IterationStats(n=n, depth=depth, width=width, verified_tokens=verified, prefill_tokens=0,
                          accepted=n + sum(accepted_drafts), latency=latency, speculation=0.0, selection=0.0,
                          verification=latency, accepted_drafts=tuple(accepted_drafts), draft_depths=draft_depths)


def plain_iteration(n: int, verified: int | None = None, accepted: int | None = None) -> IterationStats:
    """An iteration that does not draft: one token each, unless copies ride along (`verified` tree
    tokens, `accepted` tokens produced)."""
    verified, accepted = verified or n, accepted or n
    latency = COST.iteration_ms(n, 0, 0, verified) / 1e3
    return IterationStats(n=n, depth=0, width=0, verified_tokens=verified, prefill_tokens=0, accepted=accepted,
                          latency=latency, speculation=0.0, selection=0.0, verification=latency)


def feed(est: Estimator, accepted_per_request: int, iterations: int = 20) -> tuple[int, int]:
    depth, width = est.policy_depth_width(1)
    for _ in range(iterations):
        est.record(spec_iteration(est, 1, depth, width, [min(accepted_per_request, depth)]))
    return depth, width


def test_unmeasured_speculation_runs_at_the_policy_depth():
    est = estimator()
    assert est.depth_width(1) == est.policy_depth_width(1)
    assert est.policy_depth_width(1)[0] > 1


def test_a_draft_that_is_never_accepted_is_trimmed_to_plain_decoding():
    est = estimator()
    feed(est, accepted_per_request=0)
    assert est.depth_width(1) == (0, 0)
    assert est.tpot_at(1) * 1e3 == COST.verify_ms(1)  # a lone request then decodes at a plain step's pace


def test_forgetting_the_yield_restores_speculation_and_keeps_the_measured_times():
    """What the engine's warm-up does after its random-token requests, which no draft predicts."""
    est = estimator()
    feed(est, accepted_per_request=0)
    slow = IterationStats(n=1, depth=0, width=0, verified_tokens=1, prefill_tokens=0, accepted=1,
                          latency=2 * COST.verify_ms(1) / 1e3, speculation=0.0, selection=0.0, verification=0.0)
    est.record(slow)
    times = (est.t_iter, dict(est.kind_correction), dict(est.depth_correction))
    est.forget_yield()
    assert est.depth_width(1) == est.policy_depth_width(1)  # speculating again, as unmeasured
    assert not est.tried and not est.by_load and not est.plain_by_load and est.calibration() == 1.0
    assert (est.t_iter, est.kind_correction, est.depth_correction) == times and est.kind_correction[False] > 1


def test_a_draft_that_is_always_accepted_keeps_its_full_depth():
    est = estimator()
    depth, width = feed(est, accepted_per_request=99)
    assert est.depth_width(1) == (depth, width)


def test_a_draft_accepted_one_step_deep_speculates_one_step():
    """Accepting exactly one draft per verification: depth 1 yields 2 tokens for one draft step and a
    small tree; going deeper adds steps and tree tokens that are never accepted."""
    est = estimator()
    feed(est, accepted_per_request=1)
    assert est.depth_width(1)[0] == 1
    assert est.reach(3) == [1.0, 0.0, 0.0]


def explore(est, n, iterations, accepted):
    """Plan and record `iterations` decode iterations of `n` requests; the planned depths."""
    planned = []
    for _ in range(iterations):
        depth, width = est.next_depth_width(n)
        planned.append(depth)
        est.record(spec_iteration(est, n, depth, width, [accepted(depth)] * n) if depth else plain_iteration(n))
    return planned


def test_while_trimmed_explorations_that_find_nothing_come_ever_more_rarely():
    est = estimator()
    feed(est, accepted_per_request=0)
    planned = explore(est, 1, 7 * EXPLORE_EVERY, lambda depth: 0)
    assert [i for i, d in enumerate(planned) if d] == [EXPLORE_EVERY - 1, 3 * EXPLORE_EVERY - 1, 7 * EXPLORE_EVERY - 1]
    assert est.size.explore_every == 8 * EXPLORE_EVERY


def test_the_exploration_interval_restarts_when_the_load_falls():
    est = estimator()
    feed(est, accepted_per_request=0)
    explore(est, 8, 7 * EXPLORE_EVERY, lambda depth: 0)
    assert est.size.explore_every > EXPLORE_EVERY
    planned = explore(est, 4, EXPLORE_EVERY, lambda depth: 0)
    assert planned[-1] > 0 and planned.count(0) == EXPLORE_EVERY - 1


def test_exploring_a_draft_that_now_pays_brings_speculation_back():
    est = estimator()
    feed(est, accepted_per_request=0)
    for _ in range(10 * EXPLORE_EVERY):
        depth, width = est.next_depth_width(1)
        est.record(spec_iteration(est, 1, depth, width, [depth]) if depth else plain_iteration(1))
    assert est.depth_width(1)[0] > 0


def test_while_speculating_plain_decoding_is_measured_and_a_stale_profile_corrected():
    """The profile says a plain step costs 31 ms, but the runtime now takes 12 (speculative iterations
    still cost what the profile says): a draft whose every draft is accepted (5 tokens per 63 ms
    verification) looks worth it until a plain iteration is measured, then speculation stops."""
    est = estimator()
    depth, width = feed(est, accepted_per_request=99)
    assert est.depth_width(1) == (depth, width)
    planned = []
    for _ in range(PLAIN_EXPLORE_EVERY):
        depth, width = est.next_depth_width(1)
        planned.append(depth)
        if depth:
            est.record(spec_iteration(est, 1, depth, width, [depth]))
        else:
            fast = plain_iteration(1)
            est.record(IterationStats(**{**fast.__dict__, "latency": 0.012, "verification": 0.012}))
            break
    assert planned[-1] == 0 and planned.count(0) == 1  # counted from the feed's 20 speculative iterations
    assert est.depth_width(1) == (0, 0)


def serve(est: Estimator, iterations: int, slowdown) -> list[int]:
    """One request decoding: every draft accepted at depth 1, every other one at depth 2, none deeper;
    a depth-d iteration takes slowdown(d) times what the profile says. The planned depths."""
    planned = []
    for i in range(iterations):
        depth, width = est.next_depth_width(1)
        planned.append(depth)
        if not depth:
            est.record(plain_iteration(1))
            continue
        it = spec_iteration(est, 1, depth, width, [min(depth, 1 + i % 2)])
        slow = slowdown(depth)
        est.record(IterationStats(**{**it.__dict__, "latency": it.latency * slow,
                                     "verification": it.verification * slow}))
    return planned


def test_each_depth_is_priced_by_what_it_measured():
    """The profile's shape says depth 2 pays best (2.5 tokens for two draft steps); on this machine each
    level beyond the first adds 30% to what the profile says an iteration takes. One correction for every
    depth would keep depth 2; exploring depth 1 now and then measures it, and the estimator moves there."""
    as_profiled = estimator()
    planned = serve(as_profiled, 4 * DEPTH_EXPLORE_EVERY, lambda depth: 1.0)
    assert as_profiled.depth_width(1)[0] == 2 and planned[-DEPTH_EXPLORE_EVERY:].count(1) <= 1  # an exploration
    est = estimator()
    planned = serve(est, 4 * DEPTH_EXPLORE_EVERY, lambda depth: 1 + 0.3 * (depth - 1))
    assert 2 in planned and est.depth_width(1)[0] == 1
    assert est.depth_correction[2] > 1.25 and abs(est.depth_correction[1] - 1) < 0.05
    assert planned[-DEPTH_EXPLORE_EVERY:].count(1) >= DEPTH_EXPLORE_EVERY - 2  # then only explorations in between


def test_rarely_measured_depths_continue_the_measured_ratio():
    est = estimator()
    est.record(spec_iteration(est, int(SPEC_MIN_SAMPLES) * 2, 2, 1, [2, 1] * int(SPEC_MIN_SAMPLES)))
    p1, p2, p3 = est.reach(3)
    assert (p1, p2) == (1.0, 0.5)
    assert p3 == 0.25


def test_only_trimming_policies_are_trimmed():
    est = estimator("spec:4")
    for _ in range(20):
        est.record(spec_iteration(est, 1, 4, 1, [0]))
    assert est.depth_width(1) == (4, 1)


def test_copies_on_iterations_that_do_not_draft_count_in_the_yield_at_that_load():
    est = estimator()
    feed(est, accepted_per_request=0)  # the draft does not pay: plain decoding
    assert est.at_load(4, 0) == (1.0, 4.0)
    for _ in range(40):  # the suffix index's copies: 3 tokens each from 4 trees of 9 nodes
        est.record(plain_iteration(4, verified=36, accepted=12))
    accepted, verified = est.at_load(4, 0)
    assert abs(accepted - 3.0) < 1e-3 and abs(verified - 36.0) < 1e-2
    assert abs(est.at_load(8, 0)[1] - 72.0) < 0.1  # the nearest load measured, scaled to its requests
    assert est.depth_width(4) == (0, 0)
    assert abs(est.tpot_at(4) * 1e3 - COST.iteration_ms(4, 0, 0, 36) / 3) < 1e-2  # a copy's tree priced in
    est.record(plain_iteration(2))
    assert est.at_load(2, 0) == (1.0, 2.0)  # without copies: one token each, as before


def test_requests_the_selection_kept_shallow_do_not_count_against_the_drafts_acceptance():
    """Under load B is spread thin and most trees are cut to their roots: that says nothing about how
    often the draft is right, so the acceptance at each depth counts only the trees that reached it."""
    est, n = estimator(), 2
    depth, width = est.policy_depth_width(n)
    assert depth > 1
    for _ in range(20):  # one request verified its whole beam and accepted it all, the other only its root
        est.record(spec_iteration(est, n, depth, width, [depth, 0], draft_depths=(depth, 0),
                                  verified=1 + depth * width + 1))
    assert est.reach(depth) == [1.0] * depth
    assert est.depth_width(n)[0] == depth


def test_a_lone_requests_pace_is_never_put_above_plain_decodings():
    """A few-request load last measured when its trees verified no drafts (a burst's first, prefill-heavy
    iterations) would price a lone request's speculation at one token per iteration; plain decoding is
    always there, so that is the slowest a lone request decodes."""
    est = estimator()
    depth, width = est.policy_depth_width(2)
    for _ in range(3):  # two requests, trees cut to their roots: one token each
        est.record(spec_iteration(est, 2, depth, width, [0, 0], draft_depths=(0, 0), verified=2))
    plain = COST.verify_ms(1) / 1e3
    assert est.depth_width(1)[0] > 0 and est.tpot_at(1) > plain  # the stale yield, as the scheduler saw it
    assert est.best_tpot_at(1) == plain
    assert est.best_tpot_at(2) <= est.tpot_at(2)
