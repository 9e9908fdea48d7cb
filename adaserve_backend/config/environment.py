"""Settings read from the environment (per-server overrides of engine.json, A/B switches), parsed in one
way: a clear error naming the variable rather than a bare float() failure."""

from __future__ import annotations

import os


def env_seconds(name: str) -> float | None:
    """$name as a number of seconds, None when it is unset; ValueError naming it when it is no number."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None
