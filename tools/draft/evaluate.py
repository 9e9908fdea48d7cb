"""Acceptance benchmark for a draft, on held-out prompts the training never saw, per category:

- top-1 agreement with the target (teacher-forced over the target's greedy continuations);
- mean accepted tokens per verification (bonus included) for a 4-token chain and trees (d, w), one
  request at a time;
- one draft step's latency as a fraction of one target single-token decode step;
- time per output token of the engine's `adaserve` policy vs `continuous`, one request at a time,
  greedy outputs compared token for token.

    python -m tools.draft.evaluate [--draft embedded:smollm2-135m-instruct-draft]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

import torch
from tqdm import tqdm

from adaserve_backend.config import EMBEDDED_DEFAULT, EMBEDDED_DRAFT, CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpeculationConfig
from tools.profiler import measure_forward
from adaserve_backend.engine import Engine
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model, load_tokenizer, locate
from adaserve_backend.request import Request
from adaserve_backend.slo import tpot_seconds
from tools.draft.data import CATEGORIES, build_prompts, encode
from tools.draft.teacher import continuations, dense_hidden, dense_logits, shifted

SHAPES = [("chain d=4", "spec:4", 4, 1), ("tree d=4 w=2", "adaserve", 4, 2), ("tree d=4 w=4", "adaserve", 4, 4), ("tree d=6 w=2", "adaserve", 6, 2)]


@torch.inference_mode()
def agreement(draft, target, seqs, prompt_lens) -> float:
    """Teacher-forced top-1 agreement over the output positions (a feature-conditioned draft reads
    the target's features, as it does when serving)."""
    hits = total = 0
    vocab_ids = draft.vocab_ids
    for seq, plen in zip(seqs, prompt_lens):
        if len(seq) - plen < 2:
            continue
        ids = torch.tensor([seq])
        features = shifted(dense_hidden(target, ids)) if draft.takes_features else None
        guess = dense_logits(draft, ids, features)[0].argmax(-1)
        if vocab_ids is not None:
            guess = vocab_ids[guess]
        pred, truth = guess[plen - 1 : len(seq) - 1], torch.tensor(seq[plen:])
        hits += int((pred == truth).sum())
        total += len(truth)
    return hits / max(total, 1)


def engine_for(target, draft, policy: str, depth: int, width: int, eos) -> Engine:
    spec = SpeculationConfig(budget=1 + depth * width, draft_budget=width, d_min=depth, d_max=depth, w_max=width, c1=0, n_max=1 + depth * width)
    cfg = EngineConfig(target_cache=CacheConfig(memory_mb=256), draft_cache=CacheConfig(memory_mb=128),
                       scheduler=SchedulerConfig(policy=policy, max_num_seqs=1), speculation=spec)
    return Engine(cfg, target=target, draft=draft, eos_token_ids=eos)


def run_one_by_one(engine: Engine, prompts: list[list[int]], max_tokens: int, slo_ms: float = 1e-3) -> tuple[list[list[int]], list[float]]:
    """Each prompt alone (one request at a time; by default the tightest SLO, so the SLO phase takes
    n_max nodes every iteration); returns outputs and TPOTs (s)."""
    outs, tpots = [], []
    for i, ids in enumerate(prompts):
        engine.add_request(Request(f"p{i}", ids, max_tokens=max_tokens, tpot_slo_ms=slo_ms))
        toks, first, last = [], None, None
        for o in engine.drain():
            toks += o.new_token_ids
            first = first or o.emit_time
            last = o.emit_time
        outs.append(toks)
        if (tpot := tpot_seconds(first, last, len(toks))) is not None:
            tpots.append(tpot)
    return outs, tpots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=EMBEDDED_DEFAULT)
    ap.add_argument("--draft", default=EMBEDDED_DRAFT)
    ap.add_argument("--draft-dtype", default="bfloat16")
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--config", default="model_repository/adaserve/1/engine.json", help="the engine compared at one request")
    ap.add_argument("--slo-ms", type=float, default=1e-3, help="TPOT SLO of the one-request comparison (default: unmeetable)")
    ap.add_argument("--out", default="results/draft_eval.json")
    args = ap.parse_args()

    tokenizer = load_tokenizer(locate(args.target))
    eos = {tokenizer.eos_token_id}
    target = load_model(ModelConfig(path=args.target))
    draft = load_model(ModelConfig(path=args.draft, dtype=args.draft_dtype))
    draft_f32 = load_model(ModelConfig(path=args.draft))  # agreement is measured without bf16 noise
    _, held_out = build_prompts()
    by_cat = {c: [p for p in held_out if p.category == c][: args.per_category] for c in CATEGORIES}
    report: dict = {"target": args.target, "draft": args.draft, "draft_dtype": args.draft_dtype, "categories": {}}

    for cat, prompts in by_cat.items():
        ids = [encode(tokenizer, p)[-320:] for p in prompts]
        outs = continuations(target, ids, args.max_tokens, [0.0] * len(ids), eos, batch=8)
        row = {"prompts": len(ids), "top1_agreement": agreement(draft_f32, target, [a + b for a, b in zip(ids, outs)], [len(a) for a in ids])}
        for name, policy, d, w in tqdm(SHAPES, desc=f"{cat}: accepted tokens", leave=False):
            engine = engine_for(target, draft, policy, d, w, eos)
            run_one_by_one(engine, ids, args.max_tokens)
            row[f"accepted/verify {name}"] = engine.mean_accepted()
        report["categories"][cat] = row

    # latency: one draft step vs one target decode step, one request
    t_runner = ModelRunner(target, CacheConfig(memory_mb=64))
    d_runner = ModelRunner(draft, CacheConfig(memory_mb=64))
    t_ms = measure_forward(t_runner, [1], per_seq=1, repeats=20, desc="target step")[1]
    d_ms = measure_forward(d_runner, [1, 4], per_seq=4, repeats=20, desc="draft step")
    report["latency_ms"] = {"target_decode": t_ms, "draft_step_1_token": d_ms[1], "draft_step_4_beams": d_ms[4]}
    report["draft_step_fraction"] = d_ms[1] / t_ms

    # the served engine (its knobs and profile) at one request: adaserve vs continuous, greedy outputs identical
    ids = [encode(tokenizer, p)[-320:] for ps in by_cat.values() for p in ps[:4]]
    served = EngineConfig.from_json(args.config)
    ada = Engine(served, target=target, draft=draft, eos_token_ids=eos)
    cont = Engine(dataclasses.replace(served, scheduler=dataclasses.replace(served.scheduler, policy="continuous")),
                  target=target, eos_token_ids=eos)
    ada_out, ada_tpot = run_one_by_one(ada, ids, args.max_tokens, args.slo_ms)
    cont_out, cont_tpot = run_one_by_one(cont, ids, args.max_tokens, args.slo_ms)
    report["one_request"] = {
        "slo_ms": args.slo_ms,
        "adaserve_tpot_ms": 1e3 * statistics.mean(ada_tpot),
        "continuous_tpot_ms": 1e3 * statistics.mean(cont_tpot),
        "tpot_ratio": statistics.mean(ada_tpot) / statistics.mean(cont_tpot),
        "outputs_identical": ada_out == cont_out,
        "adaserve_accepted_per_verify": ada.mean_accepted(),
    }

    print(json.dumps(report, indent=2))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
