"""First-principles latency of one tensor-parallel forward on GPUs, calibrated to published and measured points.

For a forward over `tokens` new tokens attending to `context` cached tokens in total (summed over the
batch's requests) and `attended` query-key pairs, on `tp` GPUs:

    t = (W + KV) / (tp * HBM * e)          weights and the KV cache read from HBM
      + (2 * P * tokens + 4 * L * H_q * attended) / (tp * PEAK * e)     matmul and attention FLOPs
      + 2 * L * allreduce(tokens * hidden * 2 bytes)                    Megatron TP: 2 all-reduces per layer
    allreduce(b) = ALPHA + 2 (tp - 1) / tp * b / (NVLINK * LINK_EFFICIENCY)     (ring all-reduce)

W = bf16 matmul weights, P their parameter count, KV = context * the model's KV bytes per token,
H_q = query heads * head_dim. Memory and compute terms are added, not overlapped (max): the two points
the AdaServe authors published for Llama-3.1-70B on 8x A100 (verifying 128 tokens ~55 ms, 1024 tokens
~205 ms) fit the additive form with one efficiency within 6%, the roofline max() only within 26%.

`e` is the one calibrated constant per GPU: the share of peak bandwidth and FLOPs the serving system
reaches. A100: fitted to the two published points (test_sim_cost.py checks both within 15%). H100
(`hardware.H100`, the peaks `make gpu-check` measured): fitted by sim/gpu_measured.py to that check's
compute-bound forwards of Llama-3.1-8B on one H100, TP1 (test_sim_gpu_measured.py re-fits and
compares). The check ran eagerly, without CUDA graphs, so its forwards of up to a few hundred tokens
time the host's kernel launches, not the GPU; a served engine replays CUDA graphs for decode
(adaserve_backend/cuda_graphs/decode.py), so those points are left out, and the memory-bound (decode) side is
priced with the compute-bound fit until a check with graphs measures it. `hardware.H100_SHEET` keeps
the preset from before that measurement: the datasheet's peaks and A100's efficiency (an assumption:
newer GPUs rarely reach a higher share of peak). ALPHA (per all-reduce latency, 15 us) and
LINK_EFFICIENCY (0.8, NCCL bus bandwidth over NVLink's nominal) are typical nccl-tests figures, not
fitted (one GPU was measured: no all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import fit_roofline, pick_budget

from .hardware import A100, BF16, H100, H100_SHEET, Deployment, Gpu, ModelShape

ALPHA_S = 15e-6
LINK_EFFICIENCY = 0.8

# The AdaServe authors' published verification latencies, Llama-3.1-70B, 8x A100 (tokens -> ms).
PUBLISHED_A100_TP8_LLAMA70B = {128: 55.0, 1024: 205.0}
# Context the published points are taken at (short prompts): requests * tokens each, assumed.
PUBLISHED_CONTEXT = (8, 512)

# A100: fitted by `calibrate(A100, ...)` against PUBLISHED_A100_TP8_LLAMA70B; H100: by
# `gpu_measured.fit_efficiency` against sim/gpu_check_h100.json; H100_SHEET: A100's, assumed. Tests re-fit both.
EFFICIENCY = {A100.name: 0.34, H100.name: 0.739, H100_SHEET.name: 0.34}


def allreduce_s(gpu: Gpu, tp: int, nbytes: float) -> float:
    if tp <= 1:
        return 0.0
    return ALPHA_S + 2 * (tp - 1) / tp * nbytes / (gpu.link_bytes_s * LINK_EFFICIENCY)


def forward_s(gpu: Gpu, model: ModelShape, tp: int, tokens: int, context: int, attended: int,
              efficiency: float, logit_rows: int | None = None) -> float:
    """Seconds of one forward (see the module docstring); 0 for an empty one. `logit_rows`: the tokens
    the LM head multiplies, every one unless given (a verification needs them all, a measured prefill
    only its last)."""
    if tokens <= 0:
        return 0.0
    rows = tokens if logit_rows is None else logit_rows
    memory = (model.matmul_params * BF16 + context * model.kv_bytes_per_token) / (tp * gpu.hbm_bytes_s * efficiency)
    flops = (2 * (model.matmul_params - model.head_params) * tokens + 2 * model.head_params * rows
             + 4 * model.layers * model.heads * model.head_dim * attended)
    compute = flops / (tp * gpu.flops_s * efficiency)
    comm = 2 * model.layers * allreduce_s(gpu, tp, tokens * model.hidden * BF16)
    return memory + compute + comm


def published_shape(tokens: int) -> tuple[int, int]:
    """(context, attended) of the published measurement: `tokens` spread over PUBLISHED_CONTEXT's requests."""
    reqs, ctx = PUBLISHED_CONTEXT
    return reqs * ctx, tokens * ctx


def calibrate(gpu: Gpu, model: ModelShape, tp: int, points: dict[int, float]) -> float:
    """The efficiency minimising the largest relative error over `points` (tokens -> ms)."""
    def worst(e: float) -> float:
        return max(abs(forward_s(gpu, model, tp, n, *published_shape(n), e) * 1e3 / ms - 1) for n, ms in points.items())

    return min((e / 1000 for e in range(20, 1001)), key=worst)


@dataclass(frozen=True)
class GpuCost:
    """Iteration latency of a deployment: draft steps and the target's verification forward."""

    gpu: Gpu
    dep: Deployment
    efficiency: float | None = None
    max_slowdown: float = 1.3  # B: the largest batch within this x the flat latency (tools.profile's default)

    @property
    def e(self) -> float:
        return self.efficiency or EFFICIENCY[self.gpu.name]

    def target_s(self, tokens: int, context: int, attended: int) -> float:
        return forward_s(self.gpu, self.dep.target, self.dep.tp, tokens, context, attended, self.e)

    def draft_s(self, tokens: int, context: int, attended: int) -> float:
        return forward_s(self.gpu, self.dep.draft, self.dep.tp, tokens, context, attended, self.e)

    def profile(self, sizes=tuple(2**i for i in range(12)), per_seq: int = 8, context_each: int = 1024) -> CostModel:
        """What `tools.profile` would measure on this hardware (its batches: `per_seq` tokens per request
        over `context_each` cached tokens each), fitted the same way: what the scheduler is given."""
        def at(fn, n: int) -> float:
            reqs = max(1, n // per_seq)
            return fn(n, reqs * context_each, n * context_each) * 1e3

        verify = [at(self.target_s, n) for n in sizes]
        draft = [at(self.draft_s, n) for n in sizes]
        target_line, draft_line = fit_roofline(sizes, verify), fit_roofline(sizes, draft)
        return CostModel(target_line, draft_line, pick_budget(target_line, self.max_slowdown),
                         tuple(zip(sizes, verify)), tuple(zip(sizes, draft)))
