"""Measure forward latency against the number of tokens in the batch, on the current device."""

from __future__ import annotations

import random
import statistics
import time

import torch
from tqdm import tqdm

from adaserve_backend.model_runner import ModelRunner, SeqInput


def timed_ms(fn, repeats: int) -> float:
    """Median wall time of `fn` in ms, after one warm-up call (synchronising CUDA if in use)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def tree_parents(n: int, rng: random.Random) -> list[int]:
    """A random branching token tree of n nodes (each node under one of the three before it)."""
    return [-1] + [rng.randrange(max(0, i - 3), i) for i in range(1, n)]


def measure_forward(
    runner: ModelRunner,
    sizes: list[int],
    per_seq: int,
    context: int = 128,
    repeats: int = 5,
    desc: str = "profiling",
) -> dict[int, float]:
    """Latency (ms) of one forward holding `n` new tokens for each n in `sizes`, spread over
    ceil(n / per_seq) sequences of `context` committed tokens: per_seq=1 is a decode batch, larger
    values are token trees of that size (verification, draft beam steps). Regions are rolled back after
    every forward, so each repetition sees the same cache."""
    rng = random.Random(0)
    vocab = runner.model.spec.vocab_size
    num_seqs = -(-max(sizes) // per_seq)
    base = 1 << 30  # sequence ids no engine uses

    def features(k: int) -> torch.Tensor | None:  # what a feature-conditioned draft reads; values do not matter
        return torch.zeros(k, runner.model.spec.hidden_size) if runner.model.takes_features else None

    for s in range(num_seqs):
        runner.forward([SeqInput(base + s, [rng.randrange(vocab) for _ in range(context)], num_logits=0, features=features(context))])
        runner.commit_all(base + s)

    def batch(n: int) -> list[SeqInput]:
        sizes_ = [per_seq] * (n // per_seq) + ([n % per_seq] if n % per_seq else [])
        return [
            SeqInput(base + s, [rng.randrange(vocab) for _ in range(k)], tree_parents(k, rng), k, features(k))
            for s, k in enumerate(sizes_)
        ]

    def run(inputs: list[SeqInput]) -> None:
        runner.forward(inputs)
        for x in inputs:
            runner.commit(x.seq_id, [])

    out = {}
    for n in tqdm(sizes, desc=desc, leave=False):
        inputs = batch(n)
        out[n] = timed_ms(lambda: run(inputs), repeats)
    for s in range(num_seqs):
        runner.free(base + s)
    return out
