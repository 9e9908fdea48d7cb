"""One command for a lent GPU machine (issue 72): `python3 -m tools.gpu_check`, or `make gpu-check`.

It runs with the machine's own python3 (the project's .venv is not usable there: another Python) and
needs from this checkout, besides the code, the wheels in .wheels/ (docs/gpu.md: which, and how to carry
them). Steps, in order, each guarded (a failure is recorded and the next step runs) and each skipped
when the time budget (--budget-s, 8 minutes by default) is spent:

1. env: device, driver, torch, CUDA, nvcc, ninja.
2. install: flashinfer-python and apache-tvm-ffi from .wheels/ into .gpu/site (pip --no-index --no-deps:
   everything else flashinfer imports is already on the machine).
3. compile: FlashInfer's kernels for bf16 and fp16 (they JIT-compile with nvcc on first use; the cache
   is .gpu/.cache), two processes at once, each timed; the built libraries are packed for carrying. A
   dtype whose compile fails or runs out of time loads the prebuilt kernels carried in .gpu/aot/ instead
   (`--prebuild` makes them on any machine with nvcc; `--use-prebuilt` loads them without compiling).
4. tests: pytest tests/gpu (FlashInfer and SDPA on CUDA against the torch reference) and the CPU tests
   of the plan inputs.
5. accuracy: the largest differences from the reference, FlashInfer and SDPA, bf16 and fp16.
6. attention: FlashInfer against SDPA per layer at Llama-3.1-8B's attention shape, trees/decodes/a mix.
7. layers: a few Llama-3.1-8B decoder layers (random bf16 weights), forward time per token budget,
   scaled to 32 layers, against issue 72's speed targets.
8. graphs: the engine's own decode step at the 8B shape, eager and replayed as CUDA graphs.
9. draft: an EAGLE-3-style draft head's beam step at the 8B width, eager and in a CUDA graph.
10. engine: the engine end to end with the embedded SmolLM2 and the shipped draft (carried in parts,
   docs/gpu.md): one request's TTFT and TPOT, batches of 4 and 16.

After every step it writes runs/gpu-check/<UTC date>/gpu-check.json and gpu-check.md (and copies them,
the test log and the packed kernels to $OUT when that is set), so whatever ends the run leaves what was
done. It imports torch, flashinfer and this project's engine modules (transformers for the random models).

This file is the command line only; each step is a module of tools/gpu/ (its __init__ lists them).
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.gpu.env import WHEELS
from tools.gpu.kernel_compile import compile_worker
from tools.gpu.kernels import DTYPES, prebuild
from tools.gpu.runner import run
from tools.gpu.steps import STEPS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=480, help="start no step past this many seconds (default 480)")
    ap.add_argument("--compile-timeout", type=float, default=240, help="seconds the kernels may take to compile")
    ap.add_argument("--use-prebuilt", action="store_true",
                    help="load the kernels carried in .gpu/aot/ instead of compiling them (by default they are "
                         "only the fallback of a compile that fails or runs out of time)")
    ap.add_argument("--wheels", default=str(WHEELS), help="folder of the wheels to install (default .wheels)")
    ap.add_argument("--out", help="run folder (default runs/gpu-check/<UTC date>)")
    ap.add_argument("--copy-to", help="also copy the results here (default $OUT when set)")
    ap.add_argument("--skip", default="", help="steps to leave out, comma-separated: "
                    + ",".join(s for s, *_ in STEPS[1:]))
    ap.add_argument("--layers", type=int, default=4, help="decoder layers in the stack measured (default 4)")
    ap.add_argument("--quick", action="store_true", help="fewer measurement points (a second run)")
    ap.add_argument("--prebuild", metavar="ARCH", help="only build the kernels for ARCH (e.g. 9.0a) into .gpu/aot/, "
                    "on any machine with nvcc and flashinfer importable (docs/gpu.md)")
    ap.add_argument("--compile-worker", choices=DTYPES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_worker:
        compile_worker(args.compile_worker)
        return 0
    if args.prebuild:
        print(json.dumps(prebuild(args.prebuild), indent=1))
        return 0
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - {s for s, *_ in STEPS[1:]}
    if unknown:
        ap.error(f"unknown steps: {', '.join(sorted(unknown))}")
    return run(args, skip, argv)


if __name__ == "__main__":
    sys.exit(main())
