from .block_manager import BlockManager, KVCacheFull, SequenceSlots, chain_parents
from .kv_cache import KVCache, bytes_per_block

__all__ = ["BlockManager", "KVCache", "KVCacheFull", "SequenceSlots", "bytes_per_block", "chain_parents"]
