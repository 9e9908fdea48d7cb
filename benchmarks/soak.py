"""A soak of the served stack (issue 71): tritonserver and the OpenAI frontend as `make serve` runs them,
under mixed-SLO load near capacity for half an hour, with the clients real traffic has: 30% of streams
cancelled mid-stream, some dropped without a clean close, hostile requests sprinkled in.

    python -m benchmarks.soak [--duration-min 30] [--rps 12]      # or: make soak DURATION_MIN=30

Load: Poisson arrivals at `--rps`, the benchmark's coding/chat/summary classes (60/20/20) sent as the
served SLO classes (`slo_class`), greedy, ending at end of sequence (`max_tokens` a cap), prompts
never sent twice (benchmarks/soak_plan.py), coding to /v1/completions and the chat-shaped classes
to /v1/chat/completions. Each request runs on its own connection at its arrival time whatever the
server's pace (open loop). Clients: benchmarks/soak_clients.py; hostile cases: soak_hostile.py.

Reports and judges (benchmarks/soak_judge.py): hangs (no byte for `--hang-s`, or a stream that ended
without its final event), KV blocks in use once the load has stopped and the server drained, memory
growth of tritonserver and its Python stubs (sampled every `--sample-s`) from the end of the first
window to the end, TTFT p99 of completed, uncancelled requests in the first and the last window (5
minutes; a fifth of the run for short runs, `--window-min`), and hostile requests that got anything
but a clear 4xx. PASS/FAIL per target; runs/<date>-soak/soak.{json,png}, server logs beside them;
exit status 1 if any target failed. The servers are always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
from tqdm import tqdm

from harness.machine import cpu_model
from harness.run_dir import run_dir
from harness.servers import free_ports, openai_frontend, triton_server
from harness.workload import PromptsExhausted, builtin_prompts

from .soak_clients import run_load
from .soak_judge import growth_by_process, judge, outcome_counts, soak_stats, ttft_timeline, window_s
from .soak_plan import FramedDeck, Shares, build_plan
from .soak_records import DONE, HOSTILE, REFUSED, ServerSample, SoakRecord
from .soak_report import plot, print_verdicts, problems, write_json
from .soak_sampler import drain, sample

MODEL = "adaserve"
# Near capacity, not past it: the highest Poisson level at which the served stack (same classes,
# EOS-ended, output scale 0.5, prompts never repeated) still attained every SLO in the last sweep on
# the 2-core machine, one level below where refusals start (docs/experiments.md#yardstick-inflation).
# Past capacity refusals dominate and the TTFT p99 is the admission deadline by construction.
DEFAULT_RPS = 12.0
RPS_WHY = ("the default: the highest Poisson level at which the served stack attained every SLO in the last "
           "sweep with this workload (docs/experiments.md#yardstick-inflation), near capacity and not past it")
DEFAULT_OUTPUT_SCALE = 0.5  # that sweep's (benchmarks/vs_peers.py's default)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-min", type=float, default=30.0, help="minutes of load")
    ap.add_argument("--rps", type=float, default=DEFAULT_RPS, help="arrivals per second, hostile ones included")
    ap.add_argument("--window-min", type=float, help="the first/last window (default 5, a fifth of a short run)")
    ap.add_argument("--hang-s", type=float, default=60.0, help="no byte for this long: the request hung")
    ap.add_argument("--drain-s", type=float, default=120.0, help="how long the server may take to drain")
    ap.add_argument("--sample-s", type=float, default=30.0,
                    help="memory sampling period (at most a third of the window)")
    ap.add_argument("--cancel-share", type=float, default=0.3, help="streams the client closes mid-stream")
    ap.add_argument("--disconnect-share", type=float, default=0.1, help="streams whose socket is dropped mid-stream")
    ap.add_argument("--hostile-share", type=float, default=0.02, help="arrivals that are hostile requests")
    ap.add_argument("--output-scale", type=float, default=DEFAULT_OUTPUT_SCALE, help="scales the classes' max_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=run_dir("soak"))
    args = ap.parse_args(argv)
    args.duration_s = args.duration_min * 60
    try:
        args.window_s = window_s(args.duration_s, None if args.window_min is None else args.window_min * 60)
        args.shares = Shares(args.cancel_share, args.disconnect_share, args.hostile_share)
    except ValueError as e:
        ap.error(str(e))
    args.sample_s = min(args.sample_s, args.window_s / 3)
    for name in ("rps", "hang_s", "drain_s", "sample_s", "output_scale"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    return args


async def warm_up(base_url: str) -> None:
    """Two short requests, unjudged: first-call costs stay out of the first window."""
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            body = {"model": MODEL, "prompt": f"Warm-up {i}: hello, who are you?", "max_tokens": 8}
            async with session.post(base_url + "/v1/completions", json=body) as resp:
                await resp.read()


async def soak(args, plan, base_url: str, triton_pid: int, frontend_pid: int,
               metrics_url: str) -> tuple[list[SoakRecord], list[ServerSample], float]:
    """The load, memory samples every `sample_s`, and a progress line every second."""
    samples: list[ServerSample] = []
    tally: Counter = Counter()
    open_now = [0]
    t0 = time.monotonic()

    def on_record(rec: SoakRecord) -> None:
        tally["ended"] += 1
        tally["hangs"] += rec.hung
        tally["refused"] += rec.outcome == REFUSED
        tally["done"] += rec.outcome == DONE

    async def watch(load: asyncio.Task) -> None:
        bar = tqdm(total=round(args.duration_s), desc="soak", bar_format="{l_bar}{bar}| {n}/{total} s {postfix}")
        next_sample = 0.0
        while not load.done():
            now = time.monotonic() - t0
            if now >= next_sample:
                samples.append(await asyncio.to_thread(sample, t0, triton_pid, frontend_pid, metrics_url))
                next_sample += args.sample_s
            last = samples[-1]
            bar.n = min(round(now), bar.total)
            bar.set_postfix_str(f"ended {tally['ended']} (done {tally['done']}, refused {tally['refused']}), "
                                f"open {open_now[0]}, hangs {tally['hangs']}, triton RSS "
                                f"{last.triton_rss_mib:,.0f} MiB, KV used {last.kv_blocks_used}")
            await asyncio.sleep(1.0)
        bar.close()

    load = asyncio.create_task(run_load(plan, base_url, MODEL, args.hang_s, t0, on_record,
                                        lambda n: open_now.__setitem__(0, n)))
    await watch(load)
    return await load, samples, t0


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deck = FramedDeck(builtin_prompts(), args.seed)
    try:  # every request drawn before any server starts
        plan = build_plan(args.rps, args.duration_s, args.shares, args.seed, args.output_scale, deck)
    except PromptsExhausted as e:
        sys.exit(f"error: {e}")
    kinds = Counter(p.kind for p in plan)
    print(f"soak: {args.duration_min:g} min at {args.rps:g} rps ({len(plan)} requests: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + f"), windows of {args.window_s / 60:.1f} min, "
          f"hang after {args.hang_s:g} s without a byte, memory sampled every {args.sample_s:g} s; "
          f"prompt framings per class {deck.framings_used()}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed make unwinds through the finally
    out = Path(args.out)
    http, grpc, metrics, openai_port = free_ports(4)
    triton = triton_server(http, grpc, metrics, out / "tritonserver.log")
    frontend = openai_frontend(f"localhost:{grpc}", openai_port, out / "frontend.log", MODEL)
    base_url = f"http://localhost:{openai_port}"
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        for server in (triton, frontend):
            print(f"starting {server.name} ...", flush=True)
            server.start()
        asyncio.run(warm_up(base_url))
        records, samples, t0 = asyncio.run(soak(args, plan, base_url, triton.proc.pid, frontend.proc.pid,
                                                triton.metrics_url))
        print(f"load stopped; waiting up to {args.drain_s:g} s for the server to drain ...", flush=True)
        drained = drain(triton.metrics_url, args.drain_s)
        samples.append(sample(t0, triton.proc.pid, frontend.proc.pid, triton.metrics_url))  # the end: drained
    finally:
        frontend.stop()
        triton.stop()
    return report(args, plan, deck, records, samples, drained, started, out)


def report(args, plan, deck, records, samples, drained, started, out: Path) -> int:
    stats = soak_stats(records, samples, drained.kv_blocks_used, args.duration_s, args.window_s)
    verdicts = judge(stats)
    counts = outcome_counts(records)
    timeline = ttft_timeline(records, args.duration_s, max(args.window_s / 5, 10.0))
    hostile = Counter((r.category, r.status) for r in records if r.kind == HOSTILE)
    write_json(out / "soak.json", {
        "started": started, "commit": git_commit(), "rps": args.rps,
        "rps_why": RPS_WHY if args.rps == DEFAULT_RPS else "given with --rps", "duration_s": args.duration_s,
        "window_s": args.window_s, "hang_s": args.hang_s, "sample_s": args.sample_s,
        "shares": vars(args.shares), "output_scale": args.output_scale, "seed": args.seed,
        "planned": len(plan), "prompts_dealt": deck.dealt(), "prompt_framings_used": deck.framings_used(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": cpu_model()},
        "passed": all(v.passed for v in verdicts), "verdicts": [v.to_dict() for v in verdicts],
        "stats": stats.to_dict(), "memory_by_process": growth_by_process(samples, args.window_s),
        "drain": drained.to_dict(), "outcomes": counts,
        "hostile_answers": [{"case": c, "status": s, "n": n} for (c, s), n in sorted(hostile.items(), key=str)],
        "problems": problems(records), "ttft_timeline": timeline,
        "samples": [s.to_dict() for s in samples], "records": [r.to_dict() for r in records]})
    plot(out / "soak.png", samples, records, timeline, args.duration_s, args.window_s)
    print_verdicts(verdicts, counts)
    print(f"drained in {drained.seconds:.1f} s" if drained.seconds is not None
          else f"not drained within {args.drain_s:g} s: {drained.to_dict()}")
    print(f"wrote {out / 'soak.json'} and {out / 'soak.png'}; server logs in {out}")
    return 0 if all(v.passed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
