"""Where a model in the repository finds the engine settings and the tokenizer."""

from __future__ import annotations

import os

from ..config import EngineConfig
from ..models import load_tokenizer, locate

ENV_OVERRIDE = "ADASERVE_ENGINE_CONFIG"  # point every model at another engine JSON (tests, experiments)


def engine_config_path(model_dir: str) -> str:
    """The one engine JSON, beside the scheduler model: <repository>/adaserve/1/engine.json."""
    if os.environ.get(ENV_OVERRIDE):
        return os.environ[ENV_OVERRIDE]
    return os.path.join(os.path.dirname(os.path.abspath(model_dir)), "adaserve", "1", "engine.json")


def load_engine_config(model_dir: str) -> EngineConfig:
    return EngineConfig.from_json(engine_config_path(model_dir))


def load_repository_tokenizer(model_dir: str):
    return load_tokenizer(locate(load_engine_config(model_dir).target.path), without_torch=True)
