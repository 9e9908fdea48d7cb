"""The check's steps, in order, each with the seconds it needs at least to be worth starting; and the
measurement steps' glue: which backends (SDPA alone when flashinfer did not install or compile) and how
much of the budget each may take (each is bounded, so the steps after it keep their share)."""

from __future__ import annotations

import time

from tools.gpu.accuracy import accuracy
from tools.gpu.env import env_info
from tools.gpu.install import install
from tools.gpu.kernel_compile import compile_kernels
from tools.gpu.pytest_run import run_tests


def attention(ctx) -> list:
    # imported here, not at the top: the entry point (each compile worker too) imports this module, and
    # torch is loaded only by the steps that need it
    from tools.gpu.attention_bench import bench_attention
    from tools.gpu.points import attention_points

    rows: list = []
    ctx.results["attention"] = rows
    backends = ("sdpa",) if ctx.no_flashinfer else ("flashinfer", "sdpa")
    deadline = min(ctx.deadline - ctx.reserve_layers, time.monotonic() + 150)
    bench_attention(attention_points(ctx.quick), rows, deadline, backends, log=ctx.progress)
    return rows


def layers(ctx) -> dict:
    from tools.gpu.layer_bench import bench_layers

    sink: dict = {}
    ctx.results["layers"] = sink
    backends = ("sdpa",) if ctx.no_flashinfer else ("flashinfer", "sdpa")
    deadline = min(ctx.deadline - 10, time.monotonic() + 90)  # bounded: the steps after keep their share
    bench_layers(ctx.layers, sink, deadline, backends, quick=ctx.quick, log=ctx.progress)
    return sink


def draft(ctx) -> dict:
    from tools.gpu.draft_step_bench import bench_draft

    sink: dict = {}
    ctx.results["draft"] = sink
    backend = "sdpa" if ctx.no_flashinfer else "flashinfer"
    no_graphs = f"flashinfer: {ctx.no_flashinfer}" if ctx.no_flashinfer else None
    deadline = min(ctx.deadline - 10, time.monotonic() + 45)  # bounded: the steps after keep their share
    bench_draft(sink, deadline, backend=backend, quick=ctx.quick, log=ctx.progress, no_graphs=no_graphs)
    return sink


def graphs(ctx) -> dict:
    from tools.gpu.graph_bench import bench_graphs

    sink: dict = {}
    ctx.results["graphs"] = sink
    if ctx.no_flashinfer:
        sink["skipped"] = "CUDA graphs replay FlashInfer attention, which did not install or compile"
        return sink
    bench_graphs(sink, min(ctx.deadline - 10, time.monotonic() + 60), log=ctx.progress)
    return sink


def engine(ctx) -> dict:
    from tools.gpu.engine_bench import engine_step

    return engine_step(ctx)


STEPS = [  # (name, function, seconds it needs at least to be worth starting)
    ("env", env_info, 0),
    ("install", install, 20),
    ("compile", compile_kernels, 90),
    ("tests", run_tests, 40),
    ("accuracy", accuracy, 20),
    ("attention", attention, 30),
    ("layers", layers, 40),
    ("graphs", graphs, 40),
    ("draft", draft, 30),
    ("engine", engine, 30),
]
