"""sim.calibration: a run's speed read off its own steps, and the acceptance table scaled to what
calibration runs produced per verification (no model, no simulation)."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.step_cost import EngineStepCost
from sim.acceptance import acceptance_model
from sim.calibration import calibrated_acceptance, speculating_runs, steps_speed

STEP = EngineStepCost(base_ms=10.0, per_request_ms=1.0, per_1k_context_ms=2.0,
                      per_extra_token_ms=0.5, tree_per_request_ms=1.0)


def record(n, context, verified, depth=0, spec_ms=0.0, factor=1.0):
    target = STEP.ms(n, context, verified, n if depth else 0)
    return {"n": n, "context": context, "verified": verified, "prefill": 0, "prefills": 0, "depth": depth,
            "width": 2 if depth else 0,
            "chain": 0, "spec_ms": spec_ms, "step_ms": factor * target + spec_ms}


def test_a_runs_speed_is_its_steps_over_the_fits_price_of_the_same_steps():
    # decodes and speculating steps (whose drafting is not the target's part) on a machine 1.3x slower
    its = [record(n, 100 * n, n)
           for n in range(1, 9)] + [record(n, 100 * n, 4 * n, depth=2, spec_ms=7.0) for n in range(1, 5)]
    assert steps_speed({"iterations": [{**r, "step_ms": 1.3 * (r["step_ms"] - r["spec_ms"]) + r["spec_ms"]}
                                       for r in its]}, STEP) == pytest.approx(1.3)
    assert steps_speed({"iterations": its}, STEP) == pytest.approx(1.0)
    # a slow tail counts by its time: one step in four twice as long is 1.25x the time, not the median's 1x
    tail = [{**r, "step_ms": 2 * r["step_ms"]} if i % 4 == 0 else r
            for i, r in enumerate(record(8, 800, 8) for _ in range(8))]
    assert steps_speed({"iterations": tail}, STEP) == pytest.approx(1.25)
    with pytest.raises(SystemExit, match="recorded no iterations"):
        steps_speed({"policy": "adaserve", "rps": 4.0, "iterations": []}, STEP)


def test_a_step_that_drafts_nothing_is_measured_whole_as_the_fit_prices_it():
    # the engine's spec_ms of a step without drafts is its scheduling, copies and selection, which
    # from_iterations fits into the target's terms: the speed must not leave it out, or every run that
    # spends more time there (adaserve under load) is simulated that much fast
    overhead = 0.15  # ms per decoding request before the forward
    def undrafted(n, factor=1.0):
        r = record(n, 100 * n, n)
        return {**r, "spec_ms": factor * overhead * n, "step_ms": factor * (r["step_ms"] + overhead * n)}
    fit = EngineStepCost.from_iterations([undrafted(n) for n in range(1, 33)])
    slower = [undrafted(n, factor=1.3) for n in range(1, 33)]
    assert steps_speed({"iterations": slower}, fit) == pytest.approx(1.3)
    priced = sum(fit.ms(r["n"], r["context"], r["verified"]) for r in slower) * steps_speed({"iterations": slower}, fit)
    assert priced == pytest.approx(sum(r["step_ms"] for r in slower))


def test_acceptance_is_scaled_until_the_simulated_tokens_per_verification_match():
    model = acceptance_model("engine")
    runs = [{"mean_accepted_per_verify": 1.5}, {"mean_accepted_per_verify": 1.7}]
    # a stand-in for the simulator: tokens per verification grow with the top-1 rate
    predict = lambda m: [1 + 2 * m.rates[0], 1 + 2 * m.rates[0]]  # noqa: E731
    scaled, factor = calibrated_acceptance(model, runs, predict, rounds=20)
    assert 1 + 2 * scaled.rates[0] == pytest.approx(1.6, abs=1e-3)
    assert factor == pytest.approx(0.3 / model.rates[0], rel=1e-3)
    assert speculating_runs(runs + [{"mean_accepted_per_verify": 1.05}, {}]) == runs
