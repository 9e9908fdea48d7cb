"""The front model's BLS pipeline, in-process: a fake pb_utils routes its calls to a real engine loop
(the `adaserve` model over a tiny checkpoint) and to fake pre- and postprocessing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from adaserve_backend.serving.errors import ErrorKind
from adaserve_backend.triton import shutdown_probe
from adaserve_backend.triton.engine_loop import TritonEngineLoop
from adaserve_backend.triton.pipeline import BLSPipeline
from adaserve_backend.triton.protocol import response_error
from adaserve_backend.triton.repository import DRAIN_GRACE_ENV
from tests import fake_pb
from tests.engines import make_engine
from tests.model_fixtures import tiny_checkpoint
from tests.unit.test_triton_engine_loop import REPO_MODEL, Detok

FINAL = fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def preprocessing(inputs, decoupled):
    text = inputs["text_input"].reshape(-1)[0].decode()
    return fake_pb.InferenceResponse([fake_pb.Tensor("input_ids",
                                                     np.asarray([3 + ord(c) % 250 for c in text], dtype=np.int32))])


def postprocessing(inputs, decoupled):
    text = Detok().decode(inputs["output_ids"].tolist())
    return fake_pb.InferenceResponse([fake_pb.Tensor("text_output", np.asarray([text.encode()], dtype=object))])


@pytest.fixture
def detokenizer():
    return "scheduler"  # the default; tests of the detokenizer model's path parametrize it


@pytest.fixture
def drain_grace_s():
    return 0.0  # a stopping server ends its requests at once; the drain's test parametrizes it


@pytest.fixture
def served(monkeypatch, detokenizer, drain_grace_s):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve", tokenizer=Detok())
    monkeypatch.setenv(DRAIN_GRACE_ENV, str(drain_grace_s))  # instead of the served engine.json's
    loop = TritonEngineLoop(fake_pb, REPO_MODEL, engine=engine)
    loop.streams = []  # the senders of the scheduler model's requests, as the pipeline made them

    def adaserve(inputs, decoupled):
        req = fake_pb.Request(**inputs)
        req.sender = fake_pb.StreamSender()
        loop.submit(req)
        if "abort_request_id" not in inputs:
            loop.streams.append(req.sender)
        return req.sender

    monkeypatch.setattr(fake_pb, "MODELS",
                        {"preprocessing": preprocessing, "adaserve": adaserve, "postprocessing": postprocessing})
    pipeline = BLSPipeline(fake_pb, detokenizer=detokenizer, drain_grace_s=drain_grace_s)
    yield pipeline, loop
    pipeline.shutdown()
    if not loop.driver.stopping:
        loop.shutdown()


def client(text, max_tokens):
    return fake_pb.Request(text_input=np.asarray([text.encode()], dtype=object),
                           max_tokens=np.asarray([max_tokens], dtype=np.int32),
                           stream=np.asarray([True]))


def texts(req) -> list[str]:
    return [r.tensors()["text_output"][0].decode() for r, _ in req.sender.sent if r is not None and not r.has_error()]


def kv_free(loop, timeout=20) -> bool:
    blocks, deadline = loop.engine.target.blocks, time.monotonic() + timeout
    while blocks.num_free_blocks != blocks.num_blocks or loop.engine.has_work():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("detokenizer", ["scheduler", "postprocessing"])
def test_streams_through_the_pipeline_with_one_final(served, monkeypatch, detokenizer):
    pipeline, loop = served
    calls = []
    monkeypatch.setitem(fake_pb.MODELS, "postprocessing",
                        lambda inputs, decoupled: calls.append(1) or postprocessing(inputs, decoupled))
    req = client("hello", 12)
    pipeline.submit(req)
    assert req.sender.finished.wait(60)
    assert len(texts(req)) > 1 and sum(f == FINAL for _, f in req.sender.sent) == 1
    (stream,) = loop.streams
    ack, flags = stream.sent[0]  # the acceptance ack, empty and not final: frees the BLS call (config.pbtxt)
    assert ack.tensors() == {} and not flags & FINAL
    ids = [int(i) for r, _ in stream.sent[1:] if r is not None for i in r.tensors()["output_ids"]]
    assert "".join(texts(req)) == Detok().decode(ids)  # the same text whichever model rendered it
    assert len(calls) == (len(texts(req)) if detokenizer == "postprocessing" else 0)  # no per-response hop by default
    assert kv_free(loop)


def test_an_unknown_detokenizer_fails_loudly():
    with pytest.raises(ValueError, match="detokenizer must be one of"):
        BLSPipeline(fake_pb, detokenizer="client")


@pytest.mark.parametrize("detokenizer", ["postprocessing"])
@pytest.mark.parametrize("stopping, answer, code, stream_code", [
    # the pipeline aborts it
    (False, "internal error (the server's log has the details)", "INTERNAL", ErrorKind.CANCELLED),
    (True, "the server is shutting down", "UNAVAILABLE", ErrorKind.UNAVAILABLE),  # the scheduler model ends it itself
])
def test_a_failing_postprocessing_ends_the_request_and_frees_its_blocks(served, monkeypatch, stopping,
                                                                        answer, code, stream_code):
    """The scheduler model's stream is ended and read to its end: an abandoned BLS stream keeps both
    models alive, and a stopping server then waits out its exit timeout."""
    pipeline, loop = served
    calls = []
    # The scheduler model checks whether it is still served at most every CHECK_EVERY_S; on a fast machine
    # the tiny model generated all 400 tokens within that, so the stream ended complete, not UNAVAILABLE.
    monkeypatch.setattr(shutdown_probe, "CHECK_EVERY_S", 0.0)
    # The request must still be generating when postprocessing fails. On a starved CPU the pipeline's
    # thread reached its third postprocessing call after the engine had generated all 400 tokens, and the
    # stream then ended complete, rightly. So the engine waits, 100 tokens before the end, until the
    # failure's consequence is in place (the server stopped, or the pipeline's abort arrived). Every step
    # sends its tokens at once (no coalescing) so that waiting never withholds the responses it awaits.
    released, generated = threading.Event(), [0]
    real_step, real_abort = loop.engine.step, loop.engine.abort

    def step():
        if generated[0] >= 300:
            released.wait(60)
        outputs = real_step()
        generated[0] += sum(len(o.new_token_ids) for o in outputs)
        return outputs

    monkeypatch.setattr(loop, "max_hold_ms", 0)
    monkeypatch.setattr(loop.engine, "step", step)
    monkeypatch.setattr(loop.engine, "abort", lambda request_id: (released.set(), real_abort(request_id))[1])

    def failing(inputs, decoupled):
        calls.append(1)
        if len(calls) > 2:
            if stopping:  # as Triton stops: BLS refused, the models no longer ready
                monkeypatch.setattr(fake_pb, "SERVER_READY", False)
                released.set()
            return fake_pb.InferenceResponse(error=fake_pb.TritonError("Server not ready" if stopping
                                                                       else "detokenizer exploded"))
        return postprocessing(inputs, decoupled)

    monkeypatch.setitem(fake_pb.MODELS, "postprocessing", failing)
    req = client("a long story", 400)
    req.inputs["min_tokens"] = np.asarray([400], dtype=np.int32)
    pipeline.submit(req)
    assert req.sender.finished.wait(60)
    resp, flags = req.sender.sent[-1]
    assert resp.has_error() and answer in resp.error().message() and flags == FINAL
    assert resp.error().code() == getattr(fake_pb.TritonError, code)
    (stream,) = loop.streams
    assert stream.finished.wait(10), "the scheduler model's request must end, not run on for nobody"
    assert response_error(stream.sent[-1][0])[0] == stream_code
    assert kv_free(loop)
    with pipeline.idle:
        assert pipeline.idle.wait_for(lambda: pipeline.runs == 0, timeout=10), "the stream was read to its end"


def test_shutdown_answers_every_request_in_flight_at_once(served, monkeypatch):
    pipeline, loop = served
    reqs = [client(f"story {i}", 400) for i in range(3)]
    for r in reqs:  # min_tokens: the tiny model must not reach EOS before the shutdown
        r.inputs["min_tokens"] = np.asarray([400], dtype=np.int32)
        pipeline.submit(r)
    deadline = time.monotonic() + 30
    while not all(r.sender.sent for r in reqs):  # all streaming
        assert time.monotonic() < deadline
        time.sleep(0.02)
    in_flight = [r for r in reqs if not r.sender.finished.is_set()]
    monkeypatch.setattr(fake_pb, "SERVER_READY", False)  # as Triton stops: BLS refused, models not ready
    start = time.monotonic()
    pipeline.shutdown()
    loop.shutdown()
    assert time.monotonic() - start < 5
    assert in_flight
    for r in reqs:
        assert r.sender.finished.is_set() and sum(f == FINAL for _, f in r.sender.sent) == 1
    for r in in_flight:
        assert r.sender.sent[-1][0].has_error() and "shutting down" in r.sender.sent[-1][0].error().message()
    time.sleep(0.3)  # the pipeline's request threads see the engine's own final errors; no second final
    for r in reqs:
        assert sum(f == FINAL for _, f in r.sender.sent) == 1


def test_a_stopping_server_is_noticed_before_finalize(served, monkeypatch):
    """Triton finalizes a model only once its requests are released (a final response each): both
    models must notice the shutdown themselves, or the server waits out its 30 s exit timeout."""
    pipeline, loop = served
    reqs = [client(f"story {i}", 400) for i in range(2)]
    for r in reqs:
        pipeline.submit(r)
    deadline = time.monotonic() + 30
    while not all(r.sender.sent for r in reqs):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    in_flight = [r for r in reqs if not r.sender.finished.is_set()]
    monkeypatch.setattr(fake_pb, "SERVER_READY", False)  # no shutdown() / finalize call below
    for r in in_flight:
        assert r.sender.finished.wait(3), "the client was not answered"
        assert "shutting down" in r.sender.sent[-1][0].error().message()
    for stream in loop.streams:  # the scheduler model released its requests too
        assert stream.finished.wait(3) and "shutting down" in response_error(stream.sent[-1][0])[1]
    loop.driver.thread.join(3)
    assert in_flight and not loop.driver.thread.is_alive() and kv_free(loop)


@pytest.mark.parametrize("drain_grace_s", [2.0])
def test_a_stopping_server_lets_requests_finish_within_the_drain_and_ends_the_rest_after_it(served, monkeypatch,
                                                                                         drain_grace_s):
    """The drain (config/drain.py): once the server stops, a request that finishes within the grace ends
    normally, one that cannot is ended with "shutting down" when the grace runs out, not before."""
    pipeline, loop = served
    real_step = loop.engine.step  # paced, so that the short request needs a while but well under the grace
    monkeypatch.setattr(loop.engine, "step", lambda: (time.sleep(0.1), real_step())[1])
    short, long = client("a short story", 12), client("a long story", 400)
    for r in (short, long):
        r.inputs["min_tokens"] = r.inputs["max_tokens"]  # no early EOS from the tiny model
        pipeline.submit(r)
    deadline = time.monotonic() + 30
    while not (short.sender.sent and long.sender.sent):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not short.sender.finished.is_set(), "the short request must still be generating at the stop"
    stopped = time.monotonic()
    monkeypatch.setattr(fake_pb, "SERVER_READY", False)  # as Triton stops: BLS refused, models not ready
    assert short.sender.finished.wait(drain_grace_s)
    assert not short.sender.sent[-1][0].has_error(), short.sender.sent[-1][0].error().message()
    assert long.sender.finished.wait(drain_grace_s + 3)
    ended_after = time.monotonic() - stopped
    assert long.sender.sent[-1][0].has_error(), (len(long.sender.sent), ended_after)
    assert "shutting down" in long.sender.sent[-1][0].error().message()
    assert drain_grace_s <= ended_after < drain_grace_s + 3, ended_after
    loop.driver.thread.join(3)
    assert not loop.driver.thread.is_alive() and kv_free(loop)


def test_a_client_is_answered_only_after_its_scheduler_stream_ended(served, monkeypatch):
    """Triton unloads the front model once its client requests are answered, without waiting for the
    BLS streams they opened; on 2.51 a response that arrives on such a stream afterwards hangs the
    scheduler model's unload or aborts the server (see pipeline.py). So the client's final response
    comes after the scheduler model's own, even when the scheduler is slow to notice the shutdown."""
    pipeline, loop = served
    real_step = loop.engine.step  # slowed down: on a fast machine all 400 tokens came before the stop was noticed
    monkeypatch.setattr(loop.engine, "step", lambda: (time.sleep(0.02), real_step())[1])
    req = client("a long story", 400)
    req.inputs["min_tokens"] = np.asarray([400], dtype=np.int32)
    pipeline.submit(req)
    deadline = time.monotonic() + 30
    while not req.sender.sent:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (stream,) = loop.streams
    stream_ended_first = []
    send = req.sender.send

    def recording_send(response=None, flags=0):
        if flags & FINAL:
            stream_ended_first.append(stream.finished.is_set())
        send(response, flags)

    monkeypatch.setattr(req.sender, "send", recording_send)
    stopped_at, notice = [float("inf")], loop.shutdown_probe.stopping  # a step of a real model takes a while
    monkeypatch.setattr(loop.shutdown_probe, "stopping",
                        lambda fresh=False: time.monotonic() > stopped_at[0] + 0.5 and notice(fresh))
    stopped_at[0] = time.monotonic()
    monkeypatch.setattr(fake_pb, "SERVER_READY", False)
    assert req.sender.finished.wait(10)
    assert stream_ended_first == [True]
    assert "shutting down" in req.sender.sent[-1][0].error().message()


def test_bad_input_keeps_its_invalid_arg_code_through_the_pipeline(served, monkeypatch):
    pipeline, loop = served
    req = client("hello", 0)  # the scheduler model refuses max_tokens 0
    pipeline.submit(req)
    assert req.sender.finished.wait(30)
    (resp, flags), = req.sender.sent
    assert resp.error().code() == fake_pb.TritonError.INVALID_ARG and flags == FINAL
    assert "max_tokens" in resp.error().message()
    monkeypatch.setitem(fake_pb.MODELS, "preprocessing", lambda inputs, decoupled: fake_pb.InferenceResponse(
        error=fake_pb.TritonError("text_input must hold exactly one string, got 2", fake_pb.TritonError.INVALID_ARG)))
    req = client("hello", 4)
    pipeline.submit(req)
    assert req.sender.finished.wait(30)
    assert req.sender.sent[-1][0].error().code() == fake_pb.TritonError.INVALID_ARG


def test_token_ids_go_through_the_ensemble_as_they_are_and_logprobs_come_back(served, monkeypatch):
    """input_ids instead of text_input: `preprocessing` is not called, the scheduler gets the ids; with
    `logprobs` the pass-through outputs carry one per token; both prompt forms at once is a 400."""
    pipeline, loop = served
    monkeypatch.setitem(fake_pb.MODELS, "preprocessing", lambda inputs, decoupled: pytest.fail("tokenized ids"))
    req = fake_pb.Request(input_ids=np.asarray([5, 6, 7], dtype=np.int32), max_tokens=np.asarray([6], dtype=np.int32),
                          min_tokens=np.asarray([6], dtype=np.int32), logprobs=np.asarray([1], dtype=np.int32))
    pipeline.submit(req)
    assert req.sender.finished.wait(60)
    sent = [r.tensors() for r, _ in req.sender.sent if r is not None and not r.has_error()]
    assert sum(len(t.get("output_log_probs", [])) for t in sent) == 6
    both = fake_pb.Request(input_ids=np.asarray([5], dtype=np.int32),
                           text_input=np.asarray([b"hi"], dtype=object), max_tokens=np.asarray([2], dtype=np.int32))
    pipeline.submit(both)
    assert both.sender.finished.wait(60)
    (resp, _), = both.sender.sent
    assert resp.has_error() and "exactly one" in resp.error().message()
    assert kv_free(loop)
