"""The check's steps, in order, each with the seconds it needs at least to be worth starting; and the two
measurement steps' glue: which backends (SDPA alone when flashinfer did not install or compile) and how
much of the budget each may take (the attention points leave the layer step its reserve)."""

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
    bench_layers(ctx.layers, sink, ctx.deadline - 10, backends, quick=ctx.quick, log=ctx.progress)
    return sink


STEPS = [  # (name, function, seconds it needs at least to be worth starting)
    ("env", env_info, 0),
    ("install", install, 20),
    ("compile", compile_kernels, 90),
    ("tests", run_tests, 40),
    ("accuracy", accuracy, 20),
    ("attention", attention, 30),
    ("layers", layers, 40),
]
