"""The run: the steps in order, each guarded (a failure is recorded with its traceback and the next step
runs) and each skipped when the time budget is spent or there is no CUDA device; the results written after
every step and every measurement, so whatever ends the run (the device tool's limit included) leaves what
was done. The Context is what the steps share: the budget, the folders, what failed before them."""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from tools.gpu.env import ROOT, setup_env
from tools.gpu.report import render_markdown, write_results
from tools.gpu.steps import STEPS


class Context:
    def __init__(self, args) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        self.wheels = Path(args.wheels)
        self.quick, self.layers = args.quick, args.layers
        self.compile_timeout = args.compile_timeout
        self.use_prebuilt = args.use_prebuilt
        self.reserve_layers = 75.0  # what the layer step needs at least
        self.no_flashinfer: str | None = None
        self.flashinfer_dtypes: list[str] | None = None  # those whose kernels compiled (None: not known)
        day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        self.run_dir = Path(args.out) if args.out else ROOT / "runs" / "gpu-check" / day
        out = os.environ.get("OUT") if args.copy_to is None else args.copy_to
        self.out = Path(out) if out else None
        self.results: dict = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, message: str) -> None:
        print(f"[gpu-check +{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def save(self) -> None:
        self.results["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.results["wall_s"] = round(time.monotonic() - self.t0, 1)
        write_results(self.results, self.run_dir, self.out)

    def progress(self, message: str) -> None:
        """A measurement's line, and the results so far on disk (a run cut off keeps them)."""
        self.say(message)
        self.save()

    def copy_out(self, path: Path) -> None:
        if self.out is not None and path.exists():
            shutil.copy2(path, self.out / path.name)


def run_step(ctx: Context, name: str, fn, status: dict) -> None:
    ctx.say(f"{name} ...")
    t = time.monotonic()
    try:
        data = fn(ctx)
        if data is not None and name != "env":
            ctx.results[name] = data
        status["ok"] = True
    except Exception as e:
        status.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:])
        if name == "install":
            ctx.no_flashinfer = f"it did not install: {type(e).__name__}: {e}"[:300]
    status["seconds"] = round(time.monotonic() - t, 1)
    ctx.say(f"{name}: {'ok' if status['ok'] else 'FAILED: ' + status['error'][:300]} ({status['seconds']} s)")


def keep_earlier(run_dir: Path) -> None:
    """A second run on the same day keeps the first one's files under their time."""
    old = run_dir / "gpu-check.json"
    if old.exists():
        stamp = datetime.datetime.fromtimestamp(old.stat().st_mtime, datetime.timezone.utc).strftime("%H%M%S")
        for name in ("gpu-check.json", "gpu-check.md"):
            if (run_dir / name).exists():
                (run_dir / name).rename(run_dir / name.replace("gpu-check", f"gpu-check-{stamp}"))


def run(args, skip: set[str], argv: list[str] | None = None) -> int:
    """Every step not in `skip` (names already checked), within args.budget_s; 0 when none failed."""
    ctx = Context(args)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    keep_earlier(ctx.run_dir)
    if ctx.out is not None:
        ctx.out.mkdir(parents=True, exist_ok=True)
    setup_env()
    r = ctx.results
    r.update(schema=1, started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             argv=sys.argv[1:] if argv is None else argv, budget_s=args.budget_s, env={}, steps={})
    ctx.say(f"writing to {ctx.run_dir}" + (f" and {ctx.out}" if ctx.out else ""))
    for name, fn, needs in STEPS:
        status: dict = {}
        r["steps"][name] = status
        if name in skip:
            status["skipped"] = "--skip"
        elif name != "env" and not r["steps"]["env"].get("ok"):
            status["skipped"] = "no CUDA device"
        elif ctx.left() < needs:
            status["skipped"] = f"out of time ({max(0, ctx.left()):.0f} s left of {args.budget_s:.0f})"
        else:
            run_step(ctx, name, fn, status)
        if "skipped" in status:
            ctx.say(f"{name}: skipped ({status['skipped']})")
        ctx.save()
    ctx.say(f"done: {ctx.run_dir / 'gpu-check.md'}")
    print(render_markdown(r), flush=True)
    return 0 if all(s.get("ok") for s in r["steps"].values() if "skipped" not in s) else 1
