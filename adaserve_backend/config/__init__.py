"""Configuration dataclasses: pure data, loaded once, never mutated afterwards. Each concern has its own
frozen dataclass with documented defaults, validated loudly when it is made."""

from .drain import DrainConfig
from .engine import EMBEDDED_DEFAULT, EMBEDDED_DRAFT, CacheConfig, EngineConfig, ModelConfig, StreamingConfig, from_dict
from .kernels import KernelConfig
from .scheduling import (
           DEFAULT_SLO_CLASSES,
           POLICY_NAMES,
           SPECULATIVE_POLICIES,
           SchedulerConfig,
           SLOClass,
           check_policy_name,
)
from .speculation import LOOKUP_MAX_NGRAM, Lookup, SpeculationConfig

__all__ = ["DrainConfig", "KernelConfig", "EMBEDDED_DEFAULT", "EMBEDDED_DRAFT", "CacheConfig", "EngineConfig",
           "ModelConfig",
           "StreamingConfig", "from_dict",
           "DEFAULT_SLO_CLASSES", "POLICY_NAMES", "SPECULATIVE_POLICIES", "SchedulerConfig",
           "SLOClass", "check_policy_name",
           "LOOKUP_MAX_NGRAM", "Lookup", "SpeculationConfig"]
