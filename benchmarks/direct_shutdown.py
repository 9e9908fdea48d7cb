"""tritonserver run on its own (as `docker stop` or Kubernetes meet it: no `make serve`, no frontend)
stopped by SIGTERM to its pid while N gRPC streams are generating: when each stream got its final
answer, and whether and when the process exited. With --close each client closes its stream once its
request has ended; without, the clients hold their streams open, as a client that multiplexes
requests over one stream does.

The drain (engine.json's drain.grace_s, or --grace): --short K makes K of the streams short enough to
finish within the grace; each run also records what a request sent after the signal got, and the
server's readiness then.

    python -m benchmarks.direct_shutdown --streams 4 [--close] [--runs 5] [--grace 0] [--short 1]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from adaserve_backend.triton.grpc_client import ensemble_tensors, infer_inputs
from adaserve_backend.triton.launch import triton_server
from harness.run_dir import run_dir
from harness.servers import free_ports

WATCH_S = 40.0  # how long after the signal the run watches for answers and the exit
LONG_TOKENS = 1500  # a stream that outlasts any grace here
SHORT_TOKENS = 12  # a stream that finishes within a grace of a few seconds, even on 2 busy cores


def is_final(result, error) -> bool:
    return error is not None or result.get_response().parameters["triton_final_response"].bool_param


def http_status(url: str) -> int | str:
    """The status, or why there is none."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return f"no answer: {e}"


def open_stream(grpcclient, url: str, i: int, tokens: int):
    client, q = grpcclient.InferenceServerClient(url), queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error, time.monotonic())))
    tensors = ensemble_tensors(f"Tell me a very long story about dragon number {i}.", tokens, chat=True,
                               extra={"min_tokens": np.array([tokens], dtype=np.int32)})  # no early EOS
    client.async_stream_infer("ensemble", infer_inputs(grpcclient, tensors), enable_empty_final_response=True)
    return client, q


def one_run(streams: int, close: bool, out: Path, grace_s: float | None = None, short: int = 0) -> dict:
    """`grace_s`: the server's drain grace (None: engine.json's); the last `short` streams ask for
    SHORT_TOKENS, the others for LONG_TOKENS."""
    import tritonclient.grpc as grpcclient

    http, grpc, metrics = free_ports(3)
    server = triton_server(http, grpc, metrics, out / f"tritonserver-{int(time.time())}.log", drain_grace_s=grace_s)
    server.start(timeout_s=600)
    clients, events = [], []
    try:
        for i in range(streams):
            client, q = open_stream(grpcclient, f"localhost:{grpc}", i,
                                    SHORT_TOKENS if i >= streams - short else LONG_TOKENS)
            clients.append(client)
            events.append(q)
        for q in events:  # every stream is generating
            _, error, _ = q.get(timeout=300)
            assert error is None, error
        stopped = time.monotonic()
        os.kill(server.proc.pid, signal.SIGTERM)
        time.sleep(0.2)  # Triton marks itself not ready as it takes the signal
        ready = http_status(f"http://localhost:{http}/v2/health/ready")
        late, late_q = open_stream(grpcclient, f"localhost:{grpc}", streams, SHORT_TOKENS)
        clients.append(late)
        try:
            _, late_error, _ = late_q.get(timeout=3)
            refused = str(late_error)[:120] if late_error is not None else "accepted"
        except queue.Empty:
            refused = "no answer"
        late.stop_stream()  # a probe: an open stream of its own would hold the server (see the module docstring)
        answers: list = [None] * streams
        after = [0] * streams  # responses each stream got after the signal (it kept generating)
        while time.monotonic() < stopped + WATCH_S and (None in answers or server.proc.poll() is None):
            for i, q in enumerate(events):
                while answers[i] is None and not q.empty():
                    result, error, at = q.get()
                    after[i] += at > stopped
                    if is_final(result, error):
                        answers[i] = {"s": round(at - stopped, 2), "error": str(error)[:80] if error else None,
                                      "short": i >= streams - short, "responses_after_signal": after[i]}
                        if close:
                            clients[i].stop_stream()
            time.sleep(0.05)
        code = server.proc.poll()
        return {"streams": streams, "close": close, "grace_s": grace_s, "answers": answers, "exit_code": code,
                "exited_s": round(time.monotonic() - stopped, 2) if code is not None else None,
                "ready_after_signal": ready, "request_after_signal": refused}
    finally:
        for client in clients:
            try:
                client.stop_stream()
                client.close()
            except Exception:
                pass
        server.stop(grace_s=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--close", action="store_true", help="clients close their streams once answered")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--grace", type=float, help="the server's drain grace in s (default: engine.json's)")
    ap.add_argument("--short", type=int, default=0, help=f"streams asking for {SHORT_TOKENS} tokens only")
    ap.add_argument("--out", default=run_dir("direct-shutdown"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(args.runs):
        runs.append(one_run(args.streams, args.close, out, args.grace, args.short))
        r = runs[-1]
        answered = [a["s"] for a in r["answers"] if a]
        completed = sum(1 for a in r["answers"] if a and a["error"] is None)
        print(f"run {k + 1}/{args.runs}: {len(answered)}/{args.streams} streams answered, {completed} completed "
              f"(last after {max(answered, default=float('nan')):.2f} s), "
              + (f"exited after {r['exited_s']} s" if r["exited_s"] is not None else f"alive after {WATCH_S:.0f} s")
              + f"; ready after the signal: {r['ready_after_signal']}, a new request: {r['request_after_signal']}",
              flush=True)
    path = out / f"direct_shutdown-{args.streams}-{'closed' if args.close else 'held'}.json"
    path.write_text(json.dumps(runs, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
