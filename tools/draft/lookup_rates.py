"""Prompt lookup's acceptance priors (speculation/lookup.py HIT_RATE), measured on the target's own
continuations of draft training prompts (never benchmark prompts): at every output position, the
serving index's copy for the context so far, and how far the target's actual next tokens follow it.
Prints, per matched n-gram length, P(copied token i is right | tokens 0..i-1 of the copy were).

    python -m tools.draft.lookup_rates [--cache .cache/draft] [--shards 4] [--max-n 5]
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from tqdm import tqdm

from adaserve_backend.speculation.lookup import HIT_RATE, MAX_NGRAM, NgramIndex
from tools.draft.generate import shard_path


def rates(seqs: list[tuple[list[int], list[int]]], max_n: int, k: int) -> dict[int, list[float]]:
    """{n: [P(copied token i right | the ones before it in the copy were right) for i < k]} over every
    output position."""
    tried, hit = collections.Counter(), collections.Counter()
    for prompt, output in tqdm(seqs, desc="sequences"):
        seq, index = prompt + output, NgramIndex(max_n)
        for t in range(len(prompt), len(seq)):
            n, copy = index.match(seq[:t], k)
            for i, c in enumerate(copy[: len(seq) - t]):  # token i is tried once the ones before it were right
                tried[n, i] += 1
                if seq[t + i] != c:
                    break
                hit[n, i] += 1
    return {n: [round(hit[n, i] / tried[n, i], 3) if tried[n, i] else float("nan") for i in range(k)]
            for n in range(1, max_n + 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=".cache/draft")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=6, help="copied tokens measured")
    ap.add_argument("--max-n", type=int, default=MAX_NGRAM, help="longest suffix matched")
    args = ap.parse_args()
    seqs = []
    for i in range(args.shards):
        shard = torch.load(shard_path(args.cache, i), weights_only=False)
        seqs += list(zip(shard["prompts"], shard["outputs"]))
    measured = rates(seqs, args.max_n, args.tokens)
    print(json.dumps({"measured": measured, "shipped": {n: list(r) for n, r in HIT_RATE.items()}}))


if __name__ == "__main__":
    main()
