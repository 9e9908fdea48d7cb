"""Where a model in the repository finds the engine settings and the tokenizer."""

from __future__ import annotations

import dataclasses
import os

from ..config import DrainConfig, EngineConfig
from ..config.environment import env_seconds
from ..models import load_tokenizer, locate

ENV_OVERRIDE = "ADASERVE_ENGINE_CONFIG"  # point every model at another engine JSON (tests, experiments)
# engine.json's drain.grace_s for this server only. Why: `make serve` drains in its frontend and then
# stops tritonserver, which should end what is left at once (0) rather than grant a second grace.
DRAIN_GRACE_ENV = "ADASERVE_DRAIN_GRACE_S"


def engine_config_path(model_dir: str) -> str:
    """The one engine JSON, beside the scheduler model: <repository>/adaserve/1/engine.json."""
    if os.environ.get(ENV_OVERRIDE):
        return os.environ[ENV_OVERRIDE]
    return os.path.join(os.path.dirname(os.path.abspath(model_dir)), "adaserve", "1", "engine.json")


def load_engine_config(model_dir: str) -> EngineConfig:
    config = EngineConfig.from_json(engine_config_path(model_dir))
    grace = env_seconds(DRAIN_GRACE_ENV)
    return config if grace is None else dataclasses.replace(config, drain=DrainConfig(grace_s=grace))


def served_drain_grace_s(model_repository: str) -> float:
    """The drain grace the repository's models will use (engine.json, or $DRAIN_GRACE_ENV)."""
    return load_engine_config(os.path.join(model_repository, "adaserve")).drain.grace_s


def load_repository_tokenizer(model_dir: str):
    return load_tokenizer(locate(load_engine_config(model_dir).target.path), without_torch=True)
