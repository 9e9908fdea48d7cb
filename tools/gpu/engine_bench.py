"""The `engine` measurement: the real engine (adaserve_backend.engine.Engine) in this process with the
embedded SmolLM2 and the shipped draft, as served: one request alone (TTFT, and TPOT: ms per output
token after the first) and batches submitted at once (tokens/s, mean TPOT), under the speculative policy
(adaserve) and plain decode (continuous: one token per request per step, no draft), with each attention
backend (FlashInfer, SDPA) on cuda; the engine's own choice on the CPU, where the same code takes the CPU
figures beside the GPU's: `python -m tools.gpu.engine_bench --device cpu` prints the same JSON.

What it holds fixed, and why:
- a fixed English prompt (real text, so the draft's acceptance means something), greedy, ignore_eos with
  min_tokens = max_tokens: every run makes the same number of tokens;
- prefix caching off and the suffix index off: a run must not find the KV blocks or the outputs of the
  run before it (the same prompt, repeated), which would time a cache, not the engine;
- no calibration: the configured budget (SpeculationConfig's defaults), so the runs are comparable across
  devices and the step stays short; CUDA graphs as the engine's defaults make them (said per row).
Each engine is warmed up first (a request alone, then a batch of the largest size), and medians are over
`runs` single-request runs. Engines are built one at a time, with the backend chosen at construction:
the runner captures its graphs for the attention it was built with."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. Books had "
    "been copied by hand for centuries, slowly and at great cost, so that a single library might hold only "
    "a few hundred volumes. Within fifty years of Gutenberg's first Bible, presses were at work in more than "
    "two hundred cities across Europe, and millions of books had been printed. Explain how this change "
    "affected science, religion and everyday life, and give three examples."
)


@dataclass(frozen=True)
class EngineBench:
    device: str = "cuda"
    dtype: str = "bfloat16"
    backends: tuple[str, ...] = ("flashinfer", "sdpa")  # on the CPU: ("auto",), the engine's own choice
    policies: tuple[str, ...] = ("adaserve", "continuous")
    prompt_tokens: int = 100
    output_tokens: int = 128
    runs: int = 3  # single-request runs after the warm-up; their median is reported
    batches: tuple[int, ...] = (4, 16)
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.output_tokens < 2 or self.prompt_tokens < 1 or self.runs < 1 or min(self.batches, default=1) < 1:
            raise ValueError("output_tokens >= 2 (TPOT is over the tokens after the first), prompt_tokens, runs "
                             "and batch sizes >= 1")


def engine_config(b: EngineBench, policy: str):
    from adaserve_backend.config import (
        EMBEDDED_DEFAULT,
        EMBEDDED_DRAFT,
        CacheConfig,
        EngineConfig,
        ModelConfig,
        SchedulerConfig,
        SpeculationConfig,
    )

    max_len = b.prompt_tokens + b.output_tokens + 64  # room for a speculated tree past the last token
    blocks = max(b.batches + (1,)) * -(-max_len // b.block_size) + 8
    cache = CacheConfig(block_size=b.block_size, num_blocks=blocks, prefix_caching=False)
    return EngineConfig(
        target=ModelConfig(path=EMBEDDED_DEFAULT, dtype=b.dtype, device=b.device, max_model_len=max_len),
        draft=ModelConfig(path=EMBEDDED_DRAFT, dtype=b.dtype, device=b.device, max_model_len=max_len),
        target_cache=cache, draft_cache=cache, scheduler=SchedulerConfig(policy=policy),
        speculation=SpeculationConfig(suffix_scope="off"))


@contextmanager
def attention(backend: str):
    """`sdpa`: flashinfer counts as not importable while the engine is built (its runners pick their
    attention, and capture graphs for it, at construction); `flashinfer` and `auto`: the engine's choice."""
    from adaserve_backend.attention import flashinfer_cuda

    if backend != "sdpa":
        yield
        return
    importable = flashinfer_cuda.flashinfer_importable
    flashinfer_cuda.flashinfer_importable = lambda: False
    try:
        yield
    finally:
        flashinfer_cuda.flashinfer_importable = importable


def build_engine(b: EngineBench, policy: str, backend: str, checkpoint, eos: list[int]):
    from adaserve_backend.engine import Engine
    from adaserve_backend.models import load_model

    config = engine_config(b, policy)
    with attention(backend):
        engine = Engine(config, target=load_model(config.target, checkpoint), eos_token_ids=eos)
    got = type(engine.target.attn).__name__
    want = {"flashinfer": "FlashInferBackend", "sdpa": "TorchSDPABackend"}.get(backend)
    if want and got != want:
        raise RuntimeError(f"asked for {backend}, the engine runs {got}")
    return engine


def serve(engine, prompt: list[int], n: int, tokens: int, tag: str) -> dict:
    """n copies of the request submitted at once and served to the end: per request TTFT and TPOT (the
    engine's own clocks), the tokens of the first, the wall time, tokens/s and accepted tokens per step."""
    from adaserve_backend.request import Request
    from adaserve_backend.slo import tpot_seconds

    engine.reset_stats()
    t0 = time.monotonic()
    for i in range(n):
        engine.add_request(Request(f"{tag}-{i}", list(prompt), max_tokens=tokens, min_tokens=tokens, ignore_eos=True))
    out: dict[str, list[int]] = {}
    ends = {}
    for o in engine.drain():
        if o.error:
            raise RuntimeError(f"request {o.request_id} failed: {o.error}")
        out.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            ends[o.request_id] = o
    wall = time.monotonic() - t0
    ttft = [(o.first_token_time - o.arrival_time) * 1e3 for o in ends.values()]
    tpot = [tpot_seconds(o.first_token_time, o.emit_time, len(out[r])) * 1e3 for r, o in ends.items()]
    made = sum(len(v) for v in out.values())
    return {"ttft_ms": statistics.mean(ttft), "tpot_ms": statistics.mean(tpot), "wall_s": wall,
            "tokens": made, "tokens_per_s": made / wall, "accepted_per_step": engine.mean_accepted(),
            "first": out[f"{tag}-0"]}


def measure(engine, b: EngineBench, prompt: list[int], base: dict, rows: list, deadline: float, log,
            reference: list[int]) -> None:
    """Warm-up, the single-request runs and the batches of one engine, a row each. The single request's
    greedy tokens are compared with the first engine's (`reference`, filled by the first)."""
    t = time.monotonic()
    serve(engine, prompt, 1, min(32, b.output_tokens), "warm-up")
    if b.batches:
        serve(engine, prompt, max(b.batches), min(8, b.output_tokens), "warm-up-batch")
    base["warm_up_s"] = round(time.monotonic() - t, 1)
    for n in (1,) + b.batches:
        row = dict(base, requests=n)
        rows.append(row)
        if time.monotonic() > deadline:
            row["skipped"] = "out of time"
            continue
        runs = [serve(engine, prompt, n, b.output_tokens, f"r{n}-{i}") for i in range(b.runs if n == 1 else 1)]
        mid = sorted(runs, key=lambda r: r["tpot_ms"])[len(runs) // 2]
        row.update({k: round(mid[k], 3) for k in ("ttft_ms", "tpot_ms", "tokens_per_s", "accepted_per_step")},
                   wall_s=round(mid["wall_s"], 2), tokens=mid["tokens"], runs=len(runs))
        if n == 1:
            row["tpot_ms_runs"] = [round(r["tpot_ms"], 3) for r in runs]
            if not reference:
                reference.extend(mid["first"])
            row["same_tokens_as_first_engine"] = next(
                (i for i, (x, y) in enumerate(zip(mid["first"], reference)) if x != y), len(mid["first"]))
        log(f"  engine {base['policy']} [{base['backend']}] x{n}: TPOT {row['tpot_ms']:.2f} ms, "
            f"TTFT {row['ttft_ms']:.1f} ms, {row['tokens_per_s']:.0f} tokens/s, "
            f"{row['accepted_per_step']:.2f} tokens/step")


def bench_engine(b: EngineBench, sink: dict, deadline: float, log=print) -> None:
    """Every (backend, policy) engine in turn into sink["rows"], within `deadline` (monotonic seconds)."""
    import torch

    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate, read_checkpoint

    t = time.monotonic()
    tokenizer = load_tokenizer(locate(EMBEDDED_DEFAULT))
    ids = tokenizer(PROMPT_TEXT).input_ids
    prompt = (ids * -(-b.prompt_tokens // len(ids)))[: b.prompt_tokens]
    checkpoint = read_checkpoint(EMBEDDED_DEFAULT)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    sink.update(settings=asdict(b), model=EMBEDDED_DEFAULT, read_s=round(time.monotonic() - t, 1))
    rows = sink.setdefault("rows", [])
    reference: list[int] = []
    for backend in b.backends:
        for policy in b.policies:
            base = {"backend": backend, "policy": policy}
            if time.monotonic() > deadline:
                rows.append(dict(base, skipped="out of time"))
                continue
            engine = None
            try:
                t = time.monotonic()
                engine = build_engine(b, policy, backend, checkpoint, eos)
                base.update(attention=type(engine.target.attn).__name__, load_s=round(time.monotonic() - t, 1),
                            cuda_graphs=getattr(engine.target, "graphs", None) is not None)
                measure(engine, b, prompt, base, rows, deadline, log, reference)
            except Exception as e:
                rows.append(dict(base, error=f"{type(e).__name__}: {e}"[:500]))
                log(f"  engine {policy} [{backend}]: {rows[-1]['error']}")
            del engine
            gc.collect()  # the engine's cycles, so its caches are freed before the next is built
            if torch.device(b.device).type == "cuda":
                torch.cuda.empty_cache()


def embedded_kernels() -> str:
    """FlashInfer's bf16 kernels at the embedded model's head_dim (64; the compile step builds 128's):
    compiled or installed before, else the carried prebuilt ones installed now, else compiled at first
    use (then the warm-up's time holds the compile)."""
    from tools.gpu.env import SITE, arch_tag
    from tools.gpu.kernels import install_carried_kernels, jit_libraries

    tag = "bf16_dtype_idx_i32_head_dim_qk_64_"
    if any(tag in p.parent.name for p in jit_libraries()):
        return "compiled on this machine before"
    if any(tag in p.name for p in (SITE / "flashinfer" / "data" / "aot").glob("*")):
        return "prebuilt, installed before"
    names = install_carried_kernels(arch_tag(), only=tag)
    return "prebuilt (carried), installed now" if names else "none carried for this GPU: compiled in the warm-up"


def engine_step(ctx) -> dict:
    """The step: skipped (said in its results) without the embedded model; SDPA alone without FlashInfer;
    one run per single-request point with --quick; about a minute on an H100."""
    from tools.gpu.model_parts import embedded_model_missing

    sink: dict = {}
    ctx.results["engine"] = sink
    if (why := embedded_model_missing()) is not None:
        sink["skipped"] = f"{why} (carry its parts, .gpu/model1-3: docs/gpu.md)"
        ctx.say(f"  engine: skipped: {sink['skipped']}")
        return sink
    backends = ("sdpa",) if ctx.no_flashinfer else ("flashinfer", "sdpa")
    if ctx.no_flashinfer:
        sink["flashinfer"] = ctx.no_flashinfer
    else:
        try:
            sink["flashinfer_kernels"] = embedded_kernels()
        except Exception as e:  # then they compile at first use, in the warm-up
            sink["flashinfer_kernels"] = f"not installed from .gpu/aot: {type(e).__name__}: {e}"[:300]
    bench_engine(EngineBench(backends=backends, runs=1 if ctx.quick else 3), sink,
                 min(ctx.deadline - 10, time.monotonic() + 80), log=ctx.progress)
    return sink


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--backends", help="comma-separated: flashinfer, sdpa (cuda), auto (default: auto on the "
                    "CPU, flashinfer,sdpa on cuda)")
    ap.add_argument("--policies", default="adaserve,continuous")
    ap.add_argument("--prompt-tokens", type=int, default=EngineBench.prompt_tokens)
    ap.add_argument("--output-tokens", type=int, default=EngineBench.output_tokens)
    ap.add_argument("--runs", type=int, default=EngineBench.runs)
    ap.add_argument("--batches", default="4,16", help="comma-separated batch sizes ('' for none)")
    ap.add_argument("--budget-s", type=float, default=900, help="start nothing past this many seconds")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    backends = args.backends or ("flashinfer,sdpa" if cuda else "auto")
    b = EngineBench(device=args.device, dtype=args.dtype, backends=tuple(backends.split(",")),
                    policies=tuple(args.policies.split(",")), prompt_tokens=args.prompt_tokens,
                    output_tokens=args.output_tokens, runs=args.runs,
                    batches=tuple(int(x) for x in args.batches.split(",") if x))
    if not cuda and set(b.backends) != {"auto"}:
        ap.error("on the CPU the attention is the engine's own choice: --backends auto")
    if cuda:
        from tools.gpu.env import setup_env

        setup_env()  # .gpu/site importable: flashinfer and the embedded model installed by gpu_check
    sink: dict = {}
    bench_engine(b, sink, time.monotonic() + args.budget_s, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(sink, indent=1))
    return 0 if not any("error" in r for r in sink["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
