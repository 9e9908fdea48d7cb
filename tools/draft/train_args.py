"""tools.draft.train's command line (its module docstring says what the stages are)."""

from __future__ import annotations

import argparse
import os

from adaserve_backend.config import EMBEDDED_DEFAULT
from adaserve_backend.models.feature_draft import SHIPPED
from harness.run_dir import run_dir


def parse(description: str = "", argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--target", default=EMBEDDED_DEFAULT)
    ap.add_argument("--dtype", default="bfloat16", help="the served target's dtype (the teacher)")
    ap.add_argument("--out", default=SHIPPED)
    ap.add_argument("--plot", default=os.path.join(run_dir("draft-training"), "draft_training.png"))
    ap.add_argument("--vocab", type=int, default=8192, help="tokens the draft head covers")
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4, help="training-time test depth")
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of step j: decay**j")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--prompt-weight", type=float, default=0.2)
    ap.add_argument("--eval-per-family", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teacher-only", action="store_true", help="stop after stage 2 (while shards are still generated)")
    ap.add_argument("--shard", type=int, default=0,
                    help="with --teacher-only: this process takes shards i %% of == shard")
    ap.add_argument("--of", type=int, default=1)
    ap.add_argument("--layers", type=int, help="decoder layers (default: the --init draft's, else 1)")
    ap.add_argument("--init", help="warm start: a draft saved by this command (its head vocabulary and weights)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bfloat16 autocast for training (AMX; float32 master weights)")
    return ap.parse_args(argv)
