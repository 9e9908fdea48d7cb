"""Build a served model from its config: a Llama-family checkpoint, or this project's feature draft."""

from __future__ import annotations

from ..config import EMBEDDED_DRAFT, ModelConfig
from ..device import check_device
from .feature_draft import load_draft
from .llama import LlamaModel
from .loader import TORCH_DTYPES, locate, read_checkpoint
from .quantized import quantize_to_q8_0, serve_q4_1, serve_q8_0


def is_trained_draft(path: str) -> bool:
    """This project's draft tensors, built around the target's own embeddings and tokenizer."""
    return path == EMBEDDED_DRAFT or path.endswith(".safetensors")


def load_model(config: ModelConfig, checkpoint=None) -> LlamaModel:
    """Build our decoder on `config.device` in `config.dtype`; `checkpoint` (from read_checkpoint)
    saves reading the files again. A device this process cannot use fails here, before anything is read."""
    check_device(config.device)
    if is_trained_draft(config.path):
        if config.dtype in ("q4_1", "q4_1_int8", "q8_0"):
            raise ValueError(f"dtype {config.dtype} is for the target; the draft runs in bfloat16")
        return load_draft(config.path, config)
    if config.head_rows is not None:
        raise ValueError(f"head_rows applies to this project's trained draft only, not to {config.path}")
    hf_config, spec, state_dict = checkpoint or read_checkpoint(config.path)
    # Sequences never outgrow a sliding window here, so full attention is exact for Mistral too.
    limits = [config.max_model_len, spec.max_position_embeddings, spec.sliding_window or config.max_model_len]
    model = LlamaModel(spec, hf_config, state_dict, max_len=min(limits))
    q8_0 = quantize_to_q8_0(model) if config.dtype == "q8_0" else None  # from the checkpoint's own precision
    model = model.place(config.device, TORCH_DTYPES[config.dtype]).eval()
    if config.dtype in ("q4_1", "q4_1_int8"):
        loc = locate(config.path)
        if not loc.gguf_file:
            raise ValueError(f"dtype {config.dtype} reads a GGUF's Q4_1 blocks; {config.path} is not a GGUF file")
        serve_q4_1(model, f"{loc.directory}/{loc.gguf_file}", integer=config.dtype == "q4_1_int8")
    elif q8_0 is not None:
        serve_q8_0(q8_0)
    return model
