"""Token selection, as pure functions over candidate trees (the paper's Algorithms 1 and 2).

Budget accounting: every tree's root costs one token of the budget B (it is verified too and yields
the bonus token), and counts 1.0 toward the request's expected accepted tokens.
Ties between equal scores are broken by node index, so a parent (same or higher score, lower index)
is always taken before its child: every selected set is a connected subtree containing the root.

Nodes from the suffix index (CandidateTree.origin set) carry learnt acceptance rates, not draft
scores, so the draft's calibration does not scale them; and where a cost model prices
every verified token (goodput selection), they may go past B: a copied chain that verification
accepts whole yields many tokens for one forward, which a budget sized for the draft's beams would cut.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..scheduler.speculation_size import ROOT_CREDIT
from .token_tree import CandidateTree


@dataclass(frozen=True)
class SelectionParams:
    budget: int  # B: tokens verified this iteration, roots included
    n_max: int  # largest tree (root included) the SLO-customized phase may build for one request
    # Predicted ms of the iteration when verifying this many tree tokens. When given, the throughput
    # phase verifies only the share of the remaining budget that maximizes expected tokens per ms.
    iteration_ms: Callable[[int], float] | None = None
    calibration: float = 1.0  # measured accepted / predicted: scales scores into acceptance probabilities

    def probability(self, score: float, copied: bool = False) -> float:
        return acceptance(score, 1.0 if copied else self.calibration)


def acceptance(score: float, calibration: float = 1.0) -> float:
    """A node's acceptance probability: its draft score times the calibration, at most 1."""
    return min(1.0, score * calibration)


def select_tokens(
    cands: Sequence[CandidateTree], a_caps: Sequence[float], params: SelectionParams
) -> list[list[int]]:
    """Algorithm 2's selection phases. Returns, per request, the selected candidate node indices
    (sorted, root first). Requests beyond the budget get only their root."""
    selected, budget = slo_customized_selection(cands, a_caps, params)
    return throughput_selection(cands, selected, budget, params)


def slo_customized_selection(
    cands: Sequence[CandidateTree], a_caps: Sequence[float], params: SelectionParams
) -> tuple[list[list[int]], int]:
    """Each request, the largest A_cap first (as the paper), takes its best nodes until its expected
    accepted tokens reach A_cap, its tree holds n_max nodes, or the budget is spent. Returns the
    selections and the budget left."""
    n = len(cands)
    selected: list[list[int]] = [[0] for _ in range(n)]
    budget = params.budget - n
    for i in sorted(range(n), key=lambda i: a_caps[i], reverse=True):
        origin = cands[i].origin
        acc, heap = ROOT_CREDIT, [(-s, j) for j, s in enumerate(cands[i].scores) if j != 0]
        heapq.heapify(heap)
        while acc < a_caps[i] and len(selected[i]) < params.n_max and budget > 0 and heap:
            neg, j = heapq.heappop(heap)
            selected[i].append(j)
            acc += params.probability(-neg, origin[j] is not None)
            budget -= 1
    return selected, max(budget, 0)


def throughput_selection(
    cands: Sequence[CandidateTree], selected: Sequence[list[int]], budget: int, params: SelectionParams | None = None
) -> list[list[int]]:
    """The remaining budget goes to the globally highest-scoring nodes not yet selected; with a cost
    model, only as many of them as raise expected tokens per ms (`goodput_prefix`), copied nodes also
    past the budget (their parents first)."""
    out = [list(s) for s in selected]
    goodput = params is not None and params.iteration_ms is not None
    if budget > 0 or goodput:
        taken = [set(s) for s in selected]
        heap = [(-s, i, j) for i, c in enumerate(cands) for j, s in enumerate(c.scores) if j not in taken[i]]
        if not goodput:
            ranked = heapq.nsmallest(budget, heap)
        else:
            ranked = []
            for neg, i, j in sorted(heap):
                copied = cands[i].origin[j] is not None
                if (copied or budget > 0) and cands[i].parents[j] in taken[i]:
                    ranked.append((neg, i, j))
                    taken[i].add(j)
                    budget -= not copied
            base = sum(len(s) for s in out)
            expected = sum(expected_accepted(cands[i], s, params.calibration) for i, s in enumerate(out))
            gains = [params.probability(-neg, cands[i].origin[j] is not None) for neg, i, j in ranked]
            ranked = ranked[: goodput_prefix(base, expected, gains, params.iteration_ms)]
        for _, i, j in ranked:
            out[i].append(j)
    return [sorted(s) for s in out]


def goodput_prefix(tokens: int, expected: float, gains: Sequence[float], iteration_ms: Callable[[int], float]) -> int:
    """How many of the next nodes (their acceptance probabilities, best first) to verify on top of
    `tokens` already selected that yield `expected` tokens: the count with the most expected tokens per
    ms of the iteration. Within the hardware's flat region every node is free, so all are taken."""
    best, best_rate = 0, expected / iteration_ms(tokens)
    for k, gain in enumerate(gains, 1):
        expected += gain
        rate = expected / iteration_ms(tokens + k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def expected_accepted(tree: CandidateTree, nodes: Sequence[int], calibration: float = 1.0) -> float:
    """E[acc(T)] = sum of f(v) over the tree (the root counting 1.0), f = the calibrated score."""
    return ROOT_CREDIT + math.fsum(acceptance(tree.scores[j], 1.0 if tree.origin[j] is not None else calibration)
                                   for j in nodes if j != 0)
