"""Where a served request's time to first token goes, per Triton model called: from the client's send
to the scheduler's arrival stamp (the serving path in front of the scheduler), from there to the
scheduler's first token (queueing, prefill), and from there to the client (the response path).

    python -m benchmarks.ttft_path --rps 16 --duration 40 --models ensemble adaserve

Replays the vs-peers workload (same generator, prompts, targets) against one tritonserver, one model
after the other, with `return_perf_metrics` so each stream carries the scheduler's `arrival_time_ns`
and `first_token_time_ns` (wall clock; client and server must share one clock, i.e. run on the same
machine). Prints p50 / p90 / p99 of each leg in ms and writes OUT.json. What it found: through the
ensemble, both legs outside the scheduler took far longer than straight to the scheduler model,
because each BLS call to the scheduler held one of the Python backend's shared threads (32 by
default) until its first token, and the same threads carry every response the pipeline streams; the
scheduler's acceptance ack (`accept_ack`) frees the thread at once (evidence:
docs/experiments.md#ttft-path, docs/experiments.md#ack).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from adaserve_backend.triton.grpc_client import EnsembleClient
from adaserve_backend.triton.launch import triton_server
from benchmarks.vs_peers_levels import arrivals_for, render_chat
from harness.run_dir import run_dir
from harness.slo_targets import SloTargets
from harness.workload import build_workload

LEGS = {"in": ("send", "arrival"), "scheduler": ("arrival", "first_token"), "out": ("first_token", "received"),
        "ttft": ("send", "received")}


async def replay(url: str, model: str, items) -> list[dict]:
    client = EnsembleClient(url, model)
    start, records = time.monotonic(), []

    async def one(item) -> None:
        await asyncio.sleep(max(0.0, start + item.arrival_s - time.monotonic()))
        rec = {"category": item.category, "send": time.time_ns()}
        extra = {"ttft_slo_ms": np.array([item.ttft_slo_ms], dtype=np.float32),
                 "min_tokens": np.array([item.max_tokens], dtype=np.int32), "return_perf_metrics": np.array([True])}
        try:
            async for text, out in client.stream(item.prompt, item.max_tokens, tpot_slo_ms=item.tpot_slo_ms,
                                                 chat=item.chat, extra=extra):
                if text and "received" not in rec:
                    rec.update(received=time.time_ns(), arrival=int(out["arrival_time_ns"]),
                               first_token=int(out["first_token_time_ns"]))
        except Exception as e:  # rejections: counted, not timed
            rec["error"] = str(e)[:120]
        records.append(rec)

    try:
        await asyncio.gather(*(one(i) for i in items))
    finally:
        await client.close()
    return records


def legs(records: list[dict]) -> dict[str, dict[str, float]]:
    timed = [r for r in records if "received" in r]
    out = {}
    for name, (a, b) in LEGS.items():
        ms = [(r[b] - r[a]) / 1e6 for r in timed]
        if len(ms) >= 2:
            q = statistics.quantiles(ms, n=100)
            out[name] = {"p50": q[49], "p90": q[89], "p99": q[98]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rps", type=float, default=16.0)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--models", nargs="+", default=["ensemble", "adaserve"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(run_dir("ttft-path"), "ttft-path"))
    ap.add_argument("--ports", type=int, nargs=3, default=[18010, 18011, 18012], metavar=("HTTP", "GRPC", "METRICS"))
    args = ap.parse_args()
    items = render_chat(build_workload(arrivals_for("poisson", args.rps,
                                                    round(args.rps * args.duration), args.seed), SloTargets(),
                                       seed=args.seed, output_scale=0.5))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    server = triton_server(*args.ports, out.with_suffix(".tritonserver.log")).start()
    results = {}
    try:
        for model in args.models:
            records = asyncio.run(replay(f"localhost:{args.ports[1]}", model, items))
            results[model] = {"served": sum("received" in r for r in records),
                              "errors": sum("error" in r for r in records),
                              "legs_ms": legs(records)}
            print(f"{model} @ {args.rps:g} rps: {results[model]['served']} timed, {results[model]['errors']} errors")
            for name, q in results[model]["legs_ms"].items():
                print(f"  {name:9} p50 {q['p50']:7.0f}  p90 {q['p90']:7.0f}  p99 {q['p99']:7.0f} ms")
            time.sleep(5)  # let the last streams end before the next model's load
    finally:
        server.stop()
    out.with_suffix(".json").write_text(json.dumps({"rps": args.rps, "duration_s": args.duration,
                                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
