"""Read model weights: Hugging Face directories (safetensors) and GGUF files (checkpoint.py finds them).

Everything is read through `transformers` (config, tokenizer, GGUF dequantisation) from local files
only, so `HF_HUB_OFFLINE=1` works and nothing is ever downloaded.
"""

from __future__ import annotations

import glob
import os

import torch

from .checkpoint import CheckpointLocation, checkpoint_source, load_hf_config, locate


def load_state_dict(loc: CheckpointLocation) -> dict[str, torch.Tensor]:
    """Weights with Hugging Face parameter names, in the checkpoint's dtype (float32 for GGUF)."""
    from safetensors.torch import load_file

    if loc.gguf_file:
        folder, kwargs = checkpoint_source(loc, "weights")
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
