from .backend import AttentionBackend, make_backend
from .metadata import AttentionMetadata, ancestor_mask, build_metadata

__all__ = ["AttentionBackend", "AttentionMetadata", "ancestor_mask", "build_metadata", "make_backend"]
