"""Tiny randomly initialised checkpoints written to disk, and the real embedded model, for tests."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from adaserve_backend.config import EMBEDDED_DEFAULT, ModelConfig
from adaserve_backend.models import load_model

TINY_LLAMA = dict(
    model="llama",
    vocab_size=320,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=512,
    tie_word_embeddings=False,
    rope_parameters={  # Llama 3.1-style scaled RoPE
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
)
TINY_QWEN2 = dict(
    model="qwen2",
    vocab_size=320,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    use_sliding_window=False,
)


# Where checkpoints are written: pytest's session temporary folder (tests/conftest.py sets it, so pytest
# cleans them up with its other temporary folders); a plain temporary folder outside pytest.
CHECKPOINT_ROOT: Path | None = None


@functools.cache
def tiny_checkpoint(kind: str, seed: int = 0, vocab_size: int | None = None, sharpen: float = 1.0,
                    hidden_size: int | None = None) -> str:
    """Save a random tiny model (safetensors + config.json) and return its directory. `sharpen` scales
    the output head so next-token distributions are peaked rather than nearly uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict({"llama": TINY_LLAMA, "qwen2": TINY_QWEN2}[kind])
    spec.pop("model")
    if vocab_size:
        spec["vocab_size"] = vocab_size
    if hidden_size:
        spec["hidden_size"] = hidden_size
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**spec))
    with torch.no_grad():  # random init leaves biases at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
        model.get_output_embeddings().weight.mul_(sharpen)
    path = tempfile.mkdtemp(prefix=f"tiny-{kind}-", dir=CHECKPOINT_ROOT)
    model.save_pretrained(path)
    return path


@functools.cache
def hf_reference(path: str):
    """transformers' own model for a checkpoint, float32, eval mode: the oracle."""
    from transformers import AutoModelForCausalLM

    from adaserve_backend.models.checkpoint import locate

    loc = locate(path)
    return AutoModelForCausalLM.from_pretrained(loc.directory, dtype=torch.float32, **loc.kwargs).eval()


@functools.cache
def our_model(path: str, dtype: str = "float32"):
    return load_model(ModelConfig(path=path, dtype=dtype, max_model_len=512))


def embedded() -> str:
    return EMBEDDED_DEFAULT
