"""Micro-benchmark: model forward latency vs tokens in the batch, decode-style and tree-style, next to
transformers' own single-token decode latency, all measured in one run on this machine.

    python -m benchmarks.forward_latency --dtypes float32 bfloat16 --out results/forward_latency

Decode-style: N sequences, each with a 128-token context, one new token each.
Tree-style: N tree tokens, 8 per sequence (ceil(N/8) sequences), each tree branching, verified in one
forward, each sequence over a 128-token context (see tools/profiler.py).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from adaserve_backend.config import CacheConfig, EMBEDDED_DEFAULT, ModelConfig
from tools.profiler import measure_forward, timed_ms
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model

CONTEXT = 128


def measure_runner(runner: ModelRunner, sizes: list[int], repeats: int) -> dict[str, dict[int, float]]:
    dtype = str(runner.kv.data.dtype).removeprefix("torch.")
    return {
        "decode": measure_forward(runner, sizes, per_seq=1, context=CONTEXT, repeats=repeats, desc=f"{dtype} decode"),
        "tree": measure_forward(runner, sizes, per_seq=8, context=CONTEXT, repeats=repeats, desc=f"{dtype} tree"),
    }


@torch.inference_mode()
def measure_transformers(path: str, dtype: torch.dtype, repeats: int, vocab: int) -> float:
    from transformers import AutoModelForCausalLM

    from adaserve_backend.models.loader import locate

    loc = locate(path)
    model = AutoModelForCausalLM.from_pretrained(loc.directory, dtype=dtype, **loc.kwargs).eval()
    ids = torch.randint(0, vocab, (1, CONTEXT))
    out = model(ids, use_cache=True)
    cache = out.past_key_values

    def step():
        model(torch.randint(0, vocab, (1, 1)), past_key_values=cache, use_cache=True)
        cache.crop(-1)  # drop the token just added: every step sees the same context

    return timed_ms(step, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED_DEFAULT)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="results/forward_latency", help="writes OUT.json and OUT.png")
    args = ap.parse_args()
    sizes = [2**i for i in range(args.max_tokens.bit_length()) if 2**i <= args.max_tokens]
    results = {"model": args.model, "context": CONTEXT, "threads": torch.get_num_threads(), "dtypes": {}}
    for dtype in args.dtypes:
        model = load_model(ModelConfig(path=args.model, dtype=dtype, max_model_len=CONTEXT + 64))
        vocab = model.spec.vocab_size
        runner = ModelRunner(model, CacheConfig(block_size=16, memory_mb=1024))
        rows = measure_runner(runner, sizes, args.repeats)
        del runner, model
        rows["transformers_decode_1"] = measure_transformers(args.model, getattr(torch, dtype), args.repeats, vocab)
        results["dtypes"][dtype] = rows

    print(f"\nforward latency (ms, median of {args.repeats}), {results['threads']} threads, context {CONTEXT}")
    header = "tokens " + "".join(f"| {d} decode | {d} tree " for d in args.dtypes)
    print(header)
    for n in sizes:
        print(f"{n:6d} " + "".join(f"| {results['dtypes'][d]['decode'][n]:>{len(d) + 7}.1f} | {results['dtypes'][d]['tree'][n]:>{len(d) + 5}.1f} " for d in args.dtypes))
    for d in args.dtypes:
        print(f"transformers single-token decode ({d}): {results['dtypes'][d]['transformers_decode_1']:.1f} ms")

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in args.dtypes:
        r = results["dtypes"][d]
        ax.plot(sizes, [r["decode"][n] for n in sizes], "o-", label=f"{d} decode-style")
        ax.plot(sizes, [r["tree"][n] for n in sizes], "s--", label=f"{d} tree-style")
        ax.axhline(r["transformers_decode_1"], ls=":", color="gray")
        ax.annotate(f"transformers 1-token decode ({d})", (sizes[0], r["transformers_decode_1"]), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the batch")
    ax.set_ylabel("forward latency (ms)")
    ax.set_title("Model forward latency, " + os.path.basename(str(args.model)))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
