"""Models: checkpoints and tokenizers (checkpoint.py, torch-free), weights (loader.py), the Llama target
and the feature draft. The torch-dependent names load on first use, so a process that only tokenizes
(the Triton tokenizer models) never imports torch: it starts faster and exits sooner."""

from importlib import import_module

from .checkpoint import embedded_default_gguf, load_tokenizer, locate

_LAZY = {"is_trained_draft": ".factory", "load_model": ".factory", "LlamaModel": ".llama", "LlamaSpec": ".llama",
         "TORCH_DTYPES": ".loader", "read_checkpoint": ".loader"}

__all__ = ["LlamaModel", "LlamaSpec", "TORCH_DTYPES", "embedded_default_gguf", "is_trained_draft", "load_model",
           "load_tokenizer", "locate", "read_checkpoint"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
