"""Prompt lookup's acceptance priors (speculation/lookup.py HIT_RATE), measured on the target's own
continuations of draft training prompts (never benchmark prompts): at every output position, the
serving index's copy for the context so far, and how far the target's actual next tokens follow it.
Prints, per matched n-gram length and copy (latest occurrence, then the latest followed by another
token), P(copied token i is right | tokens 0..i-1 of that copy were).

    python -m tools.draft.lookup_rates [--cache .cache/draft] [--shards 4] [--max-n 5]
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from tqdm import tqdm

from adaserve_backend.speculation.lookup import HIT_RATE, MAX_COPIES, MAX_NGRAM, RATES, NgramIndex
from tools.draft.generate import shard_path


def rates(seqs: list[tuple[list[int], list[int]]], max_n: int, k: int, copies: int) -> dict[int, list[list[float]]]:
    """{n: per copy, [P(copied token i right | the ones before it in that copy were right) for i < k]}
    over every output position."""
    tried, hit = collections.Counter(), collections.Counter()
    for prompt, output in tqdm(seqs, desc="sequences"):
        seq, index = prompt + output, NgramIndex(max_n, copies)
        for t in range(len(prompt), len(seq)):
            n, copied = index.match(seq[:t], k)
            for rank, copy in enumerate(copied):
                for i, c in enumerate(copy[: len(seq) - t]):  # token i is tried once the ones before it were right
                    tried[n, rank, i] += 1
                    if seq[t + i] != c:
                        break
                    hit[n, rank, i] += 1
    return {n: [[round(hit[n, r, i] / tried[n, r, i], 3) if tried[n, r, i] else float("nan") for i in range(k)]
                for r in range(copies)] for n in range(1, max_n + 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=".cache/draft")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=6, help="copied tokens measured")
    ap.add_argument("--max-n", type=int, default=MAX_NGRAM, help="longest suffix matched")
    ap.add_argument("--copies", type=int, default=MAX_COPIES)
    args = ap.parse_args()
    seqs = []
    for i in range(args.shards):
        shard = torch.load(shard_path(args.cache, i), weights_only=False)
        seqs += list(zip(shard["prompts"], shard["outputs"]))
    measured = rates(seqs, args.max_n, args.tokens, args.copies)
    print(json.dumps({"measured": measured, "shipped": {n: [list(t[n]) for t in RATES if n in t] for n in HIT_RATE}}))


if __name__ == "__main__":
    main()
