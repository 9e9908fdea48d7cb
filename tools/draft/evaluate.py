"""A draft on prompt families it never saw (the held-out training families and the benchmark's), in
one run for every draft named (e.g. the shipped one and an earlier one):

- top-1 agreement with the target per draft depth (teacher-forced over the target's greedy
  continuations; an EAGLE-3 draft is unrolled as in serving, tools/draft/ttt.py; others at depth 0);
- mean tokens per verification (bonus included) for a 4-token chain and trees (d, w), one request at
  a time, in the served dtype, by the draft alone and with prompt lookup's copies grafted on;
- one draft step's latency as a share of one target decode step;
- the served engine's `adaserve` (with prompt lookup as served, with its first version's 3-gram
  matches, and without) vs `continuous` TPOT at one request.

    python -m tools.draft.evaluate [--draft embedded:smollm2-135m-instruct-draft [OTHER.safetensors ...]]

Which draft to ship is chosen by the validation score alone: the held-out training families' mean
step-0 agreement and tokens per verification (tools/draft/data.py HELD_OUT_FAMILIES). The benchmark's
families are reported beside it and never choose: a draft picked for them would be tuned to the
benchmark that then measures it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

import torch
from tqdm import tqdm

from adaserve_backend.config import (
    EMBEDDED_DEFAULT,
    EMBEDDED_DRAFT,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculationConfig,
)
from adaserve_backend.engine import Engine
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model, load_tokenizer, locate
from adaserve_backend.profiler import measure_forward
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO, tpot_seconds
from harness.run_dir import run_dir
from tools.draft.data import HELD_OUT_FAMILIES, encode
from tools.draft.teacher import continuations, dense_hidden, dense_run, shifted
from tools.draft.train import eval_prompts
from tools.draft.ttt import unrolled

# (name, policy, depth, width, prompt lookup's longest n-gram, 0: none): the draft's own chain and
# trees, then with copies from the context grafted on (speculation/lookup.py; as served by default:
# matches of up to 5 tokens; "3-grams" is lookup's first version)
SERVED_LOOKUP = SpeculationConfig.lookup_ngram
FIRST_LOOKUP = 3
SHAPES = [("chain d=4", "spec:4", 4, 1, 0), ("tree d=4 w=2", "adaserve", 4, 2, 0),
          ("tree d=4 w=4", "adaserve", 4, 4, 0), ("tree d=6 w=2", "adaserve", 6, 2, 0),
          ("chain d=4 +lookup", "adaserve", 4, 1, SERVED_LOOKUP),
          ("tree d=4 w=4 +lookup 3-grams", "adaserve", 4, 4, FIRST_LOOKUP),
          ("tree d=4 w=4 +lookup", "adaserve", 4, 4, SERVED_LOOKUP)]


@torch.inference_mode()
def agreement(draft, target, seqs, prompt_lens, steps: int) -> list[float]:
    """Teacher-forced top-1 agreement per depth over the output positions (a feature-conditioned
    draft reads the target's features, as it does when serving)."""
    hits, total = [0] * steps, [0] * steps
    target.feature_layers = tuple(draft.target_layers)
    for seq, plen in zip(seqs, prompt_lens):
        if len(seq) - plen < steps + 1:
            continue
        ids = torch.tensor([seq])
        feats = shifted(dense_run(target, ids)[1])
        outs = unrolled(draft, ids, feats, steps) if draft.target_layers else [dense_hidden(draft, ids, feats)]
        for j, hidden in enumerate(outs):
            guess = draft.vocab_ids[draft.compute_logits(hidden[0]).argmax(-1)]
            pred, truth = guess[plen - 1 : len(seq) - 1 - j], ids[0, plen + j :]
            hits[j] += int((pred == truth).sum())
            total[j] += len(truth)
    return [h / t if t else float("nan") for h, t in zip(hits, total)]


def engine_for(target, draft, policy: str, depth: int, width: int, eos, ngram: int = 0) -> Engine:
    tree = 1 + depth * width + (SpeculationConfig.lookup_tokens if ngram else 0)  # every node verified
    spec = SpeculationConfig(budget=tree, draft_budget=width, d_min=depth, d_max=depth, w_max=width, c1=0, n_max=tree,
                             lookup_ngram=ngram)
    cfg = EngineConfig(target_cache=CacheConfig(memory_mb=256), draft_cache=CacheConfig(memory_mb=128),
                       scheduler=SchedulerConfig(policy=policy, max_num_seqs=1), speculation=spec)
    return Engine(cfg, target=target, draft=draft, eos_token_ids=eos)


def run_one_by_one(engine: Engine, prompts: list[list[int]], max_tokens: int,
                   slo_ms: float = 1e-3) -> tuple[list[list[int]], list[float]]:
    """Each prompt alone (one request at a time; by default the tightest SLO, so the SLO phase takes
    n_max nodes every iteration); returns outputs and TPOTs (s)."""
    outs, tpots = [], []
    for i, ids in enumerate(prompts):
        engine.add_request(Request(f"p{i}", ids, max_tokens=max_tokens, slo=SLO(tpot_ms=slo_ms)))
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
    ap.add_argument("--draft", nargs="+", default=[EMBEDDED_DRAFT])
    ap.add_argument("--dtype", default="bfloat16", help="the served dtype (target and draft)")
    ap.add_argument("--per-family", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4, help="depths whose agreement is reported")
    ap.add_argument("--config", default="model_repository/adaserve/1/engine.json",
                    help="the engine compared at one request")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the one-request comparison")
    ap.add_argument("--out", default=os.path.join(run_dir("draft-eval"), "draft_eval.json"))
    args = ap.parse_args()

    tokenizer = load_tokenizer(locate(args.target))
    eos = {tokenizer.eos_token_id}
    target = load_model(ModelConfig(path=args.target, dtype=args.dtype))
    prompts = eval_prompts(args.per_family, seed=1)  # other prompts than training's evaluation set
    families = sorted({p.family for p in prompts})
    report: dict = {"target": args.target, "dtype": args.dtype, "drafts": {}}
    target_f32 = load_model(ModelConfig(path=args.target))  # agreement is measured without bf16 noise
    for path in args.draft:
        draft = load_model(ModelConfig(path=path, dtype=args.dtype))
        draft_f32 = load_model(ModelConfig(path=path))  # agreement is measured without bf16 noise
        rows = {}
        for fam in tqdm(families, desc=f"{os.path.basename(path)}: families"):
            ids = [encode(tokenizer, p)[-320:] for p in prompts if p.family == fam]
            outs = continuations(target, ids, args.max_tokens, [0.0] * len(ids), eos, batch=8)
            seqs = [a + b for a, b in zip(ids, outs)]
            row = {"prompts": len(ids),
                   "top1_by_depth": agreement(draft_f32, target_f32, seqs, [len(a) for a in ids], args.steps)}
            for name, policy, d, w, ngram in SHAPES:
                engine = engine_for(target, draft, policy, d, w, eos, ngram)
                run_one_by_one(engine, ids, args.max_tokens)
                row[f"accepted/verify {name}"] = engine.mean_accepted()
            rows[fam] = row
        entry = {"families": rows}
        t_runner = ModelRunner(target, CacheConfig(memory_mb=64))
        target.feature_layers = tuple(getattr(draft, "target_layers", ()))
        d_runner = ModelRunner(draft, CacheConfig(memory_mb=64))
        t_ms = measure_forward(t_runner, [1], per_seq=1, repeats=20, desc="target step")[1]
        d_ms = measure_forward(d_runner, [1, 4], per_seq=4, repeats=20, desc="draft step")
        entry["latency_ms"] = {"target_decode": t_ms, "draft_step_1_token": d_ms[1], "draft_step_4_beams": d_ms[4]}
        entry["draft_step_fraction"] = d_ms[1] / t_ms
        # the served engine (its knobs and profile) at one request: adaserve (with and without lookup)
        # vs continuous, in interleaved rounds (every other one reversed: a shared machine's speed drifts)
        one = [encode(tokenizer, p)[-320:] for fam in families for p in [q for q in prompts if q.family == fam][:2]]
        entry["one_request"] = one_request(EngineConfig.from_json(args.config), target, draft, eos, one,
                                           args.max_tokens, args.rounds)
        entry["validation"] = validation_score(entry)
        report["drafts"][path] = entry
        print(json.dumps(entry, indent=1))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(table(report))


def one_request(served: EngineConfig, target, draft, eos, prompts: list[list[int]],
                max_tokens: int, rounds: int) -> dict:
    """Mean TPOT per variant and round, each prompt alone; ratios of the rounds' sums."""
    def lookup(ngram: int) -> EngineConfig:
        return dataclasses.replace(served, speculation=dataclasses.replace(served.speculation, lookup_ngram=ngram))

    continuous = dataclasses.replace(served, scheduler=dataclasses.replace(served.scheduler, policy="continuous"))
    variants = {"continuous": (continuous, None), "adaserve": (served, draft),
                "adaserve, lookup 3-grams": (lookup(FIRST_LOOKUP), draft),
                "adaserve, no prompt lookup": (lookup(0), draft)}
    tpot = {name: [] for name in variants}
    accepted = {name: [] for name in variants}
    outs = {}
    for k in tqdm(range(rounds), desc="one request, rounds"):
        for name in (list(variants) if k % 2 == 0 else list(reversed(variants))):
            config, d = variants[name]
            engine = Engine(config, target=target, draft=d, eos_token_ids=eos)
            outs[name], tpots = run_one_by_one(engine, prompts, max_tokens, 1e3)
            tpot[name].append(1e3 * statistics.mean(tpots))
            accepted[name].append(engine.mean_accepted())
    base = sum(tpot["continuous"])
    return {name: {"tpot_ms_rounds": tpot[name], "tpot_ratio": sum(tpot[name]) / base,
                   "accepted_per_verify_rounds": accepted[name],
                   "same_outputs_share": sum(a == c for a, c in zip(outs[name], outs["continuous"])) / len(prompts)}
            for name in variants}


def validation_score(entry: dict) -> dict:
    """What chooses a draft: its held-out families' mean step-0 agreement and mean tokens per
    verification over the shapes (never a benchmark family's)."""
    held = [r for fam, r in entry["families"].items() if fam in HELD_OUT_FAMILIES]
    if not held:
        raise ValueError("no held-out family was evaluated: a draft cannot be chosen")
    return {"agreement": statistics.fmean(r["top1_by_depth"][0] for r in held),
            "tokens_per_verify": statistics.fmean(r[f"accepted/verify {n}"] for r in held for n, *_ in SHAPES)}


def table(report: dict) -> str:
    """The README's per-family table: one row per family, a column group per draft."""
    drafts = list(report["drafts"])
    fams = sorted(next(iter(report["drafts"].values()))["families"])
    lines = ["| family | " + " | ".join(f"{os.path.basename(d)}: top-1 by depth; tok/verify "
                                        + " / ".join(n for n, *_ in SHAPES) for d in drafts) + " |",
             "|---|" + "---|" * len(drafts)]
    for fam in fams:
        cells = []
        for d in drafts:
            r = report["drafts"][d]["families"][fam]
            top = "/".join(f"{a:.2f}" for a in r["top1_by_depth"] if a == a)
            acc = " / ".join(f"{r[f'accepted/verify {n}']:.2f}" for n, *_ in SHAPES)
            cells.append(f"{top}; {acc}")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    scores = [validation_score(report["drafts"][d]) for d in drafts]
    lines.append("| **validation (held-out families; chooses)** | " + " | ".join(
        f"{s['agreement']:.2f}; {s['tokens_per_verify']:.2f}" for s in scores) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
