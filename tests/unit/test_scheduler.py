"""The scheduler alone: no model, a fake clock, estimates either from a profiled cost model (pure
arithmetic) or a fake table. Request progress is set by hand, or by `update` with hand-built results."""

from __future__ import annotations

import math

import pytest

from adaserve_backend.config import SchedulerConfig, SpeculationConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.kv_cache import BlockManager
from adaserve_backend.request import FinishReason, Request
from adaserve_backend.scheduler.plan import IterationResult, Prefilled, Verified
from adaserve_backend.scheduler.policies import make_policy
from adaserve_backend.scheduler.prefill_estimator import Estimator
from adaserve_backend.scheduler.scheduler import NO_ROOM, Scheduler
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import SLO

SPEC = SpeculationConfig(budget=24, draft_budget=8, d_max=4, w_max=3)
START = 1000.0


class TableEstimator:
    """Predicted time per token by the number of decoding requests; everything else constant."""

    cost = "profiled"  # SLO-aware admission needs a cost model
    budget = 8
    ITERATION_S = 0.05
    ride_along = 1.0

    def __init__(self, tpot=None, prefill_token_s=0.0):
        self.tpot = tpot or {}
        self.prefill_token_s = prefill_token_s  # what each prompt token adds to an iteration

    def prefill_iteration_s(self, n, chunk):
        return self.ITERATION_S + chunk * self.prefill_token_s

    def first_token_s(self, n, tokens, chunk, behind=0):
        return math.ceil(tokens / chunk) * self.ITERATION_S + tokens * self.prefill_token_s

    def tpot_at(self, n):
        return self.tpot.get(n, 0.0)

    best_tpot_at = tpot_at

    def iteration_s(self, n, depth, width):
        return self.ITERATION_S

    def chunk_extra_ms(self, n, depth, chunk):
        return 0.0

    def record(self, stats):  # the table does not learn
        pass

    def record_prefill(self, n, depth, width, chunk, latency):
        pass

    def depth_width(self, n):
        return 0, 0

    next_depth_width = depth_width


def scheduler(estimator, policy="adaserve", num_blocks=1024, draft=False, **config) -> Scheduler:
    # the scheduler tests' numbers are written with a 1.15 admission headroom (80 ms -> 92 ms), so the
    # headroom is exercised; the served default is 1.0
    config.setdefault("admission_headroom", 1.15)
    sched = SchedulerConfig(policy=policy, prefill_chunk=256, **config)
    blocks = BlockManager(num_blocks, 4)
    draft_blocks = BlockManager(num_blocks, 4) if draft else None
    return Scheduler(sched, SPEC, make_policy(policy), estimator, blocks, draft_blocks)


_ids = iter(range(10**6))


def seq(slo_ms, prompt=8, max_tokens=100, arrival=0.0) -> Sequence:
    req = Request(f"r{next(_ids)}", [5] * prompt, max_tokens=max_tokens)
    return Sequence(req, next(_ids), SLO(tpot_ms=slo_ms), arrival, frozenset(), None, prompt)


def decoding(s: Sequence, decoded: int, elapsed_s: float, now: float = START) -> Sequence:
    """`s` prefilled, `elapsed_s` after its first token, `decoded` tokens since."""
    s.prefilled = s.prefill_goal
    s.output, s.first_token_time = [7] * (decoded + 1), now - elapsed_s
    return s


def running(sched: Scheduler, *seqs: Sequence) -> list[Sequence]:
    """Admit `seqs` through an unconstrained schedule (SLO admission lets everything in with zero
    predicted time per token)."""
    saved, est = getattr(sched.estimator, "tpot", None), sched.estimator
    if saved is not None:
        est.tpot = {}
    for s in seqs:  # one at a time: running in this order whatever the policy's waiting order
        sched.add(s)
        sched.schedule(0.0)
    if saved is not None:
        est.tpot = saved
    assert sched.running == list(seqs)
    return list(seqs)


def admitted(sched: Scheduler, waiting: list[Sequence]) -> list[float]:
    before = list(sched.running)
    for s in waiting:
        sched.add(s)
    sched.schedule(START)
    return [s.slo.tpot_s * 1e3 for s in sched.running if s not in before]


def test_slo_admission_starts_only_what_keeps_slos():
    """With 50 ms per token for one running request and 80 ms for two (92 ms with the headroom): a
    request starts only if it and every running request that can still make its SLO end within their
    SLOs; a looser one may go first."""
    table = {1: 0.05, 2: 0.08, 3: 0.1}

    def case(run, waiting):
        sched = scheduler(TableEstimator(table))
        for s, state in zip(running(sched, *[r for r, _ in run]), run):
            decoding(s, *state[1])
        got = admitted(sched, waiting)
        return got, [s.slo.tpot_s * 1e3 for s in sched.waiting]

    relaxed = lambda: [(seq(100), (10, 0.5))]  # noqa: E731  0.6 s ahead
    assert case(relaxed(), [seq(100)]) == ([100], [])
    assert case(relaxed(), [seq(60), seq(1000)]) == ([1000], [60])  # 60 < 92 ms: the looser goes first
    assert case(relaxed(), [seq(90)])[0] == []  # within the prediction, not the headroom
    assert case([(seq(60), (10, 0.6))], [seq(1000)])[0] == []  # on track at 50 ms per token, not at 92
    # behind even at the current load (80 ms with two running), but alone it catches up: it holds the door
    assert case([(seq(60), (10, 0.7)), (seq(1000), (10, 0.5))], [seq(1000)])[0] == []
    assert case([(seq(40), (10, 0.6))], [seq(1000)])[0] == [1000]  # cannot make 40 ms even alone
    # too far behind to catch up, yet it keeps its pace: admitted while the batch stays at its 100 ms
    # target (92 ms with two running), held back when that would slow it (115 ms with three)
    assert case([(seq(100), (10, 9.0))], [seq(1000)])[0] == [1000]
    assert case([(seq(100), (10, 9.0)), (seq(100), (10, 9.0))], [seq(1000)])[0] == []
    assert scheduler(TableEstimator(table), slo_admission=False).slo_admission is False
    assert scheduler(TableEstimator(table), policy="continuous").slo_admission is False


def test_a_tpot_margin_plans_each_request_under_its_target():
    """With 92 ms per token predicted for two running requests, a 100 ms request fits beside one
    that is on time; with a 10% margin the scheduler aims at 90 ms and holds it back."""
    table = {1: 0.05, 2: 0.092}
    for margin, expected in ((0.0, [100]), (0.1, [])):
        sched = scheduler(TableEstimator(table), admission_headroom=1.0, tpot_margin=margin)
        decoding(running(sched, seq(1000))[0], 10, 0.5)
        assert admitted(sched, [seq(100)]) == expected
        assert sched.running[0].planned_tpot_s == 1.0 * (1 - margin)
    for bad in (-0.1, 0.5, "0.1"):
        with pytest.raises(ValueError, match="tpot_margin"):
            SchedulerConfig(tpot_margin=bad)


def steep_estimator() -> Estimator:
    """A cost model where every prefill token beyond the knee costs 5 ms: pacing bites."""
    cost = CostModel(Roofline(10.0, 4, 5.0), Roofline(1.0, 4, 0.0), budget=8)
    return Estimator.for_policy(cost, cost.budget, make_policy("adaserve"), SPEC)


def test_slo_paced_prefill_follows_the_least_slack():
    """adaserve prefills along decode only what the decoding requests' slack pays for; requests
    behind schedule stop it unless they cannot make their SLO anyway."""
    est = steep_estimator()
    t_iter = est.iteration_s(1, *est.depth_width(1))

    def chunk(decoded, elapsed_s, max_tokens=100, **config):
        sched = scheduler(est, draft=True, **config)
        d, p = running(sched, seq(100, max_tokens=max_tokens), seq(100, prompt=300))
        decoding(d, decoded, elapsed_s)
        plan = sched.schedule(START)
        assert plan.decode == [d] and plan.depth > 0
        return plan.prefill.get(p, 0)

    assert chunk(50, 0.1) == 256  # 4.9 s ahead of schedule: a full chunk
    assert chunk(10, 1.2) == 0  # behind, but 89 tokens can still catch up
    assert chunk(10, 1.2, max_tokens=12) == 256  # behind with no way back
    # 52 ms ahead: the verification of 8 tokens sits at the knee, so 5 ms per prefill token
    assert chunk(10, 1.1 - t_iter - 0.052) == 10
    assert chunk(10, 1.2, slo_admission=False) == 256


def test_first_tokens_take_decoding_slack_only_as_far_as_decodes_still_make_their_targets():
    """A prompt due in 1.7 s needs large chunks; beside a decoding request 52 ms ahead of its target
    with no tokens left to win time back, the deadline overrides pacing unless spare_decodes; with
    many tokens left (decoding well under its target) the deadline gets its chunk either way."""
    est = steep_estimator()
    t_iter = est.iteration_s(1, *est.depth_width(1))

    def chunk(max_tokens, spare):
        sched = scheduler(est, draft=True, spare_decodes=spare)
        d = running(sched, seq(100, max_tokens=max_tokens))[0]
        decoding(d, 10, 1.1 - t_iter - 0.052)
        req = Request(f"r{next(_ids)}", [5] * 300, max_tokens=10)
        p = Sequence(req, next(_ids), SLO(tpot_ms=100, ttft_ms=1700), START, frozenset(), None, 300)
        sched.add(p)
        plan = sched.schedule(START)
        assert plan.decode == [d]
        return plan.prefill.get(p, 0)

    urgent = chunk(12, spare=False)
    assert urgent > 10
    assert chunk(12, spare=True) == 10  # what its 52 ms pay for, as pacing alone gives
    assert chunk(400, spare=True) == urgent



def test_eager_prefill_spends_what_the_decodes_win_back_on_first_tokens_not_yet_due():
    """A prompt due in 30 s needs no chunk now; pacing gives it what the decoding request's slack pays
    for, eager_prefill what the request's remaining tokens win back too (never past its target)."""
    est = steep_estimator()
    t_iter = est.iteration_s(1, *est.depth_width(1))

    def chunk(max_tokens, eager):
        sched = scheduler(est, draft=True, spare_decodes=True, eager_prefill=eager)
        d = running(sched, seq(100, max_tokens=max_tokens))[0]
        decoding(d, 10, 1.1 - t_iter - 0.052)
        req = Request(f"r{next(_ids)}", [5] * 300, max_tokens=10)
        p = Sequence(req, next(_ids), SLO(tpot_ms=100, ttft_ms=30_000), START, frozenset(), None, 300)
        sched.add(p)
        return sched.schedule(START).prefill.get(p, 0)

    assert chunk(400, eager=True) > chunk(400, eager=False) > 0
    assert chunk(12, eager=True) == chunk(12, eager=False)  # no tokens left to win time back: its slack only

def cached(sched: Scheduler, s: Sequence, n: int) -> None:
    """`s` decoding with `n` tokens in the target cache: its prompt and a first output token."""
    sched.target_blocks.append(s.seq_id, [-1] + list(range(n - 1)))
    sched.target_blocks.commit_all(s.seq_id)
    s.prefilled = s.prefill_goal = n
    decoding(s, 0, 0.0)


def test_preemption_frees_the_newest_or_loosest_and_a_lone_misfit_fails():
    for policy, victim in (("continuous", 1), ("sarathi", 1), ("priority", 0), ("adaserve", 0)):
        sched = scheduler(TableEstimator(), policy=policy, num_blocks=5)
        loose, tight = running(sched, seq(300, prompt=7), seq(50, prompt=7, arrival=1.0))  # the tight one arrived last
        for s in (loose, tight):
            cached(sched, s, 8)  # two full blocks each, one block free
        plan = sched.schedule(START)  # each decode token needs a block of its own
        survivor, evicted = ((loose, tight)[1 - victim], (loose, tight)[victim])
        assert sched.num_preemptions == 1 and plan.decode == [survivor], policy
        # all but the root
        assert list(sched.waiting) == [evicted] and evicted.prefilled == 0 and evicted.prefill_goal == 7
        assert not sched.target_blocks.has(evicted.seq_id)

    sched = scheduler(TableEstimator(), num_blocks=2)
    (lone,) = running(sched, seq(100, prompt=7))
    cached(sched, lone, 8)  # the cache is full: its next token cannot be verified
    plan = sched.schedule(START)
    assert plan.failed == [(lone, NO_ROOM)] and plan.empty and not sched.has_work()
    assert sched.target_blocks.num_free_blocks == 2


# ---- schedule() then update(): a request's whole life on a fake clock, results built by hand ---------

class Clock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def tick(self, s: float = 0.05) -> float:
        self.now += s
        return self.now


def lifecycle_scheduler(policy="continuous", num_blocks=1024, **config) -> tuple[Scheduler, list[Sequence]]:
    """No cost model (estimates come from measured iterations); `released` lists every request whose
    blocks the scheduler freed, in order (what the plans' `released` lists report)."""
    released: list[Sequence] = []

    class Recording(Scheduler):
        def _free(self, seq):
            super()._free(seq)
            assert not self.target_blocks.has(seq.seq_id)
            released.append(seq)

    est = Estimator(None, 8, lambda n: (0, 0))
    sched = Recording(SchedulerConfig(policy=policy, prefill_chunk=256, **config), SPEC, make_policy(policy), est,
                      BlockManager(num_blocks, 4), None)
    return sched, released


def start(sched: Scheduler, request_id: str, prompt: int, clock: Clock, **kw) -> Sequence:
    s = Sequence.start(Request(request_id, [5] * prompt, **kw), next(_ids),
                       SLO(tpot_ms=100.0), clock.now, frozenset({2}))
    sched.add(s)
    return s


def verified(seq: Sequence, tokens: list[int], drafts: int = 3) -> Verified:
    return Verified(seq, tokens, draft_tokens=drafts, accepted_drafts=len(tokens) - 1, draft_depth=drafts)  # a chain


def test_a_request_is_chunked_prefilled_decoded_and_finished_by_update():
    sched, released = lifecycle_scheduler()
    clock = Clock()
    s = start(sched, "a", prompt=600, clock=clock, max_tokens=5)
    chunks = []
    while not s.output:  # 600 prompt tokens in chunks of 256; only the last yields a token
        plan = sched.schedule(clock.now)
        assert plan.decode == [] and list(plan.prefill) == [s]
        n = plan.prefill[s]
        chunks.append(n)
        last = s.prefilled + n == s.prefill_goal
        outs = sched.update(plan, IterationResult(clock.tick(), prefilled=[Prefilled(s, n, 9 if last else None)]))
        sched.stamp_step(plan, 0.05)
        assert [o.new_token_ids for o in outs] == ([[9]] if last else [])
    assert chunks == [256, 256, 88] and s.first_token_time == clock.now and s.decoding
    # prefill-only steps are recorded apart from the decode iterations (a step fit needs both)
    assert not sched.iteration_stats and [(it.n, it.prefill_tokens, it.prefills, it.step)
                                          for it in sched.prefill_stats] == [
        (0, 256, 1, 0.05), (0, 256, 1, 0.05), (0, 88, 1, 0.05)]

    plan = sched.schedule(clock.now)
    assert plan.decode == [s] and not plan.prefill
    (out,) = sched.update(plan, IterationResult(clock.tick(), decoded=[verified(s, [10, 11, 12])], verification=0.04))
    assert out.new_token_ids == [10, 11, 12] and not out.finished and out.stats.accepted_drafts == 2
    assert sched.decode_iterations == 1 and sched.estimator.t_iter == 0.04 and sched.estimator.mean_accepted() == 3
    plan = sched.schedule(clock.now)
    (out,) = sched.update(plan, IterationResult(clock.tick(), decoded=[verified(s, [13, 14, 15])]))
    assert out.new_token_ids == [13] and out.finish_reason == FinishReason.LENGTH  # max_tokens = 5: the rest is cut
    assert out.num_output_tokens == 5 and out.stats.verifications == 2
    assert released == [s] and not sched.has_work()


def test_update_stops_at_eos_only_after_min_tokens_and_ends_failed_requests_alone():
    sched, released = lifecycle_scheduler()
    clock = Clock()
    early, failing, other = (start(sched, r, prompt=4, clock=clock, max_tokens=20, min_tokens=m) for r, m in
                             (("early", 3), ("failing", 0), ("other", 0)))
    plan = sched.schedule(clock.now)
    assert list(plan.prefill) == [early, failing, other]
    sched.update(plan, IterationResult(clock.tick(), prefilled=[Prefilled(x, 4, 7) for x in (early, failing, other)]))
    plan = sched.schedule(clock.now)
    result = IterationResult(clock.tick(), decoded=[verified(early, [2, 8]), verified(other, [8, 2, 9])],
                             failed=[(failing, "internal error: boom")])
    outs = {o.request_id: o for o in sched.update(plan, result)}
    assert outs["early"].new_token_ids == [2, 8] and not outs["early"].finished  # EOS within min_tokens
    assert outs["other"].new_token_ids == [8, 2] and outs["other"].finish_reason == FinishReason.STOP
    assert outs["failing"].finish_reason == FinishReason.ERROR and outs["failing"].error == "internal error: boom"
    assert released == [failing, other] and sched.running == [early]


def test_a_preempted_request_reprefills_without_emitting_again():
    sched, released = lifecycle_scheduler(num_blocks=6)
    clock = Clock()
    old = start(sched, "old", prompt=8, clock=clock)
    clock.tick()
    new = start(sched, "new", prompt=8, clock=clock)
    plan = sched.schedule(clock.now)
    # reserved for the chunks
    assert {k: len(t) for k, t in plan.block_tables.items()} == {old.seq_id: 2, new.seq_id: 2}
    # what the runner's prefill writes into them: two full blocks each; another request holds one more
    sched.target_blocks.reserve(-1, 4)
    for seq_id, n in ((old.seq_id, 8), (new.seq_id, 8), (-1, 4)):
        sched.target_blocks.append(seq_id, [-1] + list(range(n - 1)))
        sched.target_blocks.commit_all(seq_id)
    sched.update(plan, IterationResult(clock.tick(), prefilled=[Prefilled(old, 8, 7), Prefilled(new, 8, 7)]))
    plan = sched.schedule(clock.now)  # each decode token needs a block of its own: the newest goes
    assert plan.decode == [old] and released == [new] and sched.num_preemptions == 1
    assert new.prefill_goal == 8 and not new.decoding  # prompt and output, but the root
    sched.update(plan, IterationResult(clock.tick(), decoded=[verified(old, [8])]))
    plan = sched.schedule(clock.now)
    assert plan.prefill == {new: 8} and plan.decode == []  # continuous: prefill holds back decode
    assert sched.update(plan, IterationResult(clock.tick(), prefilled=[Prefilled(new, 8)])) == []
    assert new.decoding and new.output == [7]
    (out,) = [o for o in sched.update(sched.schedule(clock.now), IterationResult(
        clock.tick(), decoded=[verified(old, [9]), verified(new, [10])])) if o.request_id == "new"]
    assert out.new_token_ids == [10] and out.num_output_tokens == 2


def test_aborts_and_failures_answer_every_request_once():
    sched, released = lifecycle_scheduler(max_num_seqs=1)
    clock = Clock()
    running_one, queued = start(sched, "r", prompt=4, clock=clock), start(sched, "q", prompt=4, clock=clock)
    sched.schedule(clock.now)
    assert sched.running == [running_one] and list(sched.waiting) == [queued]
    assert sched.abort("never-seen", clock.now) == []
    (out,) = sched.abort("q", clock.now)
    assert out.request_id == "q" and out.finish_reason == FinishReason.ABORT and out.finished
    (out,) = sched.fail_all("shutting down", clock.now)
    assert out.request_id == "r" and out.finish_reason == FinishReason.ERROR and out.error == "shutting down"
    assert released == [queued, running_one] and not sched.has_work()


def test_a_request_the_cache_cannot_hold_gets_a_final_error_from_update():
    sched = scheduler(TableEstimator(), num_blocks=2)
    (lone,) = running(sched, seq(100, prompt=7))
    cached(sched, lone, 8)
    plan = sched.schedule(START)
    (out,) = sched.update(plan, IterationResult(START))
    assert out.finished and out.finish_reason == FinishReason.ERROR and out.error == NO_ROOM
    assert out.request_id == lone.request.request_id and not sched.has_work()
