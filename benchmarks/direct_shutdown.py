"""tritonserver run on its own (as `docker stop` or Kubernetes meet it: no `make serve`, no frontend)
stopped by SIGTERM to its pid while N gRPC streams are generating: when each stream got its final
answer, and whether and when the process exited. With --close each client closes its stream once its
request has ended; without, the clients hold their streams open, as a client that multiplexes
requests over one stream does.

    python -m benchmarks.direct_shutdown --streams 4 [--close] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import time
from pathlib import Path

import numpy as np

from adaserve_backend.triton.grpc_client import ensemble_tensors, infer_inputs
from adaserve_backend.triton.launch import triton_server
from harness.run_dir import run_dir
from harness.servers import free_ports

WATCH_S = 40.0  # how long after the signal the run watches for answers and the exit


def is_final(result, error) -> bool:
    return error is not None or result.get_response().parameters["triton_final_response"].bool_param


def one_run(streams: int, close: bool, out: Path) -> dict:
    import tritonclient.grpc as grpcclient

    http, grpc, metrics = free_ports(3)
    server = triton_server(http, grpc, metrics, out / f"tritonserver-{int(time.time())}.log")
    server.start(timeout_s=600)
    clients, events = [], []
    try:
        for i in range(streams):
            client, q = grpcclient.InferenceServerClient(f"localhost:{grpc}"), queue.Queue()
            client.start_stream(callback=(lambda q: lambda result, error: q.put((result, error, time.monotonic())))(q))
            tensors = ensemble_tensors(f"Tell me a very long story about dragon number {i}.", 1500, chat=True,
                                       extra={"min_tokens": np.array([1500], dtype=np.int32)})  # no early EOS
            client.async_stream_infer("ensemble", infer_inputs(grpcclient, tensors), enable_empty_final_response=True)
            clients.append(client)
            events.append(q)
        for q in events:  # every stream is generating
            _, error, _ = q.get(timeout=300)
            assert error is None, error
        stopped = time.monotonic()
        os.kill(server.proc.pid, signal.SIGTERM)
        answers: list = [None] * streams
        while time.monotonic() < stopped + WATCH_S and (None in answers or server.proc.poll() is None):
            for i, q in enumerate(events):
                while answers[i] is None and not q.empty():
                    result, error, at = q.get()
                    if is_final(result, error):
                        answers[i] = {"s": round(at - stopped, 2), "error": str(error)[:80] if error else None}
                        if close:
                            clients[i].stop_stream()
            time.sleep(0.05)
        code = server.proc.poll()
        return {"streams": streams, "close": close, "answers": answers, "exit_code": code,
                "exited_s": round(time.monotonic() - stopped, 2) if code is not None else None}
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
    ap.add_argument("--out", default=run_dir("direct-shutdown"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in range(args.runs):
        runs.append(one_run(args.streams, args.close, out))
        r = runs[-1]
        answered = [a["s"] for a in r["answers"] if a]
        print(f"run {k + 1}/{args.runs}: {len(answered)}/{args.streams} streams answered "
              f"(last after {max(answered, default=float('nan')):.2f} s), "
              + (f"exited after {r['exited_s']} s" if r["exited_s"] is not None else f"alive after {WATCH_S:.0f} s"),
              flush=True)
    path = out / f"direct_shutdown-{args.streams}-{'closed' if args.close else 'held'}.json"
    path.write_text(json.dumps(runs, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
