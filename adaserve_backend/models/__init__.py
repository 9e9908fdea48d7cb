from .factory import is_trained_draft, load_model
from .llama import LlamaModel, LlamaSpec
from .loader import TORCH_DTYPES, embedded_default_gguf, load_tokenizer, locate, read_checkpoint

__all__ = [
    "LlamaModel", "LlamaSpec", "TORCH_DTYPES", "embedded_default_gguf", "is_trained_draft",
    "load_model", "load_tokenizer",
    "locate", "read_checkpoint",
]
