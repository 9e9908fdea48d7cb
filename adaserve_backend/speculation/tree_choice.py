"""Which draft tokens each decoding request verifies this iteration: all of them (`spec:N`), or the
SLO-customized and throughput-optimized selection within budget B (the paper's Algorithm 2)."""

from __future__ import annotations

from ..config import SpeculationConfig
from ..scheduler.plan import IterationPlan
from ..scheduler.policies import Policy
from ..scheduler.prefill_estimator import Estimator
from ..scheduler.speculation_size import ROOT_CREDIT, acceptance_caps
from .selection import SelectionParams, expected_accepted, select_tokens
from .token_tree import CandidateTree, TokenTree


def choose_trees(
    plan: IterationPlan, cands: list[CandidateTree], policy: Policy, estimator: Estimator, spec: SpeculationConfig
) -> list[TokenTree]:
    if not cands:  # no speculation: each request decodes its next token
        return [TokenTree.chain([s.tokens[-1]]) for s in plan.decode]
    if policy.verify_whole_draft:
        return [TokenTree.from_selection(c, list(range(len(c)))) for c in cands]
    n, depth = len(plan.decode), plan.depth
    a_caps = acceptance_caps(plan.decode, [c.height() for c in cands], plan.start,
                             estimator.iteration_s(n, depth, plan.width), estimator.tpot_at(1))
    iteration_ms, cost = None, estimator.cost
    if cost and spec.goodput_selection:
        draft_ms, prefill = cost.draft_ms(n, depth, plan.width), plan.prefill_tokens

        def iteration_ms(tree_tokens: int) -> float:
            return draft_ms + cost.verify_ms(tree_tokens + prefill)

    params = SelectionParams(max(estimator.budget, n), spec.n_max, iteration_ms, estimator.calibration())
    selections = select_tokens(cands, a_caps, params)
    if depth:  # the draft's calibration is measured on iterations that draft (Estimator.record)
        estimator.record_selection(sum(expected_accepted(c, nodes) - ROOT_CREDIT
                                       for c, nodes in zip(cands, selections)))
    return [TokenTree.from_selection(c, nodes) for c, nodes in zip(cands, selections)]
