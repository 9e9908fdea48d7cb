"""How long `make serve` takes to stop: start it, optionally open streams whose clients keep them open
(reading slowly, never closing), send SIGTERM (or SIGINT), and time until every process of the server
(tritonserver, its stubs, the frontend) has exited and every port is free again; what each stream
received last is reported (its completion, or a final error such as "shutting down"). Each run also
reports how long the server took from its start until the OpenAI port accepted connections (`ready_s`).

    python -m benchmarks.shutdown_time --runs 3 --streams 4
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

from adaserve_backend import PROJECT_ROOT
from harness.servers import free_ports


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    children: dict[int, list[int]] = {}
    for child, parent in zip(out[::2], out[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return state[:1] not in ("Z", "")  # "": reaped between the two looks


def open_stream(port: int) -> socket.socket:
    """A streaming completion whose client then reads nothing more and keeps the connection open."""
    # generous: the first requests after startup warm the server up, slowly on a loaded machine
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "adaserve", "prompt": "Tell me a very long story.", "max_tokens": 400, "stream": True,
            "ignore_eos": True, "temperature": 0}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.fp.readline()  # the first event: the request is in flight
    return conn


def one_run(streams: int, sig: int, log_dir: str, during_startup_s: float | None = None,
            drain_grace_s: float | None = None) -> dict:
    """`during_startup_s`: send the signal that long after the start, ready or not (no streams then);
    `drain_grace_s`: make serve's --drain-grace-s (None: engine.json's)."""
    http_port, grpc_port, metrics_port, openai_port = free_ports(4)
    log = open(os.path.join(log_dir, f"serve-{http_port}.log"), "w")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "adaserve_backend.serve", "--http-port",
                             str(http_port), "--grpc-port",
                             str(grpc_port), "--metrics-port", str(metrics_port), "--openai-port", str(openai_port),
                             "--log", os.path.join(log_dir, f"triton-{http_port}.log"),
                             *(["--drain-grace-s", str(drain_grace_s)] if drain_grace_s is not None else [])],
                            cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + (during_startup_s if during_startup_s is not None else 600)
    while during_startup_s is not None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    while during_startup_s is None and not port_open(openai_port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"make serve did not start; see {log.name}")
        time.sleep(0.5)
    ready_s = round(time.monotonic() - started, 1) if during_startup_s is None else None
    conns = [open_stream(openai_port) for _ in range(streams if during_startup_s is None else 0)]
    family = descendants(proc.pid) | {proc.pid}
    t0 = time.monotonic()
    proc.send_signal(sig)
    ports = (http_port, grpc_port, metrics_port, openai_port)
    while any(alive(p) for p in family) or any(port_open(p) for p in ports):
        if time.monotonic() - t0 > 120:
            break
        time.sleep(0.05)
    seconds = time.monotonic() - t0
    last = []
    for c in conns:
        try:
            tail = c.sock.recv(1 << 20).decode(errors="replace") if c.sock else ""
        except OSError:
            tail = ""
        last.append([line for line in tail.splitlines() if line.startswith("data:")][-2:] if tail else [])
        c.close()
    orphans = [p for p in family if alive(p)]
    for p in orphans:
        with contextlib.suppress(ProcessLookupError):  # it may end between the look and the kill
            os.kill(p, signal.SIGKILL)
    try:  # a leader shown as a zombie can still be ending its threads, so poll() may not reap it yet
        exit_code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        exit_code = None
    return {"seconds": round(seconds, 2), "ready_s": ready_s, "exit_code": exit_code, "orphans": len(orphans),
            "ports_held": [p for p in ports if port_open(p)], "stream_tails": last}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4, help="streams in flight when the signal comes (0: idle)")
    ap.add_argument("--signal", choices=["TERM", "INT"], default="TERM")
    ap.add_argument("--during-startup", type=float, metavar="S", help="signal S seconds after the start, ready or not")
    ap.add_argument("--drain-grace-s", type=float, help="make serve's drain grace (default: engine.json's)")
    ap.add_argument("--log-dir", default="runs/shutdown")
    args = ap.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    runs = []
    for i in range(args.runs):
        r = one_run(args.streams, getattr(signal, "SIG" + args.signal), args.log_dir, args.during_startup,
                    args.drain_grace_s)
        runs.append(r)
        print(f"run {i + 1}/{args.runs}: ready in {r['ready_s']} s, stopped in {r['seconds']:.2f} s, "
              f"exit {r['exit_code']}, "
              f"orphans {r['orphans']}, ports held {r['ports_held']}", flush=True)
    s = [r["seconds"] for r in runs]
    print(json.dumps({"streams": args.streams, "signal": args.signal, "median_s": statistics.median(s), "max_s": max(s),
                      "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
