"""Suffix speculation, one request at a time (issue 45's one-request targets), in one run on this CPU.

Sequences, each request exactly --tokens long, greedy:
  unseen           --prompts held-out benchmark prompts, each the first time it is sent;
  answered before  the same prompts again, on the same server (what it saw is still indexed);
  repetitive       --repetitive requests of the repetitive set (code to edit, questions asked again,
                   passages described as JSON; harness/prompts.py), in one seeded order.
Systems: ours `continuous` (no speculation), `adaserve` without the suffix index, `adaserve` with it
(served engine.json otherwise), and, where `make peers` built it, llama-server on the shipped Q4_1
GGUF without and with its `--spec-type ngram-mod` (one slot). Prints median TPOTs and the targets as
ratios to `continuous`; writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from functools import partial
from pathlib import Path

from adaserve_backend.config import EMBEDDED_DEFAULT
from adaserve_backend.models import load_tokenizer, locate
from benchmarks.one_request import engine_tpots_ms, held_out_prompts, peer_tpots_of_texts, prompt_texts, served_engine
from harness.machine import cpu_model
from harness.prompts import repetitive_prompts
from harness.run_dir import run_dir
from harness.workload import DEFAULT_MIX

SYSTEMS = {  # name -> served_engine arguments
    "continuous": ("continuous", {}),
    "adaserve, no index": ("adaserve", {"suffix_tokens": 0}),
    "adaserve + suffix index": ("adaserve", {}),
}


def repetitive_sequence(n: int, seed: int = 0) -> list[tuple[str, bool]]:
    """n prompts of the repetitive set in the benchmark's category mix, in one seeded order."""
    rng, prompts = random.Random(seed), repetitive_prompts()
    cats, weights = zip(*DEFAULT_MIX.items())
    return [rng.choice(prompts[rng.choices(cats, weights)[0]]) for _ in range(n)]


def sequences(args) -> dict[str, list[str]]:
    tokenizer = load_tokenizer(locate(EMBEDDED_DEFAULT))
    unseen = prompt_texts(tokenizer, held_out_prompts(args.prompts))
    return {"unseen": unseen, "answered before": unseen,
            "repetitive": prompt_texts(tokenizer, repetitive_sequence(args.repetitive))}


def measure_ours(seqs: dict[str, list[str]], tokens: int) -> dict[str, dict[str, list[float]]]:
    out = {}
    for name, (policy, spec) in SYSTEMS.items():
        print(f"{name}: starting", flush=True)
        engine, out[name] = served_engine(policy, "bfloat16", **spec), {}
        for seq, texts in seqs.items():
            if seq == "repetitive":  # a fresh index: only what this sequence itself repeats
                engine = served_engine(policy, "bfloat16", **spec)
            out[name][seq] = engine_tpots_ms(engine, texts, tokens)
            print(f"  {seq}: median TPOT {statistics.median(out[name][seq]):.2f} ms", flush=True)
    return out


def measure_peers(seqs: dict[str, list[str]], tokens: int, log_dir: Path) -> dict[str, dict[str, list[float]]]:
    from harness.servers import llamacpp_server

    out = {}
    for spec in (None, "ngram-mod"):
        name = f"llama-server q4_1{' ' + spec if spec else ''}"
        make = partial(llamacpp_server, log_path=log_dir / f"{name.replace(' ', '-')}.log",
                       weights="q4_1", slots=1, spec_type=spec)
        first = peer_tpots_of_texts(make, seqs["unseen"] + seqs["answered before"], tokens)
        if first is None:
            continue
        n = len(seqs["unseen"])
        out[name] = {"unseen": first[:n], "answered before": first[n:],
                     "repetitive": peer_tpots_of_texts(make, seqs["repetitive"], tokens)}
        print(f"{name}: " + ", ".join(f"{k} {statistics.median(v):.2f} ms" for k, v in out[name].items()), flush=True)
    return out


def report(results: dict) -> list[str]:
    med = {sys: {seq: statistics.median(v) for seq, v in by_seq.items()} for sys, by_seq in results["tpot_ms"].items()}
    cont, plain, suffix = (med[n] for n in SYSTEMS)
    lines = [f"CPU: {results['cpu']}; {results['tokens']} tokens per request; median TPOT (ms)"]
    lines += [f"  {sys:28s} " + "  ".join(f"{seq} {v:6.2f}" for seq, v in row.items()) for sys, row in med.items()]
    ngram = med.get("llama-server q4_1 ngram-mod", {})
    lines += [
        f"answered before: {suffix['answered before'] / cont['unseen']:.2f}x continuous (target <= 0.35)",
        f"repetitive: {suffix['repetitive'] / cont['repetitive']:.2f}x continuous (target <= 0.5)",
        f"unseen: {suffix['unseen'] / cont['unseen']:.2f}x continuous, without the index "
        f"{plain['unseen'] / cont['unseen']:.2f}x (target: no worse than without)",
    ]
    if ngram:
        before = suffix["answered before"] / ngram["answered before"]
        lines += [f"vs llama-server ngram-mod: answered before {before:.2f}x, "
                  f"repetitive {suffix['repetitive'] / ngram['repetitive']:.2f}x"]
    return lines


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(results["tpot_ms"])
    seqs = list(next(iter(results["tpot_ms"].values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(systems)
    for i, sys in enumerate(systems):
        ax.bar([j + i * width for j in range(len(seqs))],
               [statistics.median(results["tpot_ms"][sys][s]) for s in seqs], width, label=sys)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(seqs))], seqs)
    ax.set_ylabel("median TPOT, one request (ms)")
    ax.set_title(f"Suffix speculation, one request at a time ({results['cpu']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts, sent twice")
    ap.add_argument("--repetitive", type=int, default=40, help="requests of the repetitive sequence")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--no-peers", action="store_true", help="skip llama-server even where built")
    ap.add_argument("--out", default=os.path.join(run_dir("suffix-speculation"), "suffix_speculation"),
                    help="writes OUT.json and OUT.png")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    seqs = sequences(args)
    results = {"cpu": cpu_model(), "tokens": args.tokens, "tpot_ms": measure_ours(seqs, args.tokens)}
    if not args.no_peers:
        results["tpot_ms"].update(measure_peers(seqs, args.tokens, Path(args.out).parent))
    print("\n".join(report(results)))
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
