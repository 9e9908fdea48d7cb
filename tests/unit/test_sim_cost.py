"""The simulator's cost models: the GPU model against the AdaServe authors' published verification
latencies (Llama-3.1-70B, 8x A100), its calibration, and the CPU model against the project's profile."""

from __future__ import annotations

import pytest

from adaserve_backend.sim.cost import CpuIterationCost, IterationShape, cpu_cost
from adaserve_backend.sim.gpu_cost import (EFFICIENCY, PUBLISHED_A100_TP8_LLAMA70B, GpuCost, calibrate, forward_s,
                                           published_shape)
from adaserve_backend.sim.hardware import A100, H100, LLAMA_1B, LLAMA_70B, QWEN_32B, deployment, kv_token_capacity


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
    shape = IterationShape(2, 3, 2, 2, 4, 10, 5, 0, 0, 0)
    spec, verify = cost.durations(shape)
    assert verify * 1e3 == pytest.approx(p.verify_ms(15))
    assert spec * 1e3 == pytest.approx(p.draft_step_ms(2) + 2 * p.draft_step_ms(4))
    assert isinstance(cost, CpuIterationCost)
