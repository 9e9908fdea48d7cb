"""Stopping a real tritonserver while a stream is generating (issue 13, bug 7): the client gets a final
answer from the server, not a dropped connection, and the server exits within seconds rather than
waiting out Triton's 30 s exit timeout. A server of its own: the shared one must keep serving.

The servers here run with a drain grace of 0 (every request ended at once), but for the drain's own
test: a grace lets what fits it finish and ends the rest when it runs out (config/drain.py)."""

from __future__ import annotations

import os
import queue
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from adaserve_backend.triton.launch import triton_server as triton_server_process
from tests.integration.conftest import build_inputs, free_ports

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 10.0  # Triton's own exit timeout is 30 s; our models finalize in a few seconds


def refused(answer: str) -> bool:
    """A request sent after the signal was answered with an error (Triton refuses a model that is
    unloading: "has no available versions"; or the pipeline's "shutting down" when a model it calls
    refuses it)."""
    return answer not in ("accepted", "no answer")


def is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_stopping_the_server_ends_a_running_stream_and_exits_within_seconds(tmp_path):
    """SIGTERM to tritonserver alone, as a service manager or `docker stop` does (a SIGTERM to the whole
    process group, as ServerProcess.stop sends, behaved the same when tried)."""
    http, grpc, metrics = free_ports(3)
    process = triton_server_process(http, grpc, metrics, tmp_path / "server.log", drain_grace_s=0)
    process.start(timeout_s=600)
    client = grpcclient.InferenceServerClient(f"localhost:{grpc}")
    try:
        events: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        inputs = build_inputs(grpcclient, "Tell me a very long story about a dragon.", 1500, stream=True, chat=True,
                              extra={"min_tokens": np.array([1500], dtype=np.int32)})  # no early EOS
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        result, error = events.get(timeout=300)
        assert error is None and not is_final(result), "the stream should be generating"

        stopped = time.monotonic()
        os.kill(process.proc.pid, signal.SIGTERM)
        while error is None and not is_final(result):
            result, error = events.get(timeout=EXIT_WITHIN_S)
        answered = time.monotonic() - stopped
        assert answered < EXIT_WITHIN_S and error is not None, f"{error} after {answered:.1f} s"
        assert "shutting down" in str(error), error
        # A client closes a stream that has ended. Triton's gRPC server waits for every open stream,
        # idle or not, until its exit timeout: that one is the client's to close, not the models'.
        client.stop_stream()
        process.proc.wait(timeout=EXIT_WITHIN_S)
        log = process.log_tail(6000)
        # No request held a model: the pipeline's streams all ended before Triton waited for in-flight
        # inferences. (Unloading the four models may still outlast Triton's 5 s exit timeout on a starved
        # CPU, e.g. beside two CPU burners; it then exits at once, in time, which the waits above check.)
        assert "Found 0 model versions that have in-flight inferences" in log and "still reading" not in log, log
        assert all(f"successfully unloaded '{m}'" in log for m in ("ensemble", "adaserve")), log
    finally:
        try:
            client.stop_stream()
            client.close()
        finally:
            process.stop(grace_s=5)


@pytest.mark.parametrize("streams, sig", [(0, signal.SIGINT), (3, signal.SIGTERM)])
def test_make_serve_stops_in_seconds_idle_or_with_streams_held_open(tmp_path, streams, sig):
    """`make serve` as a user runs it (tritonserver and the OpenAI frontend), stopped by Ctrl-C idle,
    or by SIGTERM while clients hold streams open without reading: every process exits, every port is
    free, and each stream ended with a final answer ("shutting down" or its completion), in seconds
    (the frontend stops tritonserver first, so the models end their requests)."""
    from benchmarks.shutdown_time import one_run

    r = one_run(streams, sig, str(tmp_path), drain_grace_s=0)
    assert r["orphans"] == 0 and not r["ports_held"], r
    assert r["seconds"] < EXIT_WITHIN_S, r
    for tail in r["stream_tails"]:
        assert tail and tail[-1] == "data: [DONE]" or "shutting down" in " ".join(tail), r


@pytest.mark.parametrize("after_s", [3.0, 12.0])
def test_make_serve_stops_in_seconds_when_signalled_during_startup(tmp_path, after_s):
    """SIGTERM while the server is still starting (early: tritonserver launching; later: the models
    loading and measuring the machine): every process exits and every port is free, in seconds."""
    from benchmarks.shutdown_time import one_run

    r = one_run(0, signal.SIGTERM, str(tmp_path), during_startup_s=after_s)
    assert r["orphans"] == 0 and not r["ports_held"], r
    assert r["seconds"] < EXIT_WITHIN_S, r


def test_tritonserver_alone_exits_in_seconds_with_streams_held_open(tmp_path):
    """tritonserver alone (no frontend, as the Docker image and Kubernetes run it), SIGTERM while four
    clients hold their generating streams open and never close them, five times in a row: every stream
    gets its final "shutting down" answer and the process exits within 5 s (the exit watchdog ends a
    server that Triton's gRPC shutdown would keep waiting on its clients)."""
    from benchmarks.direct_shutdown import one_run

    for k in range(5):
        r = one_run(4, close=False, out=tmp_path, grace_s=0)
        answered = [a for a in r["answers"] if a]
        assert len(answered) == 4 and all("shutting down" in (a["error"] or "") for a in answered), (k, r)
        assert r["exited_s"] is not None and r["exited_s"] <= 5.0, (k, r)
        assert r["ready_after_signal"] != 200 and refused(r["request_after_signal"]), (k, r)


def test_tritonserver_alone_drains_what_fits_the_grace_and_ends_the_rest_with_streams_held_open(tmp_path):
    """The drain, as `docker stop` meets it: SIGTERM with three long streams and one short one held
    open. Readiness drops (Triton's HTTP endpoint stops listening) and a new request is refused at
    once; the short stream completes normally within the grace; the long ones that cannot end with
    "shutting down" once the grace has run out, not before; and the process is gone by the grace plus the exit
    watchdog's margin. Timing-bound: the short stream must finish within the grace on a busy CPU."""
    from adaserve_backend.triton.exit_watchdog import EXIT_MARGIN_S
    from benchmarks.direct_shutdown import one_run

    grace_s = 5.0  # the default
    r = one_run(4, close=False, out=tmp_path, grace_s=grace_s, short=1)
    assert r["ready_after_signal"] != 200 and refused(r["request_after_signal"]), r
    assert all(r["answers"]), r
    (short,) = [a for a in r["answers"] if a["short"]]
    assert short["error"] is None and 0 <= short["s"] <= grace_s, r  # 0: it ended before the signal
    long = [a for a in r["answers"] if not a["short"]]  # the first ones may have run long enough to finish
    for a in long:  # the grace counts from when the scheduler model sees the stop: a look and a step later
        completed = a["error"] is None and a["s"] <= grace_s + 1.5
        assert completed or ("shutting down" in (a["error"] or "") and grace_s <= a["s"] <= grace_s + 1.5), r
    assert any(a["error"] for a in long), r
    # the watchdog counts from when the scheduler model sees the stop: a step later on a starved CPU
    assert r["exited_s"] is not None and r["exited_s"] <= grace_s + EXIT_MARGIN_S + 2.0, r


def test_tritonserver_alone_exits_in_seconds_when_a_finished_stream_is_held_open(tmp_path):
    """A client that keeps its stream open after its request has ended holds a stopping tritonserver
    too (Triton's gRPC stream state keeps the ensemble live), while the scheduler model has no work to
    notice the stop with: it looks while idle as well, once it has served a request."""
    from adaserve_backend.triton.exit_watchdog import EXIT_MARGIN_S
    from benchmarks.direct_shutdown import open_stream

    http, grpc, metrics = free_ports(3)
    process = triton_server_process(http, grpc, metrics, tmp_path / "server.log", drain_grace_s=0)
    process.start(timeout_s=600)
    client = None
    try:
        client, events = open_stream(grpcclient, f"localhost:{grpc}", 0, 8)
        result, error, _ = events.get(timeout=300)
        while error is None and not is_final(result):
            result, error, _ = events.get(timeout=60)
        assert error is None, error
        time.sleep(1)  # idle, the stream still open
        stopped = time.monotonic()
        os.kill(process.proc.pid, signal.SIGTERM)
        process.proc.wait(timeout=EXIT_WITHIN_S)
        assert time.monotonic() - stopped <= EXIT_MARGIN_S + 1.5
    finally:
        try:
            if client is not None:
                client.stop_stream()
                client.close()
        finally:
            process.stop(grace_s=5)
