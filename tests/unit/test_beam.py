"""Beam search (speculation/beam.py) against brute force on a tiny fake draft whose next-token logits
are a fixed function of the whole path: with a beam wide enough to keep every path it finds the global
top-w paths of each length; with a narrow beam, exactly what enumerating every extension of the kept
beam and ranking by path probability keeps."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from adaserve_backend.model_runner import ForwardOutput
from adaserve_backend.speculation.beam import BeamRequest, beam_search

VOCAB = 4


def logits_after(path: tuple[int, ...]) -> torch.Tensor:
    seed = 0
    for t in path:
        seed = (seed * 1_000_003 + t + 1) % 2**31
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def logp_after(path) -> torch.Tensor:
    return torch.log_softmax(logits_after(path), -1)


class FakeDraft:
    """The part of ModelRunner beam_search uses; each region token remembers its whole path."""

    model = SimpleNamespace(vocab_ids=None, takes_features=False)

    def __init__(self) -> None:
        self.paths: dict[int, list[tuple[int, ...]]] = {}

    def region_len(self, seq_id: int) -> int:
        return len(self.paths.get(seq_id, []))

    def forward(self, inputs) -> ForwardOutput:
        rows, offsets, tokens = [], [0], [0]
        for x in inputs:
            region = self.paths.setdefault(x.seq_id, [])
            n = len(x.token_ids)
            parents = x.parents if x.parents is not None else range(len(region) - 1, len(region) + n - 1)
            new = []
            for tok, p in zip(x.token_ids, parents):
                new.append((region[p] if p >= 0 else ()) + (tok,))
                region.append(new[-1])
            rows += [logits_after(path) for path in new[n - x.num_logits :]]
            offsets.append(offsets[-1] + x.num_logits)
            tokens.append(tokens[-1] + n)
        return ForwardOutput(torch.stack(rows), offsets, torch.zeros(tokens[-1], 1), tokens)


def levels(tree) -> dict[int, dict[tuple[int, ...], float]]:
    """Per depth, each node's tokens after the root and its score."""
    paths, out = [()], {}
    for j in range(1, len(tree.tokens)):
        paths.append(paths[tree.parents[j]] + (tree.tokens[j],))
        out.setdefault(len(paths[j]), {})[paths[j]] = tree.scores[j]
    return out


def brute_force_beam(chain: tuple[int, ...], depth: int, width: int) -> dict[int, dict[tuple[int, ...], float]]:
    beam, out = {(): 0.0}, {}
    for level in range(1, depth + 1):
        every = {p + (t,): lp + float(logp_after(chain + p)[t]) for p, lp in beam.items() for t in range(VOCAB)}
        beam = dict(sorted(every.items(), key=lambda kv: -kv[1])[:width])
        out[level] = {p: math.exp(lp) for p, lp in beam.items()}
    return out


@pytest.mark.parametrize("depth,width", [(3, 16), (3, 2), (4, 3)])
def test_beam_search_keeps_what_brute_force_keeps(depth, width):
    chains = [(5, 1, 2), (0, 3)]
    trees = beam_search(FakeDraft(), [BeamRequest(i, list(c)) for i, c in enumerate(chains)], depth, width)
    for chain, tree in zip(chains, trees):
        got, want = levels(tree), brute_force_beam(chain, depth, width)
        assert sorted(got) == sorted(want)
        for level in want:
            assert sorted(got[level]) == sorted(want[level]), level
            for path, score in want[level].items():
                assert got[level][path] == pytest.approx(score, rel=1e-5)


def test_a_beam_that_keeps_every_path_finds_the_global_top_paths():
    depth, width = 3, VOCAB ** 2  # levels 1 and 2 keep every path
    (tree,) = beam_search(FakeDraft(), [BeamRequest(0, [7, 7])], depth, width)
    every = {p: math.exp(sum(float(logp_after((7, 7) + p[:i])[p[i]]) for i in range(depth)))
             for p in itertools.product(range(VOCAB), repeat=depth)}
    top = sorted(every, key=lambda p: -every[p])[:width]
    assert sorted(levels(tree)[depth]) == sorted(top)
