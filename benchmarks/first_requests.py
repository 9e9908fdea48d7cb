"""The first requests a fresh server answers after it reports ready, against the same requests on a
server that has served traffic first (`make serve`'s configuration, through the ensemble over gRPC).

    python -m benchmarks.first_requests --pairs 3

Each pair starts two fresh tritonservers, one after the other, in alternating order: `cold` gets the N
probe requests the moment it is ready; `warm` first serves W other requests of the same workload
(other prompts, the same arrival process) that share no content with the probes, waits until idle, then gets the same N
probes at the same arrival offsets. Cold over warm TTFT and TPOT, per probe and over the probes' means, is what a server
start still costs the first users. Writes runs/<date>-first-requests/first-requests.{json,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from statistics import mean, median

from tqdm import tqdm

from harness.bench import score
from harness.machine import cpu_model
from harness.prompts import PROMPT_SETS
from harness.run_dir import run_dir
from harness.runners import run_triton
from harness.servers import triton_server, wait_idle
from harness.slo_targets import add_slo_arguments, slo_targets_from_args
from harness.workload import WorkItem, build_workload, prompt_deck

from .vs_peers_levels import arrivals_for, render_chat

SHARED_LINE_CHARS = 30  # a line this long in two prompts: content the caches could carry between them


def content_lines(prompt: str) -> set[str]:
    """Its long lines after the first (the family's instruction, which every prompt of it starts with,
    shorter than a KV block: never a prefix-cache hit)."""
    return {line.strip() for line in prompt.splitlines()[1:] if len(line.strip()) >= SHARED_LINE_CHARS}


def probes_and_traffic(args, slos) -> tuple[list[WorkItem], list[WorkItem]]:
    """The first N requests of the workload are the probes; the warm traffic is W later ones that share
    no content with them (no line of SHARED_LINE_CHARS or more: the chat questions' shared context
    included), at arrivals of their own. So the warm server's prefix cache and suffix index hold
    nothing of the probes, and cold against warm is what a start costs, not what the caches save."""
    n = args.probes + 6 * args.warm_requests
    items = build_workload(arrivals_for(args.arrivals, args.rps, n, args.seed), slos,
                           deck=prompt_deck(args.prompts, args.seed), seed=args.seed, output_scale=args.output_scale)
    probes = items[:args.probes]
    seen = set().union(*(content_lines(p.prompt) for p in probes))
    pool = [i for i in items[args.probes:] if not content_lines(i.prompt) & seen][:args.warm_requests]
    if len(pool) < args.warm_requests:
        raise ValueError(f"only {len(pool)} of the workload's requests share nothing with the probes")
    arrivals = arrivals_for(args.arrivals, args.rps, len(pool), args.seed + 1)
    traffic = [dataclasses.replace(i, arrival_s=t - arrivals[0]) for i, t in zip(pool, arrivals)]
    return render_chat(probes), render_chat(traffic)


def serve_once(kind: str, probes: list[WorkItem], traffic: list[WorkItem], args, log: Path) -> dict:
    server = triton_server(args.http_port, args.grpc_port, args.metrics_port, log)
    try:
        started = time.monotonic()
        server.start()
        ready_s = time.monotonic() - started
        if kind == "warm":
            run_triton(f"localhost:{args.grpc_port}", traffic, args.time_limit, exact_length=True)
            wait_idle(server)
        records, wall = run_triton(f"localhost:{args.grpc_port}", probes, args.time_limit, exact_length=True)
    finally:
        server.stop()
    per_request = {r.request_id: {"ttft_ms": None if r.ttft is None else r.ttft * 1e3,
                                  "tpot_ms": None if r.tpot is None else r.tpot * 1e3,
                                  "error": r.error} for r in records}
    return {"kind": kind, "ready_s": ready_s, "score": score(records, wall), "requests": per_request}


def compare(cold: dict, warm: dict) -> dict:
    """Cold over warm: the ratio of the probes' mean TTFT and mean TPOT, and each probe's own ratio."""
    out = {}
    for key in ("ttft_ms", "tpot_ms"):
        pairs = [(c[key], warm["requests"][rid][key]) for rid, c in cold["requests"].items()
                 if c[key] is not None and warm["requests"].get(rid, {}).get(key)]
        if pairs:
            per = [c / w for c, w in pairs]
            out[key] = {"mean_ratio": mean(c for c, _ in pairs) / mean(w for _, w in pairs),
                        "median_ratio": median(per),
                        "max_ratio": max(per), "cold_mean": mean(c for c, _ in pairs),
                        "warm_mean": mean(w for _, w in pairs)}
    return out


def pooled(pairs: list[dict]) -> dict:
    """Cold over warm over all pairs: the mean of the cold servers' probe means over that of the warm
    ones. Each server's first burst moves by about a third between two starts on the same requests, so
    one pair's ratio is noisy on both sides; this is the estimate of what a start costs, with the pairs'
    range beside it."""
    out = {}
    for key in ("ttft_ms", "tpot_ms"):
        per = [p["ratios"][key] for p in pairs if key in p["ratios"]]
        if per:
            out[key] = {"mean_ratio": mean(r["cold_mean"] for r in per) / mean(r["warm_mean"] for r in per),
                        "pair_min": min(r["mean_ratio"] for r in per), "pair_max": max(r["mean_ratio"] for r in per)}
    return out


def plot(pairs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for i, p in enumerate(pairs):
            cold, warm = p["cold"]["requests"], p["warm"]["requests"]
            ids = [rid for rid in cold if cold[rid][key] and warm.get(rid, {}).get(key)]
            ax.plot(range(1, len(ids) + 1), [cold[r][key] / warm[r][key] for r in ids], "o-", label=f"pair {i + 1}")
        ax.axhline(1.2, color="red", ls="--", lw=1, label="1.2x")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("probe request (in arrival order)")
        ax.set_ylabel(f"{label}: fresh server / warmed server")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("The first requests after ready against the same requests on a warmed server")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="cold and warm servers per pair, order alternating")
    ap.add_argument("--probes", type=int, default=10, help="requests sent to a server the moment it is ready")
    ap.add_argument("--warm-requests", type=int, default=30, help="requests a warm server serves before the probes")
    ap.add_argument("--rps", type=float, default=1.0)
    ap.add_argument("--arrivals", default="gamma", help="poisson, gamma (bursty) or azure:TRACE.csv")
    ap.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="prompt-heavy")
    ap.add_argument("--output-scale", type=float, default=0.35)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--out", default=run_dir("first-requests"))
    ap.add_argument("--http-port", type=int, default=18000)
    ap.add_argument("--grpc-port", type=int, default=18001)
    ap.add_argument("--metrics-port", type=int, default=18002)
    add_slo_arguments(ap)
    args = ap.parse_args()
    slos = slo_targets_from_args(args)
    probes, traffic = probes_and_traffic(args, slos)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_dir, started, pairs = Path(args.out), time.monotonic(), []
    for i in tqdm(range(args.pairs), desc="pairs"):
        runs = {}
        for kind in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
            runs[kind] = serve_once(kind, probes, traffic, args, out_dir / "logs" / f"pair{i + 1}-{kind}.log")
        ratios = compare(runs["cold"], runs["warm"])
        pairs.append({**runs, "ratios": ratios})
        tqdm.write(f"pair {i + 1}: "
                   + ", ".join(f"{k[:4].upper()} cold/warm mean {v['mean_ratio']:.2f} (per request median "
                                               f"{v['median_ratio']:.2f}, max {v['max_ratio']:.2f})"
                                               for k, v in ratios.items())
                   + f"; joint cold {runs['cold']['score']['slo_attainment']:.2f}, warm "
                     f"{runs['warm']['score']['slo_attainment']:.2f}")
    overall = pooled(pairs)
    print("over all pairs: " + ", ".join(f"{k[:4].upper()} cold/warm {v['mean_ratio']:.2f} (pairs {v['pair_min']:.2f}-"
                                          f"{v['pair_max']:.2f})" for k, v in overall.items()))
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": {k: v for k, v in vars(args).items()},
            "slo_targets": dataclasses.asdict(slos),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                                 "cpu": cpu_model()},
                                                                 "wall_s": time.monotonic() - started}
    with open(out_dir / "first-requests.json", "w") as f:
        json.dump({**meta, "pooled": overall, "pairs": pairs}, f, indent=2)
    plot(pairs, str(out_dir / "first-requests.png"))
    print(f"wrote {out_dir / 'first-requests.json'} and {out_dir / 'first-requests.png'}")


if __name__ == "__main__":
    main()
