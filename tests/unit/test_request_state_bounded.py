"""Per-request state ends with its request, on every way a request ends (issue 71: the engine model's
process grew during a soak). The real engine, feature-conditioned draft, prompt lookup, suffix index,
prefix cache, learned lengths and SLO admission on, serves requests that finish, stop on a stop token,
are aborted mid-stream or while queued, are refused at once (overload), fail validation, are rejected
by admission, time out, are preempted; afterwards every structure kept per request or per iteration
is empty or within its bound (entries counted, not memory)."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest
import torch

from adaserve_backend.engine import Engine
from adaserve_backend.request import FinishReason, Overloaded, Request, RequestOutput, SamplingParams
from adaserve_backend.scheduler.deadlines import NO_CAPACITY, UNREACHABLE
from adaserve_backend.serving.engine_thread import EngineHooks, deliver_all
from adaserve_backend.slo import SLO
from adaserve_backend.triton.engine_loop import TritonEngineLoop
from tests import fake_pb
from tests.engines import EOS, make_engine, small_config
from tests.model_fixtures import our_model, tiny_checkpoint
from tests.unit.test_engine import steep_profile
from tests.unit.test_prefix_cache import feature_draft

STATS_HISTORY = 16  # iteration records kept: the run has many more iterations
SUFFIX_CAP = 300  # tokens: the run feeds the suffix index many times this, so it evicts
MAX_WAITING = 4
KINDS = ("finish", "abort_streaming", "finish", "abort_queued", "rejected", "finish", "invalid", "burst",
         "stop_token", "timeout", "finish", "scoped")


@pytest.fixture
def one_thread():
    """Hundreds of steps of a tiny model: one thread, since on a busy machine the idle ones' spin-waits
    made a run take ten times as long, and back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def served_engine(tmp_path) -> Engine:
    target = tiny_checkpoint("llama")
    config = small_config("adaserve", num_blocks=32, profile_path=steep_profile(tmp_path),
                          suffix_max_tokens=SUFFIX_CAP)
    config = dataclasses.replace(config, scheduler=dataclasses.replace(
        config.scheduler, max_waiting=MAX_WAITING, max_request_s=600.0, stats_history=STATS_HISTORY))
    return Engine(config, target=our_model(target), draft=feature_draft(target, tmp_path), eos_token_ids=[EOS])


def make_request(kind: str, i: int, rng: random.Random, system: list[int]) -> Request:
    prompt = (system if rng.random() < 0.5 else []) + [rng.randrange(3, 200) for _ in range(rng.randint(2, 14))]
    slo = SLO(tpot_ms=rng.choice([50.0, 150.0]), ttft_ms=1e7)
    extra: dict = {}
    if kind == "rejected":  # its prefill alone takes longer than its first-token target
        prompt, slo = [5] * 30, SLO(ttft_ms=1.0)
    elif kind == "stop_token":
        extra["stop_token_ids"] = tuple(range(3, 200, 2))
    elif kind == "timeout":  # arrived long before max_request_s
        extra["arrival_time"] = time.monotonic() - 1000.0
    elif kind == "scoped":  # an isolated tenant: its own prefix-cache root and suffix-index scope
        extra["cache_scope"] = f"tenant-{i % 3}"
    if rng.random() < 0.3:
        extra["sampling"] = SamplingParams(temperature=0.8, seed=i)
    return Request(f"q{i}", prompt, max_tokens=rng.randint(1, 16), slo=slo, **extra)


def invalid(i: int) -> None:
    """Each raises ValueError at the door (the seed: before, a generator refused it inside a step)."""
    [lambda: Request(f"v{i}", []),
     lambda: Request(f"v{i}", [5, 6], max_tokens=10_000),
     lambda: Request(f"v{i}", [5, 6], sampling=SamplingParams(temperature=1.0, seed=2**64)),
     lambda: Request(f"v{i}", [5, 6], slo=SLO(slo_class="no-such-class"))][i % 4]()


class Driver:
    """Submits as a serving driver does (check_room, then add_request) and records final outputs."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.finals, self.streamed, self.to_cancel = engine, {}, set(), set()
        self.accepted, self.refused, self.invalid = [], 0, 0

    def submit(self, kind: str, i: int, rng: random.Random, system: list[int], wait: bool = True) -> None:
        """`wait`: step until there is room first, so every kind of ending happens whatever the timing;
        refusals come from the bursts."""
        while wait and self.engine.num_waiting() >= MAX_WAITING:
            self.step()
        if kind == "invalid":
            with pytest.raises(ValueError):
                self.engine.add_request(invalid(i))
            self.invalid += 1
            return
        if kind == "burst":  # more at once than may wait: the rest are refused
            for j in range(MAX_WAITING + 2):
                self.submit("finish", 1000 * (i + 1) + j, rng, system, wait=False)
            return
        try:
            self.engine.check_room()
        except Overloaded:
            self.refused += 1
            return
        req = make_request(kind, i, rng, system)
        self.engine.add_request(req)
        self.accepted.append(req.request_id)
        if kind == "abort_queued":
            self.engine.abort(req.request_id)
        elif kind == "abort_streaming":
            self.to_cancel.add(req.request_id)

    def step(self) -> None:
        for rid in [r for r in self.to_cancel if r in self.streamed]:
            self.engine.abort(rid)
            self.to_cancel.discard(rid)
        for o in self.engine.step():
            assert o.request_id not in self.finals, "a request got two final outputs"
            if o.new_token_ids:
                self.streamed.add(o.request_id)
            if o.finished:
                self.finals[o.request_id] = o.finish_reason


def test_every_per_request_structure_is_empty_or_bounded_after_every_kind_of_ending(tmp_path, one_thread):
    engine = served_engine(tmp_path)
    rng = random.Random(0)
    system = [rng.randrange(3, 200) for _ in range(12)]  # a shared prefix: prefix-cache hits
    driver = Driver(engine)
    for i in range(96):
        driver.submit(KINDS[i % len(KINDS)], i, rng, system)
        driver.step()
    engine.abort("never-submitted")
    for _ in range(10_000):
        if not engine.has_work():
            break
        driver.step()
    engine.step()  # an idle step hands the last step's ended requests to the draft worker (plan.released)

    # every way of ending happened, and each accepted request got exactly one final output
    assert set(driver.finals) == set(driver.accepted)
    reasons = set(driver.finals.values())
    assert {FinishReason.ABORT, FinishReason.REJECTED, FinishReason.ERROR} <= reasons
    assert reasons & {FinishReason.STOP, FinishReason.LENGTH}
    assert driver.refused > 0 and driver.invalid > 0 and engine.num_preemptions > 0

    # the engine's own bookkeeping: queues, ids in flight, owed answers
    sched = engine.scheduler
    assert not sched.waiting and not sched.running and sched.released == []
    assert engine._inbox.empty() and engine._inbox._live_ids == set() and engine._owed == {}
    # KV blocks: no sequence left; prefix-cache entries (and their payloads) bounded by the blocks
    for runner in (engine.target, engine.draft.runner):
        blocks = runner.blocks
        assert blocks._seqs == {} and blocks.num_free_blocks == blocks.num_blocks
        pool = blocks.pool
        assert len(pool._by_key) == len(pool._key_of) <= blocks.num_blocks
        assert len(pool._payload) <= len(pool._key_of) and len(pool._idle) <= blocks.num_blocks
    # the draft worker: features and n-gram indexes per request gone
    draft = engine.draft
    assert draft._features == {} and draft.copies._ngrams == {}
    # the suffix index: within its cap, every doc finished, no evicted doc still referenced
    suffix = draft.copies.suffix
    assert suffix.num_tokens <= SUFFIX_CAP and suffix._closed == set()
    assert all(d.finished for d in suffix._docs.values())
    assert len(suffix._docs) < len(driver.accepted)  # it evicted
    live = {id(d) for d in suffix._docs.values()}
    assert all(id(doc) in live for where in suffix._where.values() for doc, _ in suffix.occurrences(where))
    # learnt tables keyed by buckets, loads and kinds, never by request
    assert len(draft.copies.rates._trials) <= 4 * 4 * 4 and len(draft.copies.rates._prior) <= 4 * 4 * 4
    est, max_seqs = engine.estimator, engine.config.scheduler.max_num_seqs
    assert set(est.by_load) | set(est.plain_by_load) | set(est.size._depth_width) <= set(range(max_seqs + 1))
    assert set(est.depth_correction) <= set(range(1, engine.config.speculation.d_max + 2))
    assert len(est.tried) <= engine.config.speculation.d_max + 1
    lengths = sched.lengths
    assert len(lengths.histories) <= lengths.max_kinds
    assert all(len(h.order) == len(h.sorted) <= lengths.window for h in lengths.histories.values())
    assert set(sched.overloads) <= {UNREACHABLE, NO_CAPACITY}
    assert len(sched.iteration_stats) <= STATS_HISTORY and len(sched.prefill_stats) <= STATS_HISTORY
    assert sched.decode_iterations > STATS_HISTORY
    with pytest.raises(ValueError, match="stats_history"):
        dataclasses.replace(sched.config, stats_history=0)


def test_a_step_that_fails_after_ending_requests_still_answers_each_of_them(one_thread):
    """The abort taken from the inbox had ended "a" (its blocks freed) when the step failed: fail_all
    answers it, else its id stayed in flight and the front end's state for it waited for good."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    engine.add_request(Request("a", [5, 6, 7], max_tokens=30, ignore_eos=True))
    engine.add_request(Request("b", [5, 6, 7, 8], max_tokens=30, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort("a")

    def boom(plan):
        raise RuntimeError("boom")

    engine._run = boom
    with pytest.raises(RuntimeError):
        engine.step()
    del engine._run
    outs = engine.fail_all("internal error")
    assert {o.request_id: (o.finished, o.finish_reason) for o in outs} == {
        "a": (True, FinishReason.ERROR), "b": (True, FinishReason.ERROR)}
    assert engine._owed == {} and engine._inbox._live_ids == set() and not engine.has_work()
    engine.add_request(Request("a", [5, 6], max_tokens=2))  # its id is free again
    assert engine.run_until_done()["a"]


def test_one_failing_delivery_does_not_lose_the_steps_other_outputs():
    class Hooks(EngineHooks):
        def __init__(self):
            self.got = []

        def deliver(self, out):
            self.got.append(out.request_id)
            if out.request_id == "x":
                raise RuntimeError("send failed")

    hooks = Hooks()
    with pytest.raises(RuntimeError, match="send failed"):
        deliver_all(hooks, [RequestOutput("x", [], finished=True), RequestOutput("y", [], finished=True)])
    assert hooks.got == ["x", "y"]


class Detok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


def test_the_triton_loop_keeps_nothing_for_requests_that_ended():
    """Finished, invalid, refused (overload), cancelled by the client, aborted by id: `active` empties."""
    target = tiny_checkpoint("llama")
    loop = TritonEngineLoop(fake_pb, "model_repository/adaserve", engine=make_engine(target, target, "adaserve",
                                                                                      tokenizer=Detok()))
    try:
        def request(max_tokens, **extra):
            return fake_pb.Request(input_ids=np.asarray([5, 6, 7], dtype=np.int32),
                                   max_tokens=np.asarray([max_tokens], dtype=np.int32), stream=[True], **extra)

        done, bad = request(4), request(0)
        cancelled, by_id = request(400), request(400, accept_ack=[True], request_id=np.asarray([b"p1"], dtype=object))
        for r in (done, bad, cancelled, by_id):
            loop.submit(r)
        deadline = time.monotonic() + 30
        while len(cancelled.sender.sent) < 2 or len(by_id.sender.sent) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cancelled.sender.cancelled = True
        loop.submit(fake_pb.Request(abort_request_id=np.asarray([b"p1"], dtype=object)))
        real = loop.engine.check_room
        loop.engine.check_room = lambda: (_ for _ in ()).throw(Overloaded("full"))
        refused = request(4)
        loop.submit(refused)
        loop.engine.check_room = real
        for r in (done, bad, cancelled, by_id, refused):
            assert r.sender.finished.wait(30), "no final response"
        assert loop.active == {}
        assert loop.engine._owed == {} and loop.engine._inbox._live_ids == set()
    finally:
        loop.shutdown()
