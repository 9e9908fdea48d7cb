"""Stage 1 of the draft's training: the target's own continuations of the training prompts.

    python -m tools.draft.generate --cache DIR [--prompts N] [--shard K --of M]

Prompts (tools/draft/data.py, held-out families excluded) are cut into shards of SHARD prompts; each
shard's continuations are saved as DIR/continuations-<i>.pt, so a cut-off run resumes where it
stopped and several processes (--shard K --of M) can share the work. 70% of the prompts are answered
greedily, the rest sampled at temperature 0.7 (the draft serves both). The served target dtype is
the one generating: what it writes is what the draft must predict.
"""

from __future__ import annotations

import argparse
import os
import random

import torch

from adaserve_backend.config import EMBEDDED_DEFAULT, ModelConfig
from adaserve_backend.models import load_model, load_tokenizer, locate
from tools.draft.data import build_prompts, encode
from tools.draft.teacher import continuations

SHARD = 250


def shard_path(cache: str, i: int) -> str:
    return os.path.join(cache, f"continuations-{i:03d}.pt")


def training_prompts(tokenizer, n: int, max_prompt_tokens: int, seed: int = 0):
    """(ids, family) of the first n training prompts, and each one's sampling temperature."""
    train, _ = build_prompts(seed=seed)
    pick = random.Random(seed)
    items = [(encode(tokenizer, p)[-max_prompt_tokens:], p.family) for p in train[:n]]
    temps = [0.0 if pick.random() < 0.7 else 0.7 for _ in items]
    return items, temps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--target", default=EMBEDDED_DEFAULT)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--of", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.cache, exist_ok=True)
    tokenizer = load_tokenizer(locate(args.target))
    items, temps = training_prompts(tokenizer, args.prompts, args.max_prompt_tokens)
    target = load_model(ModelConfig(path=args.target, dtype=args.dtype))
    for i in range(args.shard, (len(items) + SHARD - 1) // SHARD, args.of):
        path = shard_path(args.cache, i)
        if os.path.exists(path):
            continue
        part = items[i * SHARD : (i + 1) * SHARD]
        ids = [p for p, _ in part]
        outs = continuations(target, ids, args.max_new_tokens, temps[i * SHARD : (i + 1) * SHARD],
                             {tokenizer.eos_token_id}, batch=args.batch, seed_offset=i * SHARD)
        torch.save({"prompts": ids, "outputs": outs, "families": [f for _, f in part]}, path + ".tmp")
        os.replace(path + ".tmp", path)  # a shard is there whole or not at all


if __name__ == "__main__":
    main()
