"""A simulated deployment from names: `cpu` (the profiled CPU, the served engine config and its profile) or
`a100x4` / `h100x8` with `llama70b` / `qwen32b`; the scheduler and speculation settings, KV capacity,
cost model, acceptance model and the SLO targets that go with it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from adaserve_backend.config import SchedulerConfig, SpeculationConfig
from adaserve_backend.kv_cache.kv_cache import bytes_per_block
from harness.slo_targets import SloTargets

from .acceptance import DEFAULT_FOR_MODEL, AcceptanceModel, acceptance_model
from .cost import ENGINE_JSON, GpuIterationCost, IterationCost, cpu_cost
from .hardware import deployment, kv_token_capacity, parse_hardware
from .replica import ReplicaConfig
from .workload import paper_slos

# SmolLM2-135M (the served target): 30 layers, 3 KV heads of 64; bf16 KV as served.
CPU_TARGET_KV = (30, 3, 64)
# GPU serving settings (vLLM-like defaults for a 70B deployment): more sequences, larger chunks.
GPU_SCHEDULER = dict(max_num_seqs=128, prefill_chunk=512, token_budget=512)


@dataclass(frozen=True)
class Scenario:
    name: str
    replica: ReplicaConfig
    cost: IterationCost
    acceptance: AcceptanceModel
    slos: SloTargets
    prompt_scale: str  # workload.PROMPT_TOKENS key
    baseline_tpot_ms: float


def scenario(hardware: str, model: str = "llama70b", policy: str = "adaserve", acceptance: str | None = None,
             max_slowdown: float = 1.3, slo_mode: str = "absolute", engine_json: str = ENGINE_JSON,
             cpu_speed: float = 1.0, **scheduler_overrides) -> Scenario:
    """`max_slowdown` sets B on GPUs as `tools.profile --max-slowdown` does (the CPU keeps its profile's);
    `slo_mode`: the paper's TPOT targets as stated or in proportion to the baseline (workload.paper_slos);
    `engine_json`: the CPU's engine config (its scheduler settings and the profile it points at);
    `cpu_speed`: the machine's speed during a measured run, relative to its profile (cost.CpuIterationCost)."""
    if hardware == "cpu":
        return _cpu(policy, acceptance, engine_json, cpu_speed, scheduler_overrides)
    gpu, count = parse_hardware(hardware)
    dep = deployment(model, count)
    cost = GpuIterationCost(gpu, dep, max_slowdown=max_slowdown)
    profile = cost.profile()
    target_tokens, draft_tokens = kv_token_capacity(gpu, dep)
    sched = SchedulerConfig(policy=policy, **{**GPU_SCHEDULER, **scheduler_overrides})
    replica = ReplicaConfig(sched, SpeculationConfig(budget=profile.budget), target_tokens // 16, draft_tokens // 16)
    baseline = profile.verify_ms(1)  # one request decoding one token per iteration: the paper's baseline TPOT
    return Scenario(f"{hardware}-{model}-tp{dep.tp}", replica, cost,
                    acceptance_model(acceptance or DEFAULT_FOR_MODEL[model]),
                    paper_slos(baseline, mode=slo_mode), "paper", baseline)


def _cpu(policy: str, acceptance: str | None, engine_json: str, speed: float, overrides: dict) -> Scenario:
    cost, config = cpu_cost(engine_json, speed)
    sched = dataclasses.replace(config.scheduler, policy=policy, **overrides)
    cache = config.target_cache
    per_block = bytes_per_block(*CPU_TARGET_KV, cache.block_size, _bf16())
    blocks = cache.memory_mb * 2**20 // per_block
    # the trained draft has a fraction of the target's layers: its own cache never binds first
    replica = ReplicaConfig(sched, config.speculation, blocks, 4 * blocks, cache.block_size,
                            config.target.max_model_len,
                            cache.prefix_caching and config.draft_cache.prefix_caching)
    slos = SloTargets(tpot_ms={c.name: c.tpot_ms for c in sched.slo_classes},
                      ttft_ms={c.name: c.ttft_ms for c in sched.slo_classes})
    return Scenario("cpu", replica, cost, acceptance_model(acceptance or "engine"), slos, "cpu",
                    cost.profile().verify_ms(1))


def _bf16():
    import torch

    return torch.bfloat16
