"""The `adaserve` model's runtime against a fake pb_utils: every accepted request ends with exactly one
final response (data, error or cancelled), and shutdown ends the ones in flight at once."""

from __future__ import annotations

import time

import numpy as np
import pytest

from adaserve_backend.serving.engine_thread import MAX_FAILURES
from adaserve_backend.serving.errors import ErrorKind
from adaserve_backend.triton import engine_loop
from adaserve_backend.triton.cancellation import CHECKS_PER_S, POLL_MAX_S, POLL_S, sweep_interval
from adaserve_backend.triton.engine_loop import TritonEngineLoop
from adaserve_backend.triton.protocol import response_error
from tests import fake_pb
from tests.engines import make_engine, reference, workload
from tests.model_fixtures import tiny_checkpoint

REPO_MODEL = "model_repository/adaserve"  # only its engine.json's SLO classes are read


class Detok:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


@pytest.fixture
def loop():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve", tokenizer=Detok())
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    yield loop
    if not loop.driver.stopping:
        loop.shutdown()


def request(prompt, max_tokens, **extra):
    return fake_pb.Request(input_ids=np.asarray(prompt, dtype=np.int32),
                           max_tokens=np.asarray([max_tokens], dtype=np.int32), **extra)


def wait(*requests, timeout=60):
    for r in requests:
        assert r.sender.finished.wait(timeout), "no final response"


def ids_of(req) -> list[int]:
    return [int(i) for resp, _ in req.sender.sent if resp is not None and not response_error(resp)
            for i in resp.tensors()["output_ids"]]


def test_streams_and_aggregates_and_every_request_ends_once(loop):
    target = tiny_checkpoint("llama")
    a, b = workload(target, n=2)
    streamed = request(a.prompt_ids, a.max_tokens, stream=[True], min_tokens=[a.min_tokens])
    whole = request(b.prompt_ids, b.max_tokens, exclude_input_in_output=[True], return_finish_reason=[True],
                    min_tokens=[b.min_tokens])
    bad = request([1, 2], 0)
    for r in (streamed, whole, bad):
        loop.submit(r)
    wait(streamed, whole, bad)
    assert ids_of(streamed) == reference(target, a) and len(streamed.sender.sent) > 1
    assert ids_of(whole) == reference(target, b) and len(whole.sender.sent) == 1
    assert whole.sender.sent[0][0].tensors()["finish_reason"][0] in ("stop", "length")
    (resp, flags), = bad.sender.sent
    assert "max_tokens" in response_error(resp)[1] and flags == fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_an_acked_request_is_answered_at_once_with_one_empty_response_then_streams_as_before(loop):
    """accept_ack (set by the ensemble pipeline): its BLS call holds one of the Python backend's shared
    threads until the first response, so acceptance is answered before the first token; a request the
    engine refuses gets its error as the final response after the ack."""
    target = tiny_checkpoint("llama")
    (a,) = workload(target, n=1)
    acked = request(a.prompt_ids, a.max_tokens, stream=[True], min_tokens=[a.min_tokens], accept_ack=[True])
    bad = request([1, 2], 0, accept_ack=[True])
    for r in (acked, bad):
        loop.submit(r)
    wait(acked, bad)
    (first, flags), *rest = acked.sender.sent
    assert first.tensors() == {} and flags == 0
    assert [int(i) for resp, _ in rest for i in resp.tensors()["output_ids"]] == reference(target, a)
    (ack, _), (resp, flags) = bad.sender.sent
    assert ack.tensors() == {} and "max_tokens" in response_error(resp)[1]
    assert flags == fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_a_cancelled_request_ends_cancelled_and_frees_its_blocks(loop):
    r = request([5, 6, 7], 400, stream=[True])
    loop.submit(r)
    deadline = time.monotonic() + 30
    while len(r.sender.sent) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r.sender.cancelled = True
    wait(r)
    resp, _ = r.sender.sent[-1]
    assert response_error(resp)[0] == ErrorKind.CANCELLED
    blocks = loop.engine.target.blocks
    deadline = time.monotonic() + 10
    while blocks.num_free_blocks != blocks.num_blocks:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_pipeline_requests_are_not_polled_for_cancellation_and_end_cancelled_when_aborted_by_id(loop):
    """accept_ack marks the ensemble pipeline's requests: it watches its own client and aborts by id, so
    asking the server whether its BLS stream was cancelled would only be round trips on busy cores."""
    acked = request([5, 6, 7], 400, stream=[True], accept_ack=[True], request_id=np.asarray([b"p1"], dtype=object))
    asked = []
    acked.sender.is_cancelled = lambda: asked.append(1) or True
    loop.submit(acked)
    for _ in range(3):  # sweeps, run here rather than waited for: the request may finish in a few tenths
        loop.cancel_watch.sweep()
    assert not asked and not acked.sender.finished.is_set()
    loop.submit(fake_pb.Request(abort_request_id=np.asarray([b"p1"], dtype=object)))
    wait(acked)
    assert response_error(acked.sender.sent[-1][0])[0] == ErrorKind.CANCELLED


def test_cancellation_sweeps_are_paced_by_how_many_requests_they_ask_about():
    assert sweep_interval(0) == POLL_S and sweep_interval(1) == POLL_S
    assert sweep_interval(CHECKS_PER_S // 2) == pytest.approx(0.5)
    assert sweep_interval(10_000) == POLL_MAX_S


def test_shutdown_ends_requests_in_flight_with_a_final_response_at_once(loop):
    reqs = [request([5, 6, 7 + i], 400, stream=[True]) for i in range(3)]
    for r in reqs:
        loop.submit(r)
    time.sleep(0.2)
    start = time.monotonic()
    loop.shutdown()
    assert time.monotonic() - start < 5
    for r in reqs:
        assert r.sender.finished.is_set()
        resp, _ = r.sender.sent[-1]
        assert resp is not None and response_error(resp) == (ErrorKind.UNAVAILABLE, "the server is shutting down")
    assert not loop.driver.thread.is_alive() and not loop.responses.thread.is_alive()


def test_shutdown_returns_even_if_a_send_never_returns(loop, monkeypatch):
    """At finalize Triton may no longer service the stub: a send that never returns must not hold
    the process past the server's exit timeout."""
    import threading

    monkeypatch.setattr(engine_loop, "SHUTDOWN_WAIT_S", 0.5)
    r = request([5, 6, 7], 400, stream=[True])
    released = threading.Event()
    r.sender.send = lambda response=None, flags=0: released.wait()
    loop.submit(r)
    time.sleep(0.3)
    start = time.monotonic()
    loop.shutdown()
    assert time.monotonic() - start < 3
    released.set()


def test_error_codes_bad_input_invalid_arg_and_an_overload_rejection_unavailable_while_others_stream(tmp_path):
    """The codes clients map to HTTP statuses (gRPC INVALID_ARGUMENT -> 400, UNAVAILABLE -> 503), and a
    rejection counted in the metrics as a violation of every target."""
    from adaserve_backend.scheduler.deadlines import UNREACHABLE
    from tests.unit.test_engine import steep_profile

    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve", tokenizer=Detok(), profile_path=steep_profile(tmp_path))
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    try:
        a, b = workload(target, n=2)
        streams = [request(r.prompt_ids, r.max_tokens, stream=[True], min_tokens=[r.min_tokens],
                           ttft_slo_ms=np.float32([1e7]),
                           slo_class=np.array([b"chat"], dtype=object)) for r in (a, b)]
        doomed = request([5] * 30, 8, stream=[True], ttft_slo_ms=np.float32([1.0]),
                         slo_class=np.array([b"coding"], dtype=object))
        bad = request([5, 6], 4, ttft_slo_ms=np.float32([-1.0]))
        for r in (streams[0], doomed, bad, streams[1]):
            loop.submit(r)
        wait(*streams, doomed, bad)
        for r, want in zip(streams, (a, b)):
            assert ids_of(r) == reference(target, want) and not any(response_error(resp)
                                                                    for resp, _ in r.sender.sent if resp)
        (resp, flags), = doomed.sender.sent  # one final error, no data before it
        code, message = response_error(resp)
        assert code == ErrorKind.UNAVAILABLE and flags == fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        assert message.startswith("server cannot meet ttft_slo_ms=1 at the current load")
        (resp, _), = bad.sender.sent
        code, message = response_error(resp)
        assert code == ErrorKind.INVALID_ARG and "ttft_slo_ms must be a positive finite number" in message
        m = loop.metrics
        assert m.rejected[UNREACHABLE].value == 1 and m.requests["coding"].value == 1
        assert m.attained["coding"].value == 0 and m.tpot_attained["coding"].value == 0
        assert m.requests["chat"].value == 2 and m.ttft_attained["chat"].value == 2
    finally:
        loop.shutdown()


def test_the_engine_is_built_on_its_loop_thread_and_a_failed_build_fails_initialize(monkeypatch):
    """Built on Triton's thread, every GEMM of the loop thread ran 1.5x slower (serving/engine_thread.py)."""
    import threading

    target = tiny_checkpoint("llama")
    built_on = []

    def build(config):
        built_on.append(threading.current_thread().name)
        return make_engine(target, target, "adaserve", tokenizer=Detok())

    monkeypatch.setattr(engine_loop.Engine, "from_config", staticmethod(build))
    loop = TritonEngineLoop(fake_pb, REPO_MODEL)
    try:
        assert built_on == ["adaserve-engine"]
        r = request([5, 6, 7], 4)
        loop.submit(r)
        wait(r)
    finally:
        loop.shutdown()

    def fail(config):
        raise RuntimeError("checkpoint not found")

    monkeypatch.setattr(engine_loop.Engine, "from_config", staticmethod(fail))
    with pytest.raises(RuntimeError, match="checkpoint not found"):
        TritonEngineLoop(fake_pb, REPO_MODEL)


def test_coalesced_streaming_sends_the_same_tokens_in_fewer_responses_the_first_at_once():
    engine = make_engine(tiny_checkpoint("llama"), None, "continuous", tokenizer=Detok())  # one token per step
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    loop.pace = False  # a paced stream is not coalesced (test_a_paced_stream_...)

    def stream(prompt):
        r = request(prompt, 60, stream=[True], min_tokens=[60])
        loop.submit(r)
        wait(r)
        return r

    loop.max_hold_ms = 0.0
    plain = stream([5, 6, 7])
    loop.max_hold_ms = 250.0
    held = stream([5, 6, 7])
    sizes = [len(resp.tensors()["output_ids"]) for resp, _ in held.sender.sent]
    loop.shutdown()
    assert ids_of(held) == ids_of(plain) and len(ids_of(held)) == 60
    assert len(plain.sender.sent) == 60 and sizes[0] == 1 and len(sizes) < 60


def test_a_paced_stream_sends_each_token_in_its_own_response_counted_and_the_same_tokens():
    """StreamingConfig.pace: a stream with a TPOT target gets one response per token (the target drafts
    for itself here, so every step accepts several), each counting the tokens sent through it, until
    its last step's, which leave at once; the tokens are those of the plain stream."""
    target = tiny_checkpoint("llama")
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=make_engine(target, target, "adaserve", tokenizer=Detok()))

    def stream(**slo):
        r = request([5, 6, 7], 40, stream=[True], min_tokens=[40], return_num_output_tokens=[True], **slo)
        loop.submit(r)
        wait(r)
        return r

    try:
        loop.pace = True
        best_effort = stream()  # no TPOT target: not paced
        paced = stream(tpot_slo_ms=np.float32([1e4]), ttft_slo_ms=np.float32([1e7]))
    finally:
        loop.shutdown()
    counts = [int(resp.tensors()["num_output_tokens"][0]) for resp, _ in paced.sender.sent]
    assert ids_of(paced) == ids_of(best_effort) and len(ids_of(paced)) == 40
    assert len(best_effort.sender.sent) < 40  # speculation: several tokens a step
    # one token a response, but the last: the final step's tokens leave together, at once
    assert counts[:-1] == list(range(1, len(counts))) and counts[-1] == 40
    assert [f for _, f in paced.sender.sent].count(fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL) == 1


class LoopKilled(BaseException):
    """What a step's own guard does not catch (as KeyboardInterrupt, SystemExit or MemoryError)."""


def test_a_dying_engine_loop_answers_in_flight_requests_restarts_and_is_refused_once_dead(loop, monkeypatch):
    real_step, kills = loop.engine.step, []

    def step():
        if kills and kills[0] > 0:
            kills[0] -= 1
            raise LoopKilled()
        return real_step()

    monkeypatch.setattr(loop.engine, "step", step)
    first = request([5, 6, 7], 400, stream=[True])
    loop.submit(first)
    while len(first.sender.sent) < 2:
        time.sleep(0.01)
    kills.append(1)  # the next step kills the loop once
    wait(first, timeout=10)
    code, message = response_error(first.sender.sent[-1][0])
    assert code == ErrorKind.INTERNAL and "LoopKilled" not in message  # no internals reach the client
    again = request([5, 6, 7], 4)
    loop.submit(again)
    wait(again)
    assert len(ids_of(again)) == 3 + 4 and not response_error(again.sender.sent[-1][0])  # restarted and serving
    kills[0] = 100  # every step fails: with MAX_FAILURES deaths within the window it counts as dead
    for _ in range(MAX_FAILURES - 1):
        doomed = request([5, 6, 7], 4)
        loop.submit(doomed)
        wait(doomed, timeout=10)
        assert response_error(doomed.sender.sent[-1][0])[0] == ErrorKind.INTERNAL
    assert loop.driver.dead
    refused = request([5, 6, 7], 4)
    loop.submit(refused)
    wait(refused, timeout=1)  # at once, not after a timeout
    assert response_error(refused.sender.sent[-1][0])[0] == ErrorKind.UNAVAILABLE


def test_requests_past_the_waiting_cap_are_refused_at_once_with_unavailable(monkeypatch):
    import dataclasses

    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "continuous", tokenizer=Detok())
    engine.config = dataclasses.replace(engine.config,
                                        scheduler=dataclasses.replace(engine.config.scheduler, max_waiting=2))
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    try:
        monkeypatch.setattr(loop.engine, "has_work", lambda: False)  # nothing is taken from the queue meanwhile
        reqs = [request([5, 6, 7], 4) for _ in range(3)]
        for r in reqs:
            loop.submit(r)
        wait(reqs[2], timeout=1)
        code, message = response_error(reqs[2].sender.sent[-1][0])
        assert code == ErrorKind.UNAVAILABLE and "overloaded" in message
        monkeypatch.undo()
        loop.driver.wake.set()
        wait(*reqs[:2])
        assert all(len(ids_of(r)) == 3 + 4 for r in reqs[:2])  # the prompt, then 4 tokens
    finally:
        loop.shutdown()


def test_logprobs_travel_one_per_output_token_streamed_coalesced_or_whole():
    """With `logprobs` N: each response's output_log_probs match its output_ids one for one, with N
    alternatives each (top_log_probs, top_log_prob_ids flattened), streamed, coalesced or whole;
    without it, none."""
    engine = make_engine(tiny_checkpoint("llama"), None, "continuous", tokenizer=Detok())
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    loop.max_hold_ms = 250.0
    asked = [request([5, 6, 7], 30, stream=[True], min_tokens=[30], logprobs=np.asarray([2], dtype=np.int32)),
             request([5, 6, 7], 30, min_tokens=[30], exclude_input_in_output=[True],
                     logprobs=np.asarray([0], dtype=np.int32))]
    plain = request([5, 6, 7], 30, stream=[True], min_tokens=[30])
    for r in (*asked, plain):
        loop.submit(r)
    wait(*asked, plain)
    loop.shutdown()
    for r, k in zip(asked, (2, 0)):
        total = 0
        for resp, _ in r.sender.sent:
            t = resp.tensors()
            n = len(t["output_ids"])
            assert len(t["output_log_probs"]) == n and len(t["top_log_probs"]) == len(t["top_log_prob_ids"]) == k * n
            assert all(lp <= 0 for lp in t["output_log_probs"])
            total += n
        assert total == 30
    assert all("output_log_probs" not in resp.tensors() for resp, _ in plain.sender.sent)


def test_prompt_logprobs_come_once_on_the_first_response():
    engine = make_engine(tiny_checkpoint("llama"), None, "continuous", tokenizer=Detok())
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    r = request([5, 6, 7, 8], 4, stream=[True], min_tokens=[4], prompt_logprobs=np.asarray([2], dtype=np.int32))
    loop.submit(r)
    wait(r)
    loop.shutdown()
    carrying = [resp.tensors() for resp, _ in r.sender.sent if "prompt_token_ids" in resp.tensors()]
    assert len(carrying) == 1 and carrying[0]["prompt_token_ids"].tolist() == [5, 6, 7, 8]
    assert len(carrying[0]["prompt_log_probs"]) == 3 and len(carrying[0]["prompt_top_log_prob_ids"]) == 6
