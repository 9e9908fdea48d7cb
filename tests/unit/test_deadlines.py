"""First-token deadlines in the scheduler, no model, on a fake clock: EDF admission, the overload answer
(reject at arrival, reject while waiting, best_effort keeps it), no starvation under steady load, and
never a rejection after a request has streamed. Results are built by hand as in test_scheduler.py."""

from __future__ import annotations

import math

from adaserve_backend.config import SchedulerConfig
from adaserve_backend.kv_cache import BlockManager
from adaserve_backend.request import FinishReason, Request, RequestOutput
from adaserve_backend.scheduler.deadlines import NO_CAPACITY, UNREACHABLE, urgent_chunk
from adaserve_backend.scheduler.plan import IterationResult, Prefilled, Verified
from adaserve_backend.scheduler.policies import make_policy
from adaserve_backend.scheduler.scheduler import Scheduler
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import SLO
from tests.unit.test_scheduler import SPEC, Clock, TableEstimator, _ids, steep_estimator

# 50 ms per token alone; a second request would make everyone's 300 ms: admission allows one at a time
ONE_AT_A_TIME = {1: 0.05, 2: 0.3, 3: 0.5}


def deadline_scheduler(estimator=None, **config) -> Scheduler:
    blocks = BlockManager(4096, 4)
    sched = SchedulerConfig(policy="adaserve", prefill_chunk=256, **config)
    return Scheduler(sched, SPEC, make_policy("adaserve"), estimator or TableEstimator(ONE_AT_A_TIME), blocks, None)


def arrive(sched: Scheduler, rid: str, clock: Clock, ttft_ms: float, tpot_ms: float = 100.0, prompt: int = 8,
           max_tokens: int = 4) -> Sequence:
    s = Sequence.start(Request(rid, [5] * prompt, max_tokens=max_tokens), next(_ids),
                       SLO(tpot_ms, ttft_ms), clock.now, frozenset())
    sched.add(s)
    return s


def step(sched: Scheduler, clock: Clock, seconds: float = 0.05) -> list[RequestOutput]:
    """One iteration: every prefill chunk lands (the last one yields token 7), every decode yields 8."""
    plan = sched.schedule(clock.now)
    prefilled = [Prefilled(s, n, 7 if s.prefilled + n == s.prefill_goal else None) for s, n in plan.prefill.items()]
    decoded = [Verified(s, [8], draft_tokens=0, accepted_drafts=0, draft_depth=0) for s in plan.decode]
    return sched.update(plan, IterationResult(clock.tick(seconds), decoded=decoded, prefilled=prefilled))


def test_waiting_requests_start_earliest_deadline_first_when_admission_allows():
    sched, clock = deadline_scheduler(max_num_seqs=1), Clock()
    loose = arrive(sched, "loose", clock, ttft_ms=5000)
    tight = arrive(sched, "tight", clock, ttft_ms=1000)
    clock.tick(0.01)
    tighter_later = arrive(sched, "tighter", clock, ttft_ms=500)  # due at +0.51 s, before "tight" at +1.0 s
    assert start_order(sched, clock) == ["tighter", "tight", "loose"]
    for s in (loose, tight, tighter_later):
        assert s.first_token_time <= s.deadline and s.missed is None


def start_order(sched: Scheduler, clock: Clock) -> list[str]:
    started = []
    while sched.has_work():
        step(sched, clock)
        started += [s.request.request_id for s in sched.running if s.request.request_id not in started]
    return started


def test_of_two_prompts_due_about_together_the_shorter_prefills_first_whichever_arrived_first():
    """10 ms per prompt token: the long prompt's prefill is 0.9 s longer, so the short one goes first
    unless the long one is due more than 0.9 s earlier."""
    for long_ttft_ms, expected in ((6000, ["short", "long"]), (5200, ["short", "long"]), (5000, ["long", "short"])):
        sched, clock = deadline_scheduler(TableEstimator(ONE_AT_A_TIME, prefill_token_s=0.01), max_num_seqs=1), Clock()
        arrive(sched, "long", clock, ttft_ms=long_ttft_ms, prompt=100)
        clock.tick(0.001)
        arrive(sched, "short", clock, ttft_ms=6000, prompt=10)
        assert start_order(sched, clock) == expected, long_ttft_ms


def test_a_request_no_schedule_can_serve_on_time_is_rejected_at_arrival_with_the_prediction():
    sched, clock = deadline_scheduler(TableEstimator(ONE_AT_A_TIME, prefill_token_s=0.01)), Clock()
    long = arrive(sched, "long", clock, ttft_ms=2000, prompt=300)  # 3 s of prefill alone
    ok = arrive(sched, "ok", clock, ttft_ms=2000, prompt=100)  # 1 s
    outs = step(sched, clock)
    (rejected,) = [o for o in outs if o.request_id == "long"]
    assert rejected.finished and rejected.finish_reason == FinishReason.REJECTED and not rejected.new_token_ids
    assert rejected.error == ("server cannot meet ttft_slo_ms=2000 at the current load "
                              "(predicted first token in 3100 ms)")
    assert rejected.stats.overload == UNREACHABLE and rejected.stats.queue_wait_s == 0.0
    assert sched.overloads == {UNREACHABLE: 1} and sched.running == [ok] and long not in sched.waiting


def test_the_first_token_margin_plans_first_tokens_that_much_before_the_ttft_target():
    """first_token_margin_ms leaves time for the response to reach the client: a first token predicted
    at 3.1 s meets a 3.12-s target with no margin and is refused with 50 ms kept for delivery."""
    for margin_ms, rejected in ((0.0, False), (50.0, True)):
        sched = deadline_scheduler(TableEstimator(ONE_AT_A_TIME, prefill_token_s=0.01), first_token_margin_ms=margin_ms)
        clock = Clock()
        seq = arrive(sched, "r", clock, ttft_ms=3120, prompt=300)
        assert math.isclose(seq.deadline, clock.now + 3.12 - margin_ms / 1e3)
        outs = step(sched, clock)
        assert any(o.finish_reason == FinishReason.REJECTED for o in outs) == rejected


def test_a_waiting_request_is_rejected_when_its_deadline_becomes_unreachable_never_later():
    sched, clock = deadline_scheduler(), Clock()
    first = arrive(sched, "first", clock, ttft_ms=2000, max_tokens=1000)  # holds the only slot for 50 s
    step(sched, clock)
    waiting = arrive(sched, "waiting", clock, ttft_ms=500)
    outs, rejected_at = [], None
    while rejected_at is None:
        assert clock.now < waiting.deadline, "waited past its deadline"
        assert waiting in sched.waiting  # admission would put "first" off its TPOT: it waits, for now
        outs = [o for o in step(sched, clock) if o.request_id == "waiting"]
        rejected_at = clock.now if outs else None
    (out,) = outs
    assert out.finish_reason == FinishReason.REJECTED and "ttft_slo_ms=500 " in out.error
    # rejected at the last iteration from which waiting one more would already be late, not before
    assert waiting.deadline - 2 * TableEstimator.ITERATION_S - 1e-9 <= out.emit_time < waiting.deadline
    assert out.stats.overload == NO_CAPACITY and math.isclose(out.stats.queue_wait_s, out.emit_time - waiting.arrival)
    assert sched.running == [first] and sched.overloads == {NO_CAPACITY: 1}


def test_best_effort_keeps_the_request_marked_missed_and_serves_it_when_capacity_frees():
    sched, clock = deadline_scheduler(overload="best_effort"), Clock()
    arrive(sched, "first", clock, ttft_ms=2000, max_tokens=30)  # done after ~1.5 s
    step(sched, clock)
    late = arrive(sched, "late", clock, ttft_ms=300)
    outs = []
    while sched.has_work():
        outs += [o for o in step(sched, clock) if o.request_id == "late"]
    assert late.missed == NO_CAPACITY and all(o.finish_reason != FinishReason.REJECTED for o in outs)
    assert outs[-1].finish_reason == FinishReason.LENGTH and outs[-1].num_output_tokens == 4
    assert outs[-1].stats.slo_missed and outs[-1].stats.queue_wait_s > 1.0
    assert late.first_token_time > late.deadline and sched.overloads == {NO_CAPACITY: 1}


def test_a_long_waiting_loose_request_is_served_under_steady_load():
    """One request runs at a time (admission) for 0.2 s; a tight one (TTFT 1 s) arrives every 0.2 s
    behind a backlog of three, so whenever the slot frees a tighter request is waiting. The loose one
    (TTFT 6 s) is not starved by them: as its deadline nears it is the earliest due and starts in time.
    Every request is answered; none is rejected after it streamed."""
    sched, clock = deadline_scheduler(), Clock()
    start, n = clock.now, 0
    for _ in range(3):
        arrive(sched, f"tight{n}", clock, ttft_ms=1000)
        n += 1
    loose = arrive(sched, "loose", clock, ttft_ms=6000)
    streamed, answers = set(), {}
    while clock.now < start + 8.0 or sched.has_work():
        if clock.now < start + 8.0 and clock.now >= start + 0.2 * (n - 2) - 1e-9:
            arrive(sched, f"tight{n}", clock, ttft_ms=1000)
            n += 1
        for o in step(sched, clock):
            assert not (o.finish_reason == FinishReason.REJECTED and o.request_id in streamed), "rejected mid-stream"
            streamed |= {o.request_id} if o.new_token_ids else set()
            if o.finished:
                answers[o.request_id] = o
    assert answers["loose"].finish_reason == FinishReason.LENGTH and loose.first_token_time <= loose.deadline
    assert answers["loose"].stats.queue_wait_s > 4.0  # tighter requests did go first for a long time
    assert len(answers) == n + 1  # every request answered
    assert all(o.emit_time < o.arrival_time + 1.0 for o in answers.values() if o.finish_reason == FinishReason.REJECTED)


def test_a_preempted_request_is_never_rejected_and_resumes_first():
    sched, clock = deadline_scheduler(max_num_seqs=1), Clock()
    resumed = arrive(sched, "resumed", clock, ttft_ms=100)
    step(sched, clock)
    assert resumed.output == [7]
    sched._preempt(resumed)  # as a full cache would: its client is mid-stream
    clock.tick(5.0)  # far past its first-token deadline
    fresh = arrive(sched, "fresh", clock, ttft_ms=100, prompt=4)
    outs = step(sched, clock)
    assert all(o.finish_reason != FinishReason.REJECTED for o in outs if o.request_id == "resumed")
    assert sched.running == [resumed] and resumed.missed is None and fresh in sched.waiting


def test_first_tokens_set_a_floor_under_prefill_pacing():
    """A decoding request behind its TPOT stops prefill pacing (test_scheduler); a prefilling request
    whose first token is due gets the chunk its deadline needs anyway."""
    now = 1000.0
    a = Sequence.start(Request("a", [5] * 300), 1, SLO(100.0, 1000.0), now, frozenset())
    b = Sequence.start(Request("b", [5] * 100), 2, SLO(100.0, 1000.0), now - 0.5, frozenset())
    # b is due at +0.5 s (5 iterations of 0.1 s: 20 tokens each), a at +1.0 s behind b (400 in 10: 40)
    assert urgent_chunk([a, b], now, lambda chunk: 0.1, 256) == 40
    assert urgent_chunk([a], now + 2.0, lambda chunk: 0.1, 256) == 300  # late already: all of it now
    # priced at the chunk it asks for (10 ms and 0.25 ms a token): 88 iterations of 5 tokens fit before
    # a's deadline, so 5 tokens an iteration do; priced at a full chunk's 74 ms, 13 fit and it asked 31
    assert urgent_chunk([a, b], now, lambda chunk: 0.01 + chunk / 4000, 256) == 5
    est = steep_estimator()
    assert math.isclose(est.first_token_s(0, 600, 256), 2 * est.prefill_iteration_s(0, 256)
                        + est.prefill_iteration_s(0, 88))
    assert est.first_token_s(2, 10, 256) > est.first_token_s(0, 10, 256)  # riding along decode costs the iteration


def test_a_request_that_needs_the_machine_alone_holds_admissions_for_a_bounded_time():
    """A client declaring a TPOT target only a lone request meets (60 ms: 50 alone, 300 with company),
    with a long output, would hold every other admission until it ends; it holds them exclusive_hold_s."""
    sched, clock = deadline_scheduler(exclusive_hold_s=2.0), Clock()
    hog = arrive(sched, "hog", clock, ttft_ms=1e6, tpot_ms=60.0, max_tokens=400)
    step(sched, clock)
    other = arrive(sched, "other", clock, ttft_ms=1e6, tpot_ms=1000.0)
    while other not in sched.running and hog in sched.running:
        step(sched, clock)
    assert hog in sched.running, "the other request started only once the hog had finished"
    assert 2.0 <= clock.now - hog.admitted_time < 2.2  # admitted at the bound, not at the hog's end (~20 s)


def test_a_request_unfinished_after_max_request_s_ends_with_an_error_and_frees_its_blocks():
    sched, clock = deadline_scheduler(max_request_s=1.0), Clock()
    slow = arrive(sched, "slow", clock, ttft_ms=1e6, tpot_ms=1e4, max_tokens=400)
    outs = []
    while sched.has_work():
        outs += step(sched, clock)
    (final,) = [o for o in outs if o.finished]
    assert final.finish_reason == FinishReason.ERROR and "timed out" in final.error
    assert 1.0 < clock.now - slow.arrival < 1.1
    assert sched.target_blocks.num_free_blocks == sched.target_blocks.num_blocks


# ---- bursts: Moore-Hodgson over the prefill work ----------------------------------------------------
def burst(clock: Clock, sched: Scheduler | None = None, shorts: int = 12) -> tuple[Sequence, list[Sequence]]:
    """A 500-token prompt due at 1.0 s and `shorts` 100-token ones due at 1.8 s: with 1 ms per prompt
    token and 50 ms per 256-token iteration, in deadline order (the long one first, even pushed back by
    its own prefill time: edf_key) the 11th and 12th short ones are late; without the long one, none."""
    def make(rid: str, prompt: int, ttft_ms: float) -> Sequence:
        s = Sequence.start(Request(rid, [5] * prompt, max_tokens=4), next(_ids), SLO(100.0, ttft_ms),
                           clock.now, frozenset())
        if sched is not None:
            sched.add(s)
        return s
    return make("long", 500, 1000.0), [make(f"short{i}", 100, 1800.0) for i in range(shorts)]


def test_a_burst_sets_aside_the_longest_prefill_not_the_last_deadlines():
    from adaserve_backend.scheduler.deadlines import deferred_in_burst, note_prefill_times

    est, clock = TableEstimator(prefill_token_s=0.001), Clock()
    long, shorts = burst(clock)
    note_prefill_times([long, *shorts], est, 256)
    now = clock.now
    assert deferred_in_burst([long, *shorts], est, now, 0, [], 256) == {long}
    assert deferred_in_burst([long, *shorts[:10]], est, now, 0, [], 256) == set()  # all in time: none
    # a long prefill already running is never set aside: the two short ones it makes late go instead
    assert len(deferred_in_burst(shorts, est, now, 0, [long], 256)) == 2


def test_the_scheduler_holds_back_what_a_burst_cannot_afford_and_refuses_it_in_time():
    est = TableEstimator({n: 0.01 for n in range(1, 16)}, prefill_token_s=0.001)
    clock = Clock()
    sched = deadline_scheduler(est)
    long, shorts = burst(clock, sched)
    plan = sched.schedule(clock.now)
    assert long in sched.waiting and all(s in sched.running for s in shorts)
    assert long not in plan.prefill
    landed = [Prefilled(s, n, 7 if s.prefilled + n == s.prefill_goal else None) for s, n in plan.prefill.items()]
    outputs = sched.update(plan, IterationResult(clock.tick(0.1), prefilled=landed))
    for _ in range(40):
        if sched.has_work():
            outputs += step(sched, clock, 0.1)
    rejected = [o.request_id for o in outputs if o.finish_reason == FinishReason.REJECTED]
    assert rejected == ["long"] and long.missed == NO_CAPACITY
    assert all(s.first_token_time is not None and s.first_token_time <= s.deadline for s in shorts)

    plain = deadline_scheduler(TableEstimator({n: 0.01 for n in range(1, 16)}, prefill_token_s=0.001),
                               burst_deferral=False)
    long, shorts = burst(clock, plain)
    assert long in plain.schedule(clock.now).prefill  # in deadline order the long one starts first


def test_burst_deferral_is_a_flag():
    import pytest

    with pytest.raises(ValueError, match="burst_deferral"):
        SchedulerConfig(burst_deferral="yes")


def test_arrival_order_serves_first_come_first_while_every_deadline_holds():
    """A summary that arrived first goes first when the coding request behind it still makes its
    deadline; deadline order (the flag off) would serve the coding request first."""
    for within, expected in ((1.0, ["summary", "coding"]), (None, ["coding", "summary"])):
        sched, clock = deadline_scheduler(max_num_seqs=1, arrival_order_within=within), Clock()
        arrive(sched, "summary", clock, ttft_ms=5000)
        clock.tick(0.01)
        arrive(sched, "coding", clock, ttft_ms=2000)
        assert start_order(sched, clock) == expected, within


def test_arrival_order_gives_way_to_deadlines_when_it_would_make_one_late():
    """10 ms per prompt token: the summary's 1.5 s prefill first would make the coding request, due 1 s
    after it arrived, late; so deadline order, and both in time."""
    est = TableEstimator(ONE_AT_A_TIME, prefill_token_s=0.01)
    sched, clock = deadline_scheduler(est, max_num_seqs=1, arrival_order_within=1.0), Clock()
    summary = arrive(sched, "summary", clock, ttft_ms=5000, prompt=150)
    clock.tick(0.01)
    coding = arrive(sched, "coding", clock, ttft_ms=1000, prompt=10)
    assert start_order(sched, clock) == ["coding", "summary"]
    assert all(s.first_token_time <= s.deadline for s in (summary, coding))


def test_arrival_order_counts_the_next_iteration_before_the_waiting_start():
    from adaserve_backend.scheduler.deadlines import arrival_order_on_time

    est, clock = TableEstimator(prefill_token_s=0.0), Clock()
    sched = deadline_scheduler(est)
    first = arrive(sched, "first", clock, ttft_ms=5000)
    second = arrive(sched, "second", clock, ttft_ms=90)  # both prompts fit one 50 ms iteration
    assert arrival_order_on_time([first, second], [], est, clock.now, 0, 256)
    # one decoding request: its next iteration (50 ms) comes first: 100 ms
    assert not arrival_order_on_time([first, second], [], est, clock.now, 1, 256)
    # within half its time to the deadline (45 ms): too late even with none decoding
    assert not arrival_order_on_time([first, second], [], est, clock.now, 0, 256, within=0.5)


def test_arrival_order_within_is_a_share_of_the_deadline():
    import pytest

    for bad in (0.0, 1.5, "yes"):
        with pytest.raises(ValueError, match="arrival_order_within"):
            SchedulerConfig(arrival_order_within=bad)
