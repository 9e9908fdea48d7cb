"""Mean accepted tokens per verification, tree shape and per-token latency at several concurrency
levels, for the embedded default (or any engine JSON), greedy, in-process.

    python -m benchmarks.engine_acceptance --profile runs/profile.json --concurrency 1 4 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

from tqdm import tqdm

from adaserve_backend.chat import encode_chat
from adaserve_backend.config import EngineConfig
from adaserve_backend.engine import Engine
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO, tpot_seconds
from harness.run_dir import run_dir

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "Summarize: The city council met on Tuesday to discuss the new park, which will open next spring.",
    "def is_prime(n):",
    "Give three tips for writing clear emails.",
    "Translate to French: I would like a cup of coffee, please.",
    "What is the capital of Australia, and why is it not Sydney?",
    "List the planets of the solar system in order.",
]


def run_level(engine: Engine, tokenizer, concurrency: int, max_tokens: int) -> dict:
    engine.reset_stats()
    first, last, counts = {}, {}, {}
    for i in range(concurrency):
        ids = encode_chat(tokenizer, PROMPTS[i % len(PROMPTS)])
        engine.add_request(Request(f"c{concurrency}-{i}", ids, max_tokens=max_tokens, slo=SLO(tpot_ms=1.0)))
    start = time.monotonic()
    while engine.has_work():
        for o in engine.step():
            first.setdefault(o.request_id, o.emit_time)
            last[o.request_id] = o.emit_time
            counts[o.request_id] = o.num_output_tokens
    wall = time.monotonic() - start
    its = engine.iteration_stats
    tpot = [t for r in counts if (t := tpot_seconds(first[r], last[r], counts[r])) is not None]
    return {
        "concurrency": concurrency,
        "mean_accepted_per_verify": engine.mean_accepted(),
        "mean_depth": statistics.mean(it.depth for it in its),
        "mean_width": statistics.mean(it.width for it in its),
        "mean_verified_tokens": statistics.mean(it.verified_tokens for it in its),
        "mean_iteration_ms": 1e3 * statistics.mean(it.latency for it in its),
        "mean_tpot_ms": 1e3 * statistics.mean(tpot),
        "throughput_tok_s": sum(counts.values()) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="engine JSON (default: built-in defaults)")
    ap.add_argument("--profile", help="profile JSON from `python -m tools.profile`")
    ap.add_argument("--policy", default="adaserve")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(run_dir("engine-acceptance"), "engine_acceptance.json"))
    args = ap.parse_args()
    cfg = EngineConfig.from_json(args.config) if args.config else EngineConfig()
    cfg = dataclasses.replace(
        cfg,
        scheduler=dataclasses.replace(cfg.scheduler, policy=args.policy),
        speculation=dataclasses.replace(cfg.speculation, profile_path=args.profile or cfg.speculation.profile_path),
    )
    engine = Engine.from_config(cfg)
    draft = cfg.draft.path if cfg.draft else "the target itself"
    print(f"policy {args.policy}, budget B = {engine.budget}, draft = {draft}")
    rows = [run_level(engine, engine.tokenizer, c, args.max_tokens) for c in tqdm(args.concurrency, desc="concurrency")]
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    with open(args.out, "w") as f:
        json.dump({"policy": args.policy, "budget": engine.budget, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
