"""Per-iteration knobs that depend only on load: AdaServe's adaptive depth and width."""

from __future__ import annotations

from ..config import SpeculationConfig


def clip(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def adaptive_depth_width(n: int, budget: int, cfg: SpeculationConfig) -> tuple[int, int]:
    """d = clip(floor(B1/(n+c1)) - 1, D_min, D_max), w = clip(floor(B2/n) + c2, 1, W_max)."""
    n = max(n, 1)
    d = clip(budget // (n + cfg.c1) - 1, cfg.d_min, cfg.d_max)
    w = clip(cfg.draft_budget // n + cfg.c2, 1, cfg.w_max)
    return d, w
