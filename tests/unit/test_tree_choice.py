"""speculation/tree_choice.py: which draft tokens each decoding request verifies, from the plan and
the estimator's predictions (no model; requests on a fake clock as in test_scheduler.py)."""

from __future__ import annotations

from adaserve_backend.config import SpeculationConfig
from adaserve_backend.scheduler.plan import IterationPlan
from adaserve_backend.scheduler.policies import make_policy
from adaserve_backend.scheduler.prefill_estimator import Estimator
from adaserve_backend.speculation.token_tree import CandidateTree
from adaserve_backend.speculation.tree_choice import choose_trees
from tests.unit.test_decode_estimator import COST
from tests.unit.test_scheduler import START, decoding, seq


def test_the_slo_phase_forces_no_nodes_for_a_request_that_cannot_make_its_slo_anyway():
    """Two requests behind schedule with the same tight target: the one that can still catch up at a lone
    request's pace gets its SLO-phase nodes; the one too far behind only what the throughput phase pays
    for, which with a flat-cost-free budget of zero is nothing."""
    spec = SpeculationConfig(budget=3, goodput_selection=False)
    est = Estimator.for_policy(COST, 3, make_policy("adaserve"), spec)
    lone = est.tpot_at(1)  # unmeasured: one iteration at the policy's depth yielding one token
    catching_up = decoding(seq(lone * 1e3 * 1.5, max_tokens=400), decoded=10, elapsed_s=lone * 1.5 * 11)
    hopeless = decoding(seq(lone * 1e3 * 1.5, max_tokens=14), decoded=10, elapsed_s=lone * 1.5 * 20)
    chain = lambda: CandidateTree([7, 8, 9, 10], [-1, 0, 1, 2], [1.0, 0.9, 0.8, 0.7], [0, 1, 2, -1])  # noqa: E731
    for order in ([catching_up, hopeless], [hopeless, catching_up]):
        plan = IterationPlan(START, decode=order, depth=3, width=1)
        trees = choose_trees(plan, [chain(), chain()], make_policy("adaserve"), est, spec)
        sizes = {s.request.request_id: len(t.tokens) for s, t in zip(order, trees)}
        assert sizes[catching_up.request.request_id] == 2 and sizes[hopeless.request.request_id] == 1
