"""The simulated iteration's duration, from a cost model, and the profile the scheduler is given.

Two kinds: `CpuIterationCost`, the CPU as the project profiled it (the profile JSON the engine
config points at: the draft's steps from its roofline, the target's from the whole-engine-step fit
`tools.profile` stores beside the rooflines, which prices decoding requests and the context they read;
the engine's scheduler sees only the rooflines and corrects them with what it measures, as the
engine does), and
`GpuIterationCost`, first principles (gpu_cost.py), where the duration also grows with the KV the batch
reads while the scheduler's profile (fitted like tools.profile) does not know about context: the
estimator's measured correction has to absorb that, as on real hardware.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from adaserve_backend.config import EngineConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import fit_roofline, pick_budget
from adaserve_backend.cost_model.step_cost import EngineStepCost, drafted_tokens
from adaserve_backend.profiler import CALIBRATION_TOKENS

from .gpu_cost import GpuCost
from .hardware import Deployment, Gpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE_JSON = os.path.join(REPO, "model_repository", "adaserve", "1", "engine.json")


@dataclass(frozen=True)
class IterationShape:
    """What an iteration computes. Contexts are cached tokens summed over requests; `attended` counts
    query-key pairs of the verification forward."""

    num_decode: int
    depth: int
    width: int
    chain_tokens: int  # the draft's first step: every request's uncached chain (prefill chains included)
    beam_tokens: int  # each later draft step: the previous level's nodes
    tree_tokens: int  # verified tree tokens, roots included
    prefill_tokens: int
    target_context: int
    draft_context: int
    attended: int
    num_prefill: int = 0  # requests with a prefill chunk in it


class IterationCost(Protocol):
    name: str

    def profile(self) -> CostModel: ...

    def durations(self, shape: IterationShape) -> tuple[float, float]:
        """(speculation s, verification s)."""


@dataclass(frozen=True)
class CpuIterationCost:
    profile_model: CostModel
    step: EngineStepCost | None = None  # None (a profile without the fit): the target's roofline alone
    name: str = "cpu"
    # The machine's speed during the run simulated, as a factor on every duration (a measured run's
    # speed probe over the profile's same forwards: adaserve_backend.profiler.probe_ms, sim.validate).
    speed: float = 1.0
    # As the engine with `speculation.calibrate`: the scheduler's rooflines measured at start on the
    # machine it runs on (here the simulated one, calibrated_profile) instead of read from the profile
    # file. Off by default although the served engine.json calibrates: on, the simulated iterations
    # under load matched the served ones better and the attainment predicted worse (evidence:
    # docs/experiments.md#sim-calibrated-rooflines), so something else still compensates.
    calibrate: bool = False
    # The rooflines the served engine planned with, as a bench run recorded them (its calibration at
    # start): the simulated scheduler is given them as they were; before `calibrate` and the file's.
    planned: CostModel | None = None

    def profile(self) -> CostModel:
        if self.planned is not None:
            return self.planned
        return calibrated_profile(self) if self.calibrate else self.profile_model

    def verify_forward_ms(self, tokens: int, per_seq: int = 8, context: int = 128) -> float:
        """A verification forward of `tokens` tree tokens over ceil(tokens / per_seq) requests of
        `context` cached tokens each (what profiler.measure_forward times), on the simulated machine."""
        if not self.step:
            return self.profile_model.verify_ms(tokens) * self.speed
        k = -(-tokens // per_seq)
        return self.step.ms(k, k * context, tokens, k) * self.speed

    def durations(self, s: IterationShape) -> tuple[float, float]:
        c = self.profile_model
        spec = 0.0
        if s.chain_tokens:
            spec = c.draft_step_ms(s.chain_tokens) + max(s.depth - 1, 0) * c.draft_step_ms(s.beam_tokens)
        new_tokens = s.tree_tokens + s.prefill_tokens
        if not self.step:
            spec_ms, verify_ms = spec, c.verify_ms(new_tokens)
        else:
            trees = s.num_decode if s.depth else 0
            drafted = drafted_tokens(s.chain_tokens, s.depth, s.beam_tokens)
            spec_ms, verify_ms = self.step.speculation_ms(spec, s.depth,
                                                          drafted), self.step.ms(s.num_decode, s.target_context,
                                                                                 new_tokens, trees, s.num_prefill)
        return spec_ms * self.speed / 1e3, verify_ms * self.speed / 1e3


def calibrated_profile(cost: CpuIterationCost) -> CostModel:
    """What profiler.calibrate would measure on the simulated machine: verification forwards and draft
    steps at its CALIBRATION_TOKENS priced as the simulator prices them, their rooflines and B at the
    target's knee. On this project's CPUs the measured shape differs from a profile taken elsewhere (a
    steeper price per verified token), and selection and B follow the shape (evidence:
    docs/experiments.md#sim-calibrated-rooflines)."""
    sizes = list(CALIBRATION_TOKENS)
    verify = {n: cost.verify_forward_ms(n) for n in sizes}
    def draft_step_ms(n: int) -> float:  # the step fit's where it prices the draft, else the profile's roofline
        fitted = cost.step.draft_step_ms(n) if cost.step else None
        return cost.profile_model.draft_step_ms(n) if fitted is None else fitted
    steps = {n: draft_step_ms(n) * cost.speed for n in sizes}
    line = fit_roofline(sizes, list(verify.values()))
    return CostModel(line, fit_roofline(sizes, list(steps.values())), pick_budget(line),
                     tuple(verify.items()), tuple(steps.items()))


def cpu_cost(engine_json: str = ENGINE_JSON, speed: float = 1.0) -> tuple[CpuIterationCost, EngineConfig]:
    """The served engine config and the profile it points at; `speed`: see CpuIterationCost."""
    config = EngineConfig.from_json(engine_json)
    path = config.speculation.profile_path
    return CpuIterationCost(CostModel.load(path), EngineStepCost.from_profile(path), speed=speed), config


@dataclass(frozen=True)
class GpuIterationCost:
    gpu: Gpu
    dep: Deployment
    name: str = "gpu"
    max_slowdown: float = 1.3

    @property
    def model(self) -> GpuCost:
        return GpuCost(self.gpu, self.dep, max_slowdown=self.max_slowdown)

    def profile(self) -> CostModel:
        return self.model.profile()

    def durations(self, s: IterationShape) -> tuple[float, float]:
        m = self.model
        spec = 0.0
        if s.chain_tokens:
            spec = m.draft_s(s.chain_tokens, s.draft_context,
                             s.chain_tokens * max(1, s.draft_context // max(1, s.num_decode)))
            per_req_ctx = s.draft_context // max(1, s.num_decode)
            spec += max(s.depth - 1, 0) * m.draft_s(s.beam_tokens, s.draft_context, s.beam_tokens * per_req_ctx)
        return spec, m.target_s(s.tree_tokens + s.prefill_tokens, s.target_context, s.attended)
