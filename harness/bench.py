"""Multi-SLO benchmark: the same workload against every policy, side by side, in one run.

    python -m harness.bench quick                 # RPS sweep in-process (make bench)
    python -m harness.bench full                  # + urgent-share, SLO-scale sweeps, fluctuating trace
                                                  # (make bench-full)
    python -m harness.bench quick --target triton --url localhost:8001   # the same through Triton gRPC
    python -m harness.bench quick --target openai --url http://localhost:8000 --served-model NAME   # vLLM, SGLang

Writes runs/<date>-bench/<name>.json (one row per load level and policy: rps, policy, slo_attainment,
goodput_tok_s, violations, finished, mean_accepted_per_verify, per-category breakdowns, latency
breakdown), a CSV of the same rows, and PNG plots.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import os
import platform
import random
import statistics
import time

import torch

from adaserve_backend.chat import encode_prompt
from adaserve_backend.config import EngineConfig
from adaserve_backend.cost_model.step_cost import iteration_record
from adaserve_backend.engine import Engine
from adaserve_backend.models import load_model, load_tokenizer, locate
from adaserve_backend.profiler import probe_ms

from .metrics import attainment_timeline, fmt_ms, summarize
from .run_dir import run_dir
from .runners import run_inprocess, run_openai, run_triton
from .slo_targets import add_slo_arguments, slo_targets_from_args
from .workload import (
    DEFAULT_MIX,
    PromptDeck,
    build_workload,
    builtin_prompts,
    fluctuating_arrivals,
    poisson_arrivals,
    prompt_deck,
    repeat_share,
)

POLICIES = ["adaserve", "continuous", "sarathi", "priority", "spec:2", "spec:4"]


class InProcess:
    """Loads the models once; a fresh engine (fresh KV cache, fresh stats) per policy and level."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(locate(config.target.path))

    @functools.cached_property
    def models(self):
        """(target, draft), loaded on first use: a run against a server needs only the tokenizer, and
        loading models would compete with the server for these cores."""
        config = self.config
        target = load_model(config.target)
        draft = load_model(dataclasses.replace(config.draft,
                                               max_model_len=config.target.max_model_len)) if config.draft else target
        return target, draft

    def encode(self, item) -> list[int]:
        return encode_prompt(self.tokenizer, item.prompt, item.chat)[-1024:]

    def engine(self, policy: str) -> Engine:
        cfg = dataclasses.replace(self.config, scheduler=dataclasses.replace(self.config.scheduler, policy=policy))
        target, draft = self.models
        return Engine(cfg, target=target, draft=draft, eos_token_ids={self.tokenizer.eos_token_id},
                      tokenizer=self.tokenizer)

    def baseline_tpot_ms(self, prompts, n: int = 3, max_tokens: int = 32) -> float:
        """The model's own single-request decode latency (continuous batching, no load): the relative
        SLO mode's baseline."""
        from .workload import WorkItem

        items = [WorkItem(f"b{i}", "chat", prompts["chat"][i][0], True, max_tokens, 1e9, 0.0) for i in range(n)]
        tpots = []
        for item in items:
            records, _ = run_inprocess(self.engine("continuous"), self.encode, [item], 600, desc="baseline")
            tpots += [r.tpot for r in records if r.tpot]
        return 1e3 * statistics.mean(tpots)


def level_items(level: dict, duration_s: float, slos, deck: PromptDeck, seed: int, output_scale: float):
    """One level's items: Poisson arrivals at `rps`, its urgent share (coding's part of the mix) and
    coding's TPOT target scaled by `urgent_slo_scale` (sim.validate rebuilds them from the level)."""
    rps, u, s = level["rps"], level.get("urgent_share"), level.get("urgent_slo_scale")
    mix = {"coding": u, "chat": (1 - u) / 2, "summary": (1 - u) / 2} if u is not None else None
    arrivals = poisson_arrivals(rps, max(1, int(rps * duration_s)), random.Random(seed))
    return build_workload(arrivals, slos.with_tpot_scale({"coding": s} if s is not None else {}), mix=mix,
                          deck=deck, seed=seed, output_scale=output_scale)


def served_repeat_share(sweeps: dict, repeats: int, fresh_engine_per_run: bool) -> float:
    """The share of requests one server lifetime had already been sent: a run's own if every run has
    a fresh engine, else the whole run's, every level's repeats included."""
    runs = [items for levels in sweeps.values() for _, items in levels for _ in range(repeats)]
    if fresh_engine_per_run:
        return max((repeat_share(items) for items in runs), default=0.0)
    return repeat_share([it for items in runs for it in items])


def score(records, wall, engine=None, timeline_s=None) -> dict:
    row = summarize(records, wall)
    if timeline_s:
        row["timeline"] = attainment_timeline(records, timeline_s)
    row["per_category"] = {c: summarize([r for r in records if r.category == c], wall)
                           for c in sorted({r.category for r in records})}
    # where each request ended: sim.validate ends the simulated requests where the measured ones stopped
    row["outputs"] = {r.request_id: [r.output_tokens, r.finish_reason] for r in records}
    # which requests met both targets and which admission refused: benchmarks/admission_check.py pairs
    # a run's refusals with the same requests served with admission off
    row["attained_ids"] = sorted(r.request_id for r in records if r.attained)
    row["refused_ids"] = sorted(r.request_id for r in records if r.refused)
    if engine is not None:
        its = list(engine.iteration_stats)
        row["mean_accepted_per_verify"] = engine.mean_accepted()
        total = sum(it.latency for it in its) or 1.0
        row["latency_breakdown"] = {k: sum(getattr(it, k) for it in its) / total
                                    for k in ("speculation", "selection", "verification")}
        # what sim.validate fits its step cost to: prefill-only steps too (prefill-first policies run many)
        row["iterations"] = [iteration_record(it) for it in its + list(engine.prefill_stats)]
        if engine.cost is not None:  # the rooflines its scheduler planned with (calibrated at its start)
            row["cost_model"] = engine.cost.to_dict()
    return row


def run_level(args, runner, policies, items, label: dict) -> list[dict]:
    rows = []
    remote = {"triton": lambda: run_triton(args.url, items, args.time_limit),
              "openai": lambda: run_openai(args.url, args.served_model, items, args.time_limit)}
    timeline_s = args.duration / 10 if "trace" in label else None
    for policy in [args.target] if args.target in remote else policies:  # a server runs its own policy
        if args.target in remote:
            records, wall = remote[args.target]()
            row = score(records, wall, timeline_s=timeline_s)
        else:
            engine = runner.engine(policy)
            # The machine's speed either side of the run: a shared machine's speed drifts between runs
            # (evidence: docs/experiments.md#sim-bands), so a simulation of this run (sim.validate) is
            # priced for the speed it saw.
            before = probe_ms(engine.target)
            records, wall = run_inprocess(engine, runner.encode, items, args.time_limit, desc=f"{policy} {label}")
            row = score(records, wall, engine, timeline_s)
            after = probe_ms(engine.target)
            row["speed_probe_ms"] = {n: (before[n] + after[n]) / 2 for n in before}
            row["speed_probes_ms"] = [before, after]  # apart: the machine's speed moved during the run
        rows.append({**label, "policy": policy, **row})
        print(f"  {label} {rows[-1]['policy']:>10}: attainment {row['slo_attainment']:.2f} "
              f"(TPOT only {row['tpot_slo_attainment']:.2f}), goodput {row['goodput_tok_s']:.1f} tok/s, "
              f"violations {row['violations']}, TTFT p50 {fmt_ms(row['ttft_ms_p50'])}, "
              f"accepted/verify {row.get('mean_accepted_per_verify', float('nan')):.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["quick", "full"])
    ap.add_argument("--config", default="model_repository/adaserve/1/engine.json")
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--rps", nargs="+", type=float, default=[4.0, 8.0, 12.0, 16.0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per load level")
    ap.add_argument("--time-limit", type=float, default=90.0,
                    help="seconds per run before unfinished requests count as errors")
    ap.add_argument("--output-scale", type=float, default=0.5, help="scales the categories' output lengths")
    ap.add_argument("--target", choices=["inprocess", "triton", "openai"], default="inprocess")
    ap.add_argument("--url", default="localhost:8001", help="Triton gRPC host:port, or the OpenAI server's base URL")
    ap.add_argument("--served-model", default="", help="model name for --target openai")
    ap.add_argument("--baseline-tpot-ms", type=float, help="relative SLO mode: skip measuring it")
    add_slo_arguments(ap)
    ap.add_argument("--sweeps", nargs="+",
                    help="run only these of the suite's sweeps (rps, urgent_share, slo_scale, fluctuating)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each level this many times back to back (rows carry `repeat`): the band sim.validate "
                         "judges by")
    ap.add_argument("--out", default=run_dir("bench"))
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    config = EngineConfig.from_json(args.config)
    runner = InProcess(config)
    prompts = builtin_prompts()
    baseline = None
    if args.slo_mode == "relative":
        baseline = args.baseline_tpot_ms or runner.baseline_tpot_ms(prompts)
        print(f"baseline TPOT {baseline:.1f} ms")
    slos = slo_targets_from_args(args, baseline)
    print(f"SLO targets: {slos.describe()}")

    # In process every run builds a fresh engine, so a deck per level deals no prompt twice to one
    # engine (and sim.validate rebuilds the same items); a server serves the whole run: one deck.
    shared = None if args.target == "inprocess" else prompt_deck(seed=args.seed)

    def deck_for_level() -> PromptDeck:
        return shared or prompt_deck(seed=args.seed)

    def items_for(level: dict):
        return level_items(level, args.duration, slos, deck_for_level(), args.seed, args.output_scale)

    sweeps = {"rps": [({"rps": r}, items_for({"rps": r})) for r in args.rps]}
    if args.suite == "full":
        mid = args.rps[len(args.rps) // 2]
        sweeps["urgent_share"] = [({"rps": mid, "urgent_share": u}, items_for({"rps": mid, "urgent_share": u}))
                                  for u in (0.2, 0.4, 0.6, 0.8)]
        # x baseline, or x coding's target
        scales = (1.0, 1.2, 1.6, 2.0) if args.slo_mode == "relative" else (0.8, 1.0, 1.3, 1.6)
        sweeps["slo_scale"] = [({"rps": mid, "urgent_slo_scale": s}, items_for({"rps": mid, "urgent_slo_scale": s}))
                               for s in scales]
        flow = fluctuating_arrivals(mid, args.duration, list(DEFAULT_MIX), random.Random(args.seed))
        sweeps["fluctuating"] = [({"rps": mid, "trace": "fluctuating"}, build_workload(
            [t for t, _ in flow], slos, deck=deck_for_level(), categories=[c for _, c in flow], seed=args.seed,
            output_scale=args.output_scale))]

    sweeps = {k: v for k, v in sweeps.items() if not args.sweeps or k in args.sweeps}
    meta = {"suite": args.suite, "target": args.target, "baseline_tpot_ms": baseline,
            "slo_targets": dataclasses.asdict(slos),
            "config": args.config,
            "engine": dataclasses.asdict(config), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.get_device_name()
            if torch.cuda.is_available() else None},
            "duration_s": args.duration, "mix": DEFAULT_MIX, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "repeat_share": served_repeat_share(sweeps, args.repeats, args.target == "inprocess")}
    print(f"prompts repeated within one server's lifetime: {meta['repeat_share']:.1%}")
    os.makedirs(args.out, exist_ok=True)
    for name, levels in sweeps.items():
        rows = []
        for label, items in levels:
            print(f"{name} {label}: {len(items)} requests, {repeat_share(items):.0%} repeating a prompt")
            for k in range(args.repeats):  # interleaved: a level's repeats see the machine in the same state
                rows += run_level(args, runner, args.policies, items, {**label, "repeat": k}
                                  if args.repeats > 1 else label)
        stem = os.path.join(args.out, f"{args.suite}-{name}"
                            + ("" if args.target == "inprocess" else f"-{args.target}"))
        with open(stem + ".json", "w") as f:
            json.dump({**meta, "sweep": name, "rows": rows}, f, indent=2)
        write_csv(stem + ".csv", rows)
        from .plots import plot_sweep

        plot_sweep(rows, name, stem)
        print(f"wrote {stem}.json, .csv, .png")


def write_csv(path: str, rows: list[dict]) -> None:
    flat = []
    for r in rows:
        # the iteration log and timelines stay in the JSON
        f = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
        for cat, s in r.get("per_category", {}).items():
            f[f"{cat}_slo_attainment"] = s["slo_attainment"]
        for k, v in r.get("latency_breakdown", {}).items():
            f[f"share_{k}"] = v
        flat.append(f)
    keys = sorted({k for f in flat for k in f}, key=lambda k: (k not in ("rps", "policy"), k))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(flat)


if __name__ == "__main__":
    main()
