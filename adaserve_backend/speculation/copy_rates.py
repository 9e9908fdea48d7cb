"""Acceptance rates of the suffix index's proposals, learnt from verification.

A copied token's probability of being accepted depends on how much context matched and how the
earlier occurrences agreed (suffix_index.bucket); a fixed prior is right for one kind of
text and wrong for another. So each bucket's rate is its prior, as PRIOR_WEIGHT pseudo-observations,
plus what verification measured: every verified copied node whose parent was accepted is one trial,
accepted or not (a node below a rejected one says nothing about its own bucket). Old trials fade
(DECAY per trial of the bucket), so a change of traffic moves the rate within about 1/(1-DECAY)
trials. The selection then weighs each node by its rate: proposals that stop paying stop being
verified, and cost nothing but the lookup.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .token_tree import CandidateTree, TokenTree

PRIOR_WEIGHT = 4.0
DECAY = 0.995


class CopyRates:
    def __init__(self) -> None:
        self._trials: dict[Hashable, list[float]] = {}  # bucket -> [accepted, tried], both decayed
        self._prior: dict[Hashable, float] = {}

    def rate(self, key: Hashable, prior: float) -> float:
        """P(accepted | parent accepted) of a node in bucket `key`; `prior` where nothing was measured."""
        self._prior.setdefault(key, prior)
        hit, tried = self._trials.get(key, (0.0, 0.0))
        return (hit + PRIOR_WEIGHT * prior) / (tried + PRIOR_WEIGHT)

    def observe(self, cand: CandidateTree, tree: TokenTree, path: Sequence[int]) -> None:
        """One verification: `path`, the accepted nodes of `tree` (selected from `cand`)."""
        on_path = set(path)
        for i, (p, c) in enumerate(zip(tree.parents, tree.source)):
            key = cand.origin[c]
            if p >= 0 and key is not None and p in on_path:
                t = self._trials.setdefault(key, [0.0, 0.0])
                t[0] = DECAY * t[0] + (i in on_path)
                t[1] = DECAY * t[1] + 1.0

    def table(self) -> dict[Hashable, tuple[float, float]]:
        """Per bucket measured so far: (current rate, decayed trials), for benchmarks and tests."""
        return {k: (self.rate(k, self._prior.get(k, 0.5)), t[1]) for k, t in self._trials.items()}
