"""Tree acceptance is lossless with top-k / top-p sampling: whatever the draft proposed, the emitted
tokens follow the target's own filtered distribution (chi-square against an oracle computed here with
numpy, not with the production filter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from adaserve_backend.request import SamplingParams
from adaserve_backend.sampling import choose_token
from adaserve_backend.speculation.acceptance import accept
from adaserve_backend.speculation.token_tree import TokenTree

VOCAB = 8
SAMPLES = 20_000


def filtered(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The target's distribution after temperature, then top-k, then top-p (smallest prefix of the
    sorted distribution whose mass reaches top_p)."""
    z, vocab = logits / p.temperature, len(logits)
    order = np.argsort(-z)
    keep = np.zeros(vocab, dtype=bool)
    keep[order[: p.top_k or vocab]] = True
    probs = np.where(keep, np.exp(z - z.max()), 0.0)
    probs /= probs.sum()
    mass, kept = 0.0, np.zeros(vocab, dtype=bool)
    for t in np.argsort(-probs):
        if mass >= p.top_p:
            break
        kept[t], mass = True, mass + probs[t]
    probs = np.where(kept, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=3, seed=0),
    SamplingParams(temperature=1.0, top_p=0.7, seed=0),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.8, seed=0),
], ids=["top_k", "top_p", "both"])
def test_acceptance_emits_the_filtered_target_distribution(params):
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.5, size=(4, VOCAB)).astype(np.float32)  # one row per tree node
    exact = [filtered(row, params) for row in logits]
    # the draft proposes the root's most likely token (kept by the filters) and its least likely one
    # (filtered out: the target can never accept it), the former with a child of its own
    likely, unlikely = int(np.argmax(exact[0])), int(np.argmin(logits[0]))
    assert exact[0][unlikely] == 0
    tree = TokenTree(tokens=[1, likely, unlikely, 3], parents=[-1, 0, 0, 1], source=[0, 1, 2, 3])
    gen, table = torch.Generator().manual_seed(0), torch.from_numpy(logits)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(SAMPLES):
        out = accept(tree, lambda node: choose_token(table[node], params, gen)).tokens
        counts[tuple(out[:2])] = counts.get(tuple(out[:2]), 0) + 1
    # the law of (first token, second token if the first was accepted): the target's own sampling
    probs = {}
    for a in range(VOCAB):
        if a == likely:
            for b in range(VOCAB):
                probs[(a, b)] = exact[0][a] * exact[1][b]
        else:
            probs[(a,)] = exact[0][a]
    assert set(counts) <= {k for k, v in probs.items() if v > 0}, "a token the filters remove was emitted"
    stat = sum((counts.get(k, 0) - v * SAMPLES) ** 2 / (v * SAMPLES) for k, v in probs.items() if v > 0)
    dof = sum(v > 0 for v in probs.values()) - 1
    assert chi2.sf(stat, dof) > 1e-3
    unfiltered = np.exp(logits[0]) / np.exp(logits[0]).sum()  # the test has power: not the raw softmax
    first = np.bincount([k[0] for k, n in counts.items() for _ in range(n)], minlength=VOCAB) / SAMPLES
    assert np.abs(first - unfiltered).sum() > 0.05


def test_a_tiny_temperature_gives_the_argmax_not_nan():
    """1e-40 is a float32 denormal: logits / it overflowed, and inf - inf made every probability NaN."""
    import torch

    from adaserve_backend.request import SamplingParams
    from adaserve_backend.sampling import target_probs

    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0 - 1e-3]])
    for t in (1e-40, 1e-30, 1e-8):
        p = target_probs(logits, SamplingParams(temperature=t))
        assert torch.isfinite(p).all() and p.argmax().item() == 1 and p.sum().item() == pytest.approx(1.0)
