"""A soak of the served stack (issue 71): tritonserver and the OpenAI frontend as `make serve` runs them,
under mixed-SLO load near capacity for half an hour, with the clients real traffic has: 30% of streams
cancelled mid-stream, some dropped without a clean close, hostile requests sprinkled in.

    python -m benchmarks.soak [--duration-min 30] [--rps auto]      # or: make soak DURATION_MIN=30

Load: Poisson arrivals at `--rps`, by default 0.9 of the capacity the soak first measures on the same
server with the same traffic (benchmarks/soak_capacity.py); the benchmark's coding/chat/summary
classes (60/20/20) sent as the served SLO classes (`slo_class`), greedy, ending at end of sequence
(`max_tokens` a cap), prompts never sent twice (benchmarks/soak_plan.py), coding to /v1/completions
and the chat-shaped classes to /v1/chat/completions. Each request runs on its own connection at its
arrival time whatever the server's pace (open loop). Clients: benchmarks/soak_clients.py; hostile
cases: soak_hostile.py.

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
from harness.slo_targets import SloTargets
from harness.workload import PromptsExhausted, builtin_prompts

from .soak_capacity import ProbeLevel, attainment_by_window, judge_level, search
from .soak_clients import run_load
from .soak_judge import growth_by_process, judge, outcome_counts, soak_stats, ttft_timeline, window_s
from .soak_plan import FramedDeck, PlannedRequest, Shares, build_plan
from .soak_records import DONE, HOSTILE, REFUSED, ServerSample, SoakRecord
from .soak_report import plot, print_speed, print_verdicts, problems, write_json
from .soak_sampler import drain, sample
from .soak_speed import speed_by_window

MODEL = "adaserve"
# Near capacity, not past it: the soak runs at this share of the capacity it measures on the server
# it then holds (benchmarks/soak_capacity.py). Past capacity refusals dominate and the TTFT p99 is
# the admission deadline by construction; a fixed rate lands past it on a slower machine or day.
CAPACITY_SHARE = 0.9
DEFAULT_OUTPUT_SCALE = 0.5  # the Poisson sweep's (benchmarks/vs_peers.py's default)


def rate(text: str) -> float | str:
    if text == "auto":
        return text
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a rate must be positive or 'auto', got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-min", type=float, default=30.0, help="minutes of load")
    ap.add_argument("--rps", type=rate, default="auto",
                    help="arrivals per second, hostile ones included; auto (default): --capacity-share of the "
                         "capacity measured on the server first")
    ap.add_argument("--capacity-share", type=float, default=CAPACITY_SHARE,
                    help="with --rps auto, the share of the measured capacity the soak runs at")
    ap.add_argument("--probe-s", type=float, default=60.0, help="with --rps auto, seconds per capacity level")
    ap.add_argument("--probe-start", type=float, default=4.0, help="with --rps auto, the first level (rps)")
    ap.add_argument("--window-min", type=float, help="the first/last window (default 5, a fifth of a short run)")
    ap.add_argument("--no-mirror", dest="mirror", action="store_false",
                    help="draw the last window's arrivals afresh instead of replaying the first's")
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
    if not 0 < args.capacity_share <= 1:
        ap.error(f"--capacity-share must be in (0, 1], got {args.capacity_share}")
    for name in ("hang_s", "drain_s", "sample_s", "output_scale", "probe_s", "probe_start"):
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


def draw(args, rps: float, deck: FramedDeck) -> list[PlannedRequest]:
    try:
        return build_plan(rps, args.duration_s, args.shares, args.seed, args.output_scale, deck,
                          mirror_s=args.window_s if args.mirror else 0.0)
    except PromptsExhausted as e:
        sys.exit(f"error: {e}")


def probe_capacity(args, deck: FramedDeck, base_url: str) -> tuple[float | None, list[ProbeLevel]]:
    """The capacity search (benchmarks/soak_capacity.py) on the started server, a line per level."""
    seeds = iter(range(args.seed + 1, args.seed + 1000))

    def run_level(rps: float) -> list[SoakRecord]:
        print(f"capacity probe: {rps:g} rps for {args.probe_s:g} s ...", flush=True)
        plan = build_plan(rps, args.probe_s, args.shares, next(seeds), args.output_scale, deck)
        return asyncio.run(run_load(plan, base_url, MODEL, args.hang_s, time.monotonic(), lambda r: None,
                                    lambda n: None))

    def report(lv: ProbeLevel) -> None:
        print(f"  {lv.rps:g} rps: joint attainment {lv.attainment:.3f} of {lv.judged} read to the end "
              f"({lv.refused} refused, {lv.hangs} hangs): {'attained' if lv.passed else 'missed'}", flush=True)

    return search(run_level, SloTargets(), args.probe_start, args.probe_s / 3, report=report)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deck = FramedDeck(builtin_prompts(), args.seed)
    probe = None
    if args.rps != "auto":
        plan = draw(args, args.rps, deck)  # every request drawn before any server starts

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
        if args.rps == "auto":
            capacity, levels = probe_capacity(args, deck, base_url)
            probe = {"capacity_rps": capacity, "share": args.capacity_share, "probe_s": args.probe_s,
                     "levels": [lv.to_dict() for lv in levels]}
            if capacity is None:
                sys.exit(f"error: the server attained < 0.9 at every probed level ({levels[-1].rps:g} rps the "
                         "lowest): no capacity to soak at")
            args.rps = round(capacity * args.capacity_share, 2)
            plan = draw(args, args.rps, deck)
        kinds = Counter(p.kind for p in plan)
        print(f"soak: {args.duration_min:g} min at {args.rps:g} rps ({len(plan)} requests: "
              + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + f"), windows of "
              f"{args.window_s / 60:.1f} min, hang after {args.hang_s:g} s without a byte, memory sampled every "
              f"{args.sample_s:g} s; prompt framings per class {deck.framings_used()}"
              + ("; the last window replays the first's arrivals" if args.mirror else ""), flush=True)
        records, samples, t0 = asyncio.run(soak(args, plan, base_url, triton.proc.pid, frontend.proc.pid,
                                                triton.metrics_url))
        print(f"load stopped; waiting up to {args.drain_s:g} s for the server to drain ...", flush=True)
        drained = drain(triton.metrics_url, args.drain_s)
        samples.append(sample(t0, triton.proc.pid, frontend.proc.pid, triton.metrics_url))  # the end: drained
    finally:
        frontend.stop()
        triton.stop()
    return report(args, plan, deck, records, samples, drained, started, out, probe)


def report(args, plan, deck, records, samples, drained, started, out: Path, probe: dict | None) -> int:
    stats = soak_stats(records, samples, drained.kv_blocks_used, args.duration_s, args.window_s)
    verdicts = judge(stats)
    slos = SloTargets()
    whole = judge_level(args.rps, records, slos)
    by_window = attainment_by_window(records, slos, args.duration_s, args.window_s)
    probe_hangs = sum(lv["hangs"] for lv in probe["levels"]) if probe else 0
    passed = all(v.passed for v in verdicts) and not probe_hangs
    counts = outcome_counts(records)
    timeline = ttft_timeline(records, args.duration_s, max(args.window_s / 5, 10.0))
    hostile = Counter((r.category, r.status) for r in records if r.kind == HOSTILE)
    speed = speed_by_window(samples, args.duration_s, args.window_s)
    write_json(out / "soak.json", {
        "started": started, "commit": git_commit(), "rps": args.rps,
        "rps_why": (f"{args.capacity_share:g} x the capacity measured first ({probe['capacity_rps']:g} rps)"
                    if probe else "given with --rps"), "capacity_probe": probe,
        "attainment": {"whole": round(whole.attainment, 4), "judged": whole.judged, "by_window": by_window},
        "duration_s": args.duration_s, "window_s": args.window_s, "last_window_mirrors_first": args.mirror,
        "hang_s": args.hang_s, "sample_s": args.sample_s,
        "shares": vars(args.shares), "output_scale": args.output_scale, "seed": args.seed,
        "planned": len(plan), "prompts_dealt": deck.dealt(), "prompt_framings_used": deck.framings_used(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": cpu_model()},
        "passed": passed, "verdicts": [v.to_dict() for v in verdicts],
        "stats": stats.to_dict(), "memory_by_process": growth_by_process(samples, args.window_s),
        "drain": drained.to_dict(), "outcomes": counts,
        "hostile_answers": [{"case": c, "status": s, "n": n} for (c, s), n in sorted(hostile.items(), key=str)],
        "problems": problems(records), "ttft_timeline": timeline, "speed_by_window": speed,
        "samples": [s.to_dict() for s in samples], "records": [r.to_dict() for r in records]})
    plot(out / "soak.png", samples, records, timeline, args.duration_s, args.window_s)
    print_verdicts(verdicts, counts)
    print_speed(speed)
    print(f"joint SLO attainment of the streams read to their end: {whole.attainment:.3f} of {whole.judged}; "
          "per window " + " / ".join(f"{w['attainment']:.2f}" for w in by_window))
    if probe:
        print(f"capacity {probe['capacity_rps']:g} rps measured first; the soak ran at {args.rps:g} rps"
              + (f"; FAIL: {probe_hangs} hangs during the capacity probe" if probe_hangs else ""))
    print(f"drained in {drained.seconds:.1f} s" if drained.seconds is not None
          else f"not drained within {args.drain_s:g} s: {drained.to_dict()}")
    print(f"wrote {out / 'soak.json'} and {out / 'soak.png'}; server logs in {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
