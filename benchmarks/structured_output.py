"""Structured output: fifty JSON schemas of the kinds agents send (harness/schemas.py), each asked for
once, through the served engine in process (issue 90).

    python -m benchmarks.structured_output [--tasks 50] [--max-tokens 256] [--batch 32]

Each task's greedy request runs alone under the served `adaserve` policy and again under `continuous` (no
speculation, a second engine): the two outputs must be the same tokens, every output must be valid
against its schema, and the run prints one-request TPOT and tokens per verification both ways. Then one
seeded sampled request per task (validity only), and a batch of `--batch` schema requests at once, with
the time spent in the grammar (masks, pruning, beam states) per step. Exits 1 on any invalid or differing
output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict

import jsonschema
from tqdm import tqdm

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.chat import encode_chat
from adaserve_backend.config import EngineConfig
from adaserve_backend.engine import Engine
from adaserve_backend.grammar import state as grammar_state
from adaserve_backend.grammar.spec import GrammarSpec
from adaserve_backend.request import Request, SamplingParams
from adaserve_backend.speculation import beam, verify
from harness.machine import cpu_model
from harness.run_dir import run_dir
from harness.schemas import SchemaTask, schema_tasks

GRAMMAR_TIME: dict[str, float] = defaultdict(float)  # seconds spent in the grammar's work, by kind


def timed(kind: str, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            GRAMMAR_TIME[kind] += time.perf_counter() - t
    return wrapper


def watch_grammar_time() -> None:
    """Every grammar call the engine makes, timed (the masks of verification and beams, the pruning)."""
    GS = grammar_state.GrammarState
    for name in ("bitmask", "accept", "child", "tree_allows"):
        setattr(GS, name, timed(name, getattr(GS, name)))
    verify.masked = timed("apply mask", verify.masked)
    beam.beam_allowed = timed("beam masks", beam.beam_allowed)


def request(engine: Engine, rid: str, task: SchemaTask, max_tokens: int, sampling=SamplingParams()) -> Request:
    return Request(rid, encode_chat(engine.tokenizer, task.prompt), max_tokens=max_tokens, sampling=sampling,
                   grammar=GrammarSpec.schema(task.schema))


def alone(engine: Engine, req: Request) -> dict:
    engine.add_request(req)
    first, tokens, last = None, [], None
    for o in engine.drain():
        if o.new_token_ids and first is None:
            first = time.monotonic()
        tokens += o.new_token_ids
        last = o
    end, s = time.monotonic(), last.stats
    return {"tokens": tokens, "finish": str(last.finish_reason.value),
            "per_verification": (s.accepted_drafts + s.verifications) / max(s.verifications, 1),
            "tpot_ms": (end - first) / max(len(tokens) - 1, 1) * 1e3}


def valid(engine: Engine, tokens: list[int], schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(engine.tokenizer.decode(tokens, skip_special_tokens=True)), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=run_dir("structured-output"))
    args = ap.parse_args()
    config = EngineConfig.from_json(str(PROJECT_ROOT / "model_repository/adaserve/1/engine.json"))
    tasks = schema_tasks()[: args.tasks]
    served = Engine.from_config(config)
    plain = Engine.from_config(dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler,
                                                                                         policy="continuous")))
    rows = []
    for i, t in enumerate(tqdm(tasks, desc="schemas, greedy: adaserve then continuous")):
        spec, base = alone(served, request(served, f"g{i}", t, args.max_tokens)), alone(
            plain, request(plain, f"c{i}", t, args.max_tokens))
        rows.append({"task": t.name, "adaserve": spec, "continuous": base,
                     "valid": valid(served, spec["tokens"], t.schema), "same": spec["tokens"] == base["tokens"]})
    for i, t in enumerate(tqdm(tasks, desc="schemas, sampled (temperature 1, seeded)")):
        out = alone(served, request(served, f"s{i}", t, args.max_tokens, SamplingParams(temperature=1.0, seed=i)))
        rows[i]["sampled_valid"] = valid(served, out["tokens"], t.schema)
        rows[i]["sampled_finish"] = out["finish"]
    watch_grammar_time()
    served.reset_stats()
    start = time.monotonic()
    for i in range(args.batch):
        served.add_request(request(served, f"b{i}", tasks[i % len(tasks)], args.max_tokens,
                                   SamplingParams(temperature=0.7, seed=100 + i)))
    batch_out = served.run_until_done()
    elapsed = time.monotonic() - start
    steps = [it for it in served.iteration_stats if it.n >= args.batch // 2]

    def mean(kind: str, key: str) -> float:
        return statistics.mean(r[kind][key] for r in rows)

    n = len(rows)
    greedy, sampled, same = (sum(r[k] for r in rows) for k in ("valid", "sampled_valid", "same"))
    finishes = Counter(r["adaserve"]["finish"] for r in rows)
    lines = [f"{cpu_model()}; {n} JSON schemas, each alone, served engine.json in process",
             f"greedy valid: {greedy}/{n}; sampled valid: {sampled}/{n}; "
             f"greedy adaserve == continuous token for token: {same}/{n}",
             f"finish reasons (greedy adaserve): {dict(sorted(finishes.items()))}"]
    for kind in ("adaserve", "continuous"):
        tokens = statistics.mean(len(r[kind]["tokens"]) for r in rows)
        lines.append(f"{kind:>11}: TPOT {mean(kind, 'tpot_ms'):.1f} ms, tokens/verification "
                     f"{mean(kind, 'per_verification'):.2f}, output tokens {tokens:.0f}")
    per_step = 1e3 / max(len(served.iteration_stats), 1)
    parts = ", ".join(f"{k} {v * per_step:.2f}" for k, v in GRAMMAR_TIME.items())
    step_ms = statistics.mean(it.latency for it in steps) * 1e3 if steps else 0.0
    batch_valid = sum(valid(served, batch_out[f"b{i}"], tasks[i % len(tasks)].schema) for i in range(args.batch))
    lines += [f"batch of {args.batch} sampled schema requests: {elapsed:.1f} s, {len(served.iteration_stats)} steps; "
              f"grammar {sum(GRAMMAR_TIME.values()) * per_step:.2f} ms per step ({parts}); mean step with >= "
              f"{args.batch // 2} decoding {step_ms:.1f} ms; valid {batch_valid}/{args.batch}"]
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "structured-output.json"), "w") as f:
        json.dump({"cpu": cpu_model(), "summary": lines,
                   "rows": [{k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict) else v)
                             for k, v in r.items()} for r in rows]}, f, indent=2)
    bad = [r["task"] for r in rows if not (r["valid"] and r["same"] and r["sampled_valid"])]
    print("failing:", bad or "none")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
