"""How often our bfloat16 greedy output equals `transformers` bfloat16 greedy `generate`, token for token
over N tokens, on held-out benchmark prompts, one request at a time. (float32 is the exact oracle and
is tested for equality in the test suite; bfloat16 rounds differently in every GEMM, so near-ties can
flip and the sequences part from there.)

    python -m benchmarks.bf16_agreement --prompts 30 --tokens 64 --out results/bf16_agreement.json
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from tqdm import tqdm

from adaserve_backend.config import EngineConfig
from adaserve_backend.request import Request
from benchmarks.one_request import ENGINE_JSON, held_out_prompts, prompt_texts, served_engine, transformers_model


@torch.inference_mode()
def reference_outputs(path: str, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    hf = transformers_model(path, torch.bfloat16)
    outs = []
    for ids in tqdm(prompts, desc="transformers bf16", leave=False):
        out = hf.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        outs.append(out[0, len(ids):].tolist())
    return outs


def engine_outputs(policy: str, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    engine = served_engine(policy, "bfloat16")
    outs = []
    for i, ids in enumerate(tqdm(prompts, desc=f"ours {policy} bf16", leave=False)):
        engine.add_request(Request(f"a{i}", ids, max_tokens=tokens, min_tokens=tokens))
        outs.append(engine.run_until_done()[f"a{i}"])
    return outs


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--policies", nargs="+", default=["continuous", "adaserve"])
    ap.add_argument("--out", default="results/bf16_agreement.json")
    args = ap.parse_args()
    cfg = EngineConfig.from_json(str(ENGINE_JSON))
    from adaserve_backend.models import load_tokenizer, locate

    tokenizer = load_tokenizer(locate(cfg.target.path))
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompt_texts(tokenizer, held_out_prompts(args.prompts))]
    reference = reference_outputs(cfg.target.path, prompts, args.tokens)
    results = {"prompts": args.prompts, "tokens": args.tokens, "policies": {}}
    for policy in args.policies:
        ours = engine_outputs(policy, prompts, args.tokens)
        prefixes = [common_prefix(a, b) for a, b in zip(ours, reference)]
        results["policies"][policy] = {
            "identical_share": sum(p == args.tokens for p in prefixes) / len(prefixes),
            "mean_common_prefix": sum(prefixes) / len(prefixes),
            "common_prefixes": prefixes,
        }
        r = results["policies"][policy]
        print(f"{policy}: {r['identical_share']:.0%} of {args.prompts} prompts identical over {args.tokens} tokens "
              f"(mean common prefix {r['mean_common_prefix']:.1f})")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
