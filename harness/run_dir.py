"""Where a run writes its outputs: runs/<date>-<name>/ (ignored by git), so a re-run never overwrites
what an earlier one left, and nothing a run makes is committed. docs/experiments.md cites them."""

from __future__ import annotations

import os
import time


def run_dir(name: str, root: str = "runs") -> str:
    """runs/<YYYY-MM-DD>-<name> (not created here)."""
    return os.path.join(root, f"{time.strftime('%Y-%m-%d')}-{name}")
