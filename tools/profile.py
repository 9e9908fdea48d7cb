"""Profile this device: target verification and draft step latency against batch tokens, the fitted
rooflines and the budget B they imply. Writes a JSON the engine reads (speculation.profile_path).

    python -m tools.profile [--config engine.json] [--out profile.json]
    python -m tools.profile --config engine.json --out profile.json --step-only   # re-take the step fit only

`--step-only` keeps the profile's rooflines and B (what the served scheduler plans with) and re-measures
the whole-engine-step fit, its times divided by how much slower than the rooflines' day the machine runs
now (adaserve_backend.profiler.probe_ms over the stored roofline): the fit stays in the rooflines' units, which is
what a simulation scaled by a run's own probe (sim.validate) assumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform

import torch

from adaserve_backend.config import EngineConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import fit_roofline, pick_budget
from adaserve_backend.cost_model.step_cost import PROFILE_KEY, EngineStepCost
from adaserve_backend.model_runner import ModelRunner
from adaserve_backend.models import load_model
from adaserve_backend.profiler import measure_engine_steps, measure_forward, measure_speculative_steps, probe_ms


def engine_step_cost(cfg: EngineConfig, cost: CostModel, target, draft, batches: list[int], contexts: list[int],
                     depths: list[int], speed: float = 1.0) -> dict:
    """The whole-step fit (cost_model/step_cost.py) and the points it was fitted to: decode and prefill
    from an engine that runs prefill chunks beside decodes (`sarathi`), speculation from fixed chains
    (`spec:d` for each depth, at the middle context), each engine with room for the largest batch at
    the longest context. Times are divided by `speed` (the machine's now over the rooflines')."""
    from adaserve_backend.engine import Engine

    room = max(batches) + 1
    def blocks(cache):  # contexts and what they add
        return (room + 1) * (-(-(max(contexts) + 64) // cache.block_size) + 1)


    def engine(policy: str) -> Engine:
        c = dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, policy=policy, max_num_seqs=room),
                                target_cache=dataclasses.replace(cfg.target_cache, num_blocks=blocks(cfg.target_cache)),
                                draft_cache=dataclasses.replace(cfg.draft_cache, num_blocks=blocks(cfg.draft_cache)))
        return Engine(c, target=target, draft=draft)

    points = [{**p, "ms": p["ms"] / speed} for p in measure_engine_steps(engine("sarathi"), batches, contexts)]
    step = EngineStepCost.fit(points)
    spec_points = []
    if cfg.draft is not None:
        middle = sorted(contexts)[len(contexts) // 2]
        for d in depths:
            spec_points += [{**p, "spec_ms": p["spec_ms"] / speed, "verify_ms": p["verify_ms"] / speed,
                             "draft_ms": cost.draft_ms(p["n"], p["depth"], p["width"])}
                            for p in measure_speculative_steps(engine(f"spec:{d}"),
                                                               [b for b in batches if b <= 16], middle)]
        step = step.with_speculation(spec_points)
    return {**step.to_dict(), "speed": speed, "points": points, "speculative_points": spec_points}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="engine JSON (default: built-in defaults, the embedded model)")
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-slowdown", type=float, default=1.3, help="B: largest batch within this x flat latency")
    ap.add_argument("--step-batches", type=int, nargs="*", default=[1, 8, 16, 24, 32],
                    help="decoding requests for the whole-engine-step fit (none: skip it)")
    ap.add_argument("--step-contexts", type=int, nargs="+", default=[128, 512, 1024], help="their context lengths")
    ap.add_argument("--step-depths", type=int, nargs="+", default=[1, 2, 4],
                    help="draft chains for the speculative terms")
    ap.add_argument("--step-only", action="store_true",
                    help="keep --out's rooflines and B; re-measure the step fit only")
    args = ap.parse_args()
    cfg = EngineConfig.from_json(args.config) if args.config else EngineConfig()
    if args.step_only:
        return retake_step_fit(cfg, args)
    sizes = [2**i for i in range(args.max_tokens.bit_length()) if 2**i <= args.max_tokens]

    target = load_model(cfg.target)
    runner = ModelRunner(target, cfg.target_cache)
    verify = measure_forward(runner, sizes, per_seq=8, repeats=args.repeats, desc="target verification")
    del runner
    draft_model = target if cfg.draft is None else load_model(cfg.draft)
    draft = measure_forward(ModelRunner(draft_model, cfg.draft_cache), sizes, per_seq=4,
                            repeats=args.repeats, desc="draft step")

    target_line, draft_line = fit_roofline(sizes, [verify[n] for n in sizes]), fit_roofline(sizes,
                                                                                            [draft[n] for n in sizes])
    model = CostModel(target_line, draft_line, pick_budget(target_line, args.max_slowdown),
                      tuple((n, verify[n]) for n in sizes), tuple((n, draft[n]) for n in sizes))
    print(f"{'tokens':>6} | {'verify ms':>9} | {'draft step ms':>13}")
    for n in sizes:
        print(f"{n:6d} | {verify[n]:9.1f} | {draft[n]:13.1f}")
    print(f"target roofline: {target_line}\ndraft roofline: {draft_line}\nbudget B = {model.budget}")
    extra = {}
    if args.step_batches:
        step = engine_step_cost(cfg, model, target, draft_model, args.step_batches,
                                args.step_contexts, args.step_depths)
        extra[PROFILE_KEY] = step
        print(f"engine step: {EngineStepCost.from_dict(step)}")
    save(model, cfg, args.out, extra)


def retake_step_fit(cfg: EngineConfig, args) -> None:
    model = CostModel.load(args.out)
    target = load_model(cfg.target)
    draft = target if cfg.draft is None else load_model(cfg.draft)
    speed = model.relative_speed(probe_ms(ModelRunner(target, cfg.target_cache)))
    print(f"this machine runs the profile's forwards at {speed:.2f}x their stored times")
    step = engine_step_cost(cfg, model, target, draft, args.step_batches, args.step_contexts, args.step_depths, speed)
    print(f"engine step: {EngineStepCost.from_dict(step)}")
    save(model, cfg, args.out, {PROFILE_KEY: step})


def save(model: CostModel, cfg: EngineConfig, path: str, extra: dict) -> None:
    on_gpu = torch.device(cfg.target.device).type == "cuda"  # what the profile measured, not what is installed
    device = torch.cuda.get_device_name(cfg.target.device) if on_gpu else platform.processor() or platform.machine()
    model.save(path, {"device": device, "dtype": cfg.target.dtype, "threads": torch.get_num_threads(), **extra})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
