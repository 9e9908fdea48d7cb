"""Profile this device: target verification and draft step latency against batch tokens, the fitted
rooflines and the budget B they imply. Writes a JSON the engine reads (speculation.profile_path).

    python -m tools.profile [--config engine.json] [--out profile.json]
"""

from __future__ import annotations

import argparse
import platform

import torch

from adaserve_backend.config import EngineConfig
from adaserve_backend.cost_model.cost_model import CostModel
from tools.profiler import measure_forward
from adaserve_backend.cost_model.roofline import fit_roofline, pick_budget
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="engine JSON (default: built-in defaults, the embedded model)")
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-slowdown", type=float, default=1.3, help="B: largest batch within this x flat latency")
    args = ap.parse_args()
    cfg = EngineConfig.from_json(args.config) if args.config else EngineConfig()
    sizes = [2**i for i in range(args.max_tokens.bit_length()) if 2**i <= args.max_tokens]

    target = load_model(cfg.target)
    runner = ModelRunner(target, cfg.target_cache)
    verify = measure_forward(runner, sizes, per_seq=8, repeats=args.repeats, desc="target verification")
    del runner
    draft_model = target if cfg.draft is None else load_model(cfg.draft)
    draft = measure_forward(ModelRunner(draft_model, cfg.draft_cache), sizes, per_seq=4, repeats=args.repeats, desc="draft step")

    target_line, draft_line = fit_roofline(sizes, [verify[n] for n in sizes]), fit_roofline(sizes, [draft[n] for n in sizes])
    model = CostModel(target_line, draft_line, pick_budget(target_line, args.max_slowdown),
                      tuple((n, verify[n]) for n in sizes), tuple((n, draft[n]) for n in sizes))
    print(f"{'tokens':>6} | {'verify ms':>9} | {'draft step ms':>13}")
    for n in sizes:
        print(f"{n:6d} | {verify[n]:9.1f} | {draft[n]:13.1f}")
    print(f"target roofline: {target_line}\ndraft roofline: {draft_line}\nbudget B = {model.budget}")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    model.save(
        args.out,
        {"device": device, "dtype": cfg.target.dtype, "threads": torch.get_num_threads()},
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
