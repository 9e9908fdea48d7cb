"""What the GPU cost model knows about hardware and models: published numbers and measured ones, with sources.

GPUs (dense bf16 tensor-core peak, HBM bandwidth, NVLink bandwidth per direction):
  A100 SXM 80GB: 312 TFLOPS, 2.0 TB/s (2,039 GB/s), NVLink 3 600 GB/s total = 300 GB/s per direction
    (NVIDIA A100 datasheet, 2021).
  H100 SXM 80GB, `H100_SHEET` (`h100sheetxN`): 989 TFLOPS, 3.35 TB/s, NVLink 4 900 GB/s total = 450 GB/s
    per direction (NVIDIA H100 datasheet, 2023): the preset before anything ran on an H100, kept to compare.
  H100 SXM 80GB, `H100` (`h100xN`): the peaks `make gpu-check` measured on one H100 80GB HBM3 (a device
    copy's bandwidth, a large bf16 matmul's FLOP rate), as copied into sim/gpu_check_h100.json
    (sim/gpu_measured.py reads it; tests/unit/test_sim_gpu_measured.py checks these equal it). One GPU
    was measured, so NVLink and the memory size stay the datasheet's.
Models: shapes from each checkpoint's config.json on the Hugging Face Hub (meta-llama/Llama-3.1-70B-Instruct,
Llama-3.2-1B-Instruct, Qwen/Qwen2.5-32B-Instruct, Qwen2.5-0.5B-Instruct). Weights and KV are bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16 = 2  # bytes


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_s: float
    flops_s: float  # dense bf16
    link_bytes_s: float  # NVLink, one direction
    memory_bytes: float


A100 = Gpu("A100-SXM-80GB", 2.0e12, 312e12, 300e9, 80e9)
H100_SHEET = Gpu("H100-SXM-80GB-sheet", 3.35e12, 989e12, 450e9, 80e9)
H100 = Gpu("H100-SXM-80GB", 3.008e12, 792.7e12, 450e9, 80e9)
GPUS = {"a100": A100, "h100": H100, "h100sheet": H100_SHEET}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False

    @property
    def matmul_params(self) -> int:
        """Weights every forward reads and multiplies: attention (q, k, v, o), the gated MLP (3
        matrices) and the LM head. The input embedding is a row gather, not read whole."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate) + self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The LM head's share of matmul_params: a forward multiplies it only for the rows that need logits."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.matmul_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * BF16


LLAMA_70B = ModelShape("Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 128, 28672, 128256)
LLAMA_1B = ModelShape("Llama-3.2-1B-Instruct", 16, 2048, 32, 8, 64, 8192, 128256, tied_embeddings=True)
QWEN_32B = ModelShape("Qwen2.5-32B-Instruct", 64, 5120, 40, 8, 128, 27648, 152064)
QWEN_05B = ModelShape("Qwen2.5-0.5B-Instruct", 24, 896, 14, 2, 64, 4864, 151936, tied_embeddings=True)


@dataclass(frozen=True)
class Deployment:
    """A target with its colocated draft on `tp` GPUs (the draft runs tensor-parallel on the same
    GPUs, as in the paper's setup)."""

    target: ModelShape
    draft: ModelShape
    tp: int


MODELS = {"llama70b": (LLAMA_70B, LLAMA_1B), "qwen32b": (QWEN_32B, QWEN_05B)}
DEFAULT_TP = {"llama70b": 4, "qwen32b": 2}  # the paper: 4x A100 for Llama-70B, 2x A100 for Qwen-32B


def parse_hardware(text: str) -> tuple[Gpu, int]:
    """`a100x4` -> (A100, 4); `h100` -> (H100, 0: the model's default TP); `h100sheetx4` -> (H100_SHEET, 4)."""
    name, _, count = text.lower().partition("x")
    if name not in GPUS or (count and not count.isdigit()):
        raise ValueError(f"hardware {text!r}: expected a100xN, h100xN or h100sheetxN (or 'cpu')")
    return GPUS[name], int(count or 0)


def deployment(model: str, tp: int) -> Deployment:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    target, draft = MODELS[model]
    return Deployment(target, draft, tp or DEFAULT_TP[model])


def kv_token_capacity(gpu: Gpu, dep: Deployment, utilization: float = 0.9) -> tuple[int, int]:
    """Tokens of KV the target and the draft can hold: `utilization` of the GPUs' memory (vLLM's
    default gpu_memory_utilization) minus both models' weights, split in proportion to their KV bytes
    per token (every request has its tokens in both caches)."""
    free = gpu.memory_bytes * dep.tp * utilization - (dep.target.params + dep.draft.params) * BF16
    if free <= 0:
        raise ValueError(f"{dep.target.name} and {dep.draft.name} do not fit on {dep.tp}x {gpu.name}")
    per_token = dep.target.kv_bytes_per_token + dep.draft.kv_bytes_per_token
    tokens = int(free // per_token)
    return tokens, tokens
