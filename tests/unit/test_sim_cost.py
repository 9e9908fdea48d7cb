"""The simulator's cost models: the GPU model against the AdaServe authors' published verification
latencies (Llama-3.1-70B, 8x A100), its calibration, and the CPU model against the project's profile."""

from __future__ import annotations

import pytest

from adaserve_backend.cost_model.step_cost import EngineStepCost
from sim.cost import CpuIterationCost, IterationShape, cpu_cost
from sim.gpu_cost import EFFICIENCY, PUBLISHED_A100_TP8_LLAMA70B, GpuCost, calibrate, forward_s, published_shape
from sim.hardware import A100, H100, LLAMA_1B, LLAMA_70B, QWEN_32B, deployment, kv_token_capacity


@pytest.mark.parametrize("tokens,ms", sorted(PUBLISHED_A100_TP8_LLAMA70B.items()))
def test_gpu_model_reproduces_published_verification_latency_within_15_percent(tokens, ms):
    predicted = forward_s(A100, LLAMA_70B, 8, tokens, *published_shape(tokens), EFFICIENCY[A100.name]) * 1e3
    assert abs(predicted / ms - 1) <= 0.15, f"{tokens} tokens: {predicted:.1f} ms vs published {ms} ms"


def test_the_shipped_efficiency_is_the_calibrated_one():
    assert calibrate(A100, LLAMA_70B, 8, PUBLISHED_A100_TP8_LLAMA70B) == pytest.approx(EFFICIENCY[A100.name], abs=0.005)


def test_model_shapes_match_published_parameter_counts():
    assert LLAMA_70B.params / 1e9 == pytest.approx(70.6, rel=0.02)
    assert LLAMA_1B.params / 1e9 == pytest.approx(1.24, rel=0.03)
    assert QWEN_32B.params / 1e9 == pytest.approx(32.8, rel=0.03)


def test_gpu_latency_grows_with_tokens_and_context_and_falls_with_faster_hardware():
    a100, h100 = GpuCost(A100, deployment("llama70b", 4)), GpuCost(H100, deployment("llama70b", 4))
    assert a100.target_s(64, 8192, 0) < a100.target_s(512, 8192, 0)
    assert a100.target_s(64, 8192, 0) < a100.target_s(64, 200_000, 0)
    assert h100.target_s(64, 8192, 0) < a100.target_s(64, 8192, 0)
    assert a100.draft_s(64, 8192, 0) < a100.target_s(64, 8192, 0) / 10
    # TP8 is faster than TP4 per forward, by less than 2x (all-reduces and fixed costs)
    tp8 = GpuCost(A100, deployment("llama70b", 8))
    assert a100.target_s(128, 0, 0) / 2 < tp8.target_s(128, 0, 0) < a100.target_s(128, 0, 0)


def test_gpu_profile_is_fitted_like_tools_profile_and_gives_a_budget():
    profile = GpuCost(A100, deployment("llama70b", 4)).profile()
    assert profile.budget > 16 and profile.verify_ms(1) > 20
    assert profile.verify_ms(256) > profile.verify_ms(16)


def test_kv_capacity_leaves_room_after_weights():
    tokens, _ = kv_token_capacity(A100, deployment("llama70b", 4))
    assert 100_000 < tokens < 1_000_000  # ~130 GB of KV at 0.31 MiB per token
    with pytest.raises(ValueError):
        kv_token_capacity(A100, deployment("llama70b", 1))


def test_cpu_cost_is_the_engine_configs_profile():
    cost, config = cpu_cost()
    assert config.speculation.profile_path.endswith("profile-cpu.json")
    p = cost.profile()
    assert cost.step == EngineStepCost.from_profile(config.speculation.profile_path) is not None
    shape = IterationShape(2, 3, 2, 2, 4, 10, 5, 700, 0, 0)
    spec, verify = cost.durations(shape)
    assert verify * 1e3 == pytest.approx(cost.step.ms(2, 700, 15, trees=2))
    assert spec * 1e3 == pytest.approx(cost.step.speculation_ms(p.draft_step_ms(2) + 2 * p.draft_step_ms(4), 3))
    assert isinstance(cost, CpuIterationCost)
    no_fit = CpuIterationCost(p)  # a profile taken without the whole-step fit: the rooflines alone
    assert [x * 1e3 for x in no_fit.durations(shape)] == pytest.approx([p.draft_step_ms(2)
                                                                        + 2 * p.draft_step_ms(4), p.verify_ms(15)])


def test_a_measured_runs_speed_scales_every_cpu_duration_and_the_calibrated_profile():
    """Calibrated as the engine calibrates at start, the simulated scheduler's rooflines are measured on
    the simulated machine (slower machine, slower rooflines, the same B); without calibration (the
    default) they stay the profile file's whatever the speed."""
    import dataclasses

    (cost, _), (slow, _) = (cpu_cost(speed=s) for s in (1.0, 1.25))
    cost, slow = (dataclasses.replace(c, calibrate=True) for c in (cost, slow))
    shape = IterationShape(4, 2, 2, 4, 8, 20, 16, 1200, 300, 0)
    assert slow.durations(shape) == pytest.approx([1.25 * x for x in cost.durations(shape)])
    fast_p, slow_p = cost.profile(), slow.profile()
    assert slow_p.budget == fast_p.budget and slow_p.verify_ms(32) == pytest.approx(1.25 * fast_p.verify_ms(32))
    # the calibration prices the forwards tools.profile times: a 32-token tree batch is 4 requests of 8
    assert fast_p.verify_ms(32) == pytest.approx(cost.step.ms(4, 4 * 128, 32, 4), rel=0.05)
    assert fast_p.draft_step_ms(16) == pytest.approx(cost.profile_model.draft_step_ms(16), rel=0.05)
    plain = [dataclasses.replace(c, calibrate=False) for c in (cost, slow)]
    assert plain[0].profile() == plain[1].profile() == cost.profile_model


def test_a_prefilling_request_costs_its_own_share_beside_its_tokens():
    cost, _ = cpu_cost()
    alone = IterationShape(8, 0, 1, 0, 0, 8, 16, 2000, 0, 0)
    with_one = IterationShape(8, 0, 1, 0, 0, 8, 16, 2000, 0, 0, num_prefill=1)
    assert (cost.durations(with_one)[1] - cost.durations(alone)[1]) * 1e3 == pytest.approx(cost.step.per_prefill_ms)


def test_cpu_steps_cost_more_with_requests_and_context_than_tokens_alone_say():
    """The point of the whole-step fit: at the batches the CPU serves under load, decode over long
    contexts costs more than the roofline of 8-token trees over 128-token contexts says."""
    cost, _ = cpu_cost()
    decode = lambda n, ctx: cost.durations(IterationShape(n, 0, 1, 0, 0, n, 0, n * ctx, 0, 0))[1]  # noqa: E731
    assert decode(24, 400) > decode(24, 100) > decode(8, 100)
    assert decode(24, 400) * 1e3 > cost.profile().verify_ms(24)


def test_step_fit_recovers_its_coefficients_and_stays_non_negative():
    truth = EngineStepCost(15.0, 0.5, 2.0, 0.15, 5.0)  # a prefilling request: 5 ms beside its tokens
    points = [{"n": n, "context": n * c, "new_tokens": n + p, "prefills": int(p > 0),
               "ms": truth.ms(n, n * c, n + p, prefills=int(p > 0))}
              for n in (1, 8, 16, 32) for c in (128, 512, 1024) for p in (0, 16, 128)]
    fit = EngineStepCost.fit(points)
    for got, want in zip(fit.to_dict().values(), truth.to_dict().values()):
        assert got == pytest.approx(want, abs=1e-6)
    # context that costs nothing but noise (slightly negative) is dropped, not priced below zero
    noisy = [{**p, "ms": p["ms"] - truth.per_1k_context_ms * p["context"] / 1e3
              - 1e-4 * p["context"] / 1e3} for p in points]
    fit = EngineStepCost.fit(noisy)
    assert fit.per_1k_context_ms == 0 and min(fit.to_dict().values()) >= 0


def test_speculative_terms_are_what_the_draft_roofline_and_the_step_fit_leave_over():
    step = EngineStepCost(15.0, 0.5, 2.0, 0.15)
    draft = lambda n, d, w: 1.0 * d + 0.1 * n * d  # noqa: E731  the draft's forwards alone
    points = [{"n": n, "depth": d, "width": 1, "verified": n * (d + 1), "prefill": 0, "context": n * 500,
               "spec_ms": draft(n, d, 1) + 2.0 + 1.5 * d, "verify_ms": step.ms(n, n * 500, n * (d + 1)) + 0.4 * n,
               "draft_ms": draft(n, d, 1)}
              for n in (1, 4, 8, 16) for d in (1, 2, 4)]
    fit = step.with_speculation(points)
    assert (fit.spec_base_ms, fit.spec_per_level_ms, fit.tree_per_request_ms) == pytest.approx((2.0, 1.5, 0.4))
    assert fit.speculation_ms(3.0, 2) == pytest.approx(3.0 + 2.0 + 3.0) and fit.speculation_ms(0.0, 0) == 0
    assert fit.ms(8, 4000, 24, trees=8) == pytest.approx(step.ms(8, 4000, 24) + 3.2)


def test_a_served_runs_iterations_give_the_step_fit_whole_steps_included():
    """EngineStepCost.from_iterations (sim.validate's in-run pricing): plain steps give the base fit, the
    speculating ones what the draft's steps (a step per level over the tokens it reads) and the tree add
    to a whole step; too few speculating steps keep the fallback's speculative terms, the draft then
    priced by its roofline."""
    truth = EngineStepCost(15.0, 0.5, 2.0, 0.15, 5.0, spec_base_ms=2.0, spec_per_level_ms=0.5, tree_per_request_ms=0.4,
                           draft_per_token_ms=0.04, draft_fitted=True)
    records = []
    for n in (1, 4, 8, 16, 24):
        for c in (128, 512):
            for p, k in ((0, 0), (16, 1), (128, 1), (256, 2)):
                for d, w in ((0, 0), (1, 4), (2, 2), (3, 4)):
                    chain = 2 * n + p  # caught-up chains and the prefill chunk ride along the first step
                    spec = truth.speculation_ms(0.0, d, chain + max(d - 1, 0) * n * w) if d else 0.0
                    verify = truth.ms(n, n * c, n * (d + 1) + p, trees=n if d else 0, prefills=k)
                    records.append({"n": n, "depth": d, "width": w, "verified": n * (d + 1),
                                    "prefill": p, "prefills": k,
                                    "context": n * c, "chain": chain, "spec_ms": spec, "step_ms": spec + verify})
    fit = EngineStepCost.from_iterations(records)
    for got, want in zip(fit.to_dict().values(), truth.to_dict().values()):
        assert got == pytest.approx(want, abs=1e-6)
    # a chain read alone
    assert fit.draft_step_ms(10) == pytest.approx(0.9) and fit.speculation_ms(0.0, 0, 10) == pytest.approx(0.9)
    fallback = EngineStepCost(0, 0, 0, 0, spec_base_ms=9.0, spec_per_level_ms=8.0, tree_per_request_ms=7.0)
    plain = EngineStepCost.from_iterations([r for r in records if not r["depth"]] + records[1:3], fallback)
    assert (plain.base_ms, plain.spec_base_ms, plain.tree_per_request_ms) == pytest.approx((15.0, 9.0, 7.0))
    assert plain.draft_step_ms(10) is None and plain.speculation_ms(3.0, 2, 50) == pytest.approx(3.0 + 9.0 + 16.0)
    # untimed: skipped
    assert EngineStepCost.from_iterations([{**r, "step_ms": 0.0} for r in records[:5]] + records) == fit


def test_validation_never_prices_a_run_with_its_own_level_iterations():
    from adaserve_backend.cost_model.cost_model import CostModel
    from sim.validate import held_out_step, level_of, sibling_speed

    _, config = cpu_cost()
    profile = CostModel.load(config.speculation.profile_path)
    def row(ms, rps, repeat=0):
        return {"policy": "adaserve", "rps": rps, "repeat": repeat,
                "iterations": [{"n": n, "depth": 0, "width": 0, "verified": n, "prefill": 0, "prefills": 0,
                                "context": 100 * n, "chain": 0, "spec_ms": 0.0, "step_ms": ms + n}
                               for n in range(1, 20)]}

    runs = [row(10.0, 4), row(10.0, 8), row(1000.0, 12)]
    assert held_out_step(runs, [1.0, 1.0, 1.0], 2, profile, None, level_of).base_ms == pytest.approx(10.0)
    assert held_out_step(runs, [1.0, 1.0, 1.0], 0, profile, None, level_of).base_ms > 100  # run 2 priced run 0
    # a twin repeat of the judged level prices nothing of it
    twins = [row(10.0, 4), row(1000.0, 8, 0), row(10.0, 8, 1)]
    assert held_out_step(twins, [1.0] * 3, 2, profile, None, level_of).base_ms == pytest.approx(10.0)
    # each run's times are taken at the profile's speed before fitting
    assert held_out_step([row(20.0, 4), row(10.0, 8)], [2.0, 1.0], 1, profile, None,
                         level_of).base_ms == pytest.approx(10.0)
    # speed from the twins: the median of the level's other repeats, never the run's own
    assert sibling_speed(twins + [row(0, 8, 2)], [0.5, 0.9, 0.7, 0.8], 1) == pytest.approx(0.75)
    assert sibling_speed(twins, [0.5, 0.9, 0.7], 0) is None


def test_the_simulated_scheduler_plans_with_the_rooflines_a_run_recorded():
    """A bench row keeps the rooflines its engine planned with (CostModel.to_dict, after the startup
    calibration); sim.validate hands them to the simulated scheduler as they were, before any other."""
    import dataclasses

    from adaserve_backend.cost_model.cost_model import CostModel

    cost, _ = cpu_cost()
    recorded = dataclasses.replace(cost.profile_model, budget=7)
    assert CostModel.from_dict(recorded.to_dict()) == recorded
    assert dataclasses.replace(cost, planned=recorded, calibrate=True).profile() == recorded
    assert cost.profile() == cost.profile_model
