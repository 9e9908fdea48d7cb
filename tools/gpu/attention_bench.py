"""The `attention` measurement: one layer's attention, FlashInfer against torch's SDPA (the fallback), per
point at Llama-3.1-8B's attention shape (tools/gpu/points.py): plan time on the host, forward time on the
GPU, which FlashInfer kernel ran, and the KV bandwidth it reached."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from tools.gpu.measuring import BACKENDS, cuda_ms, empty_cache, host_ms, make_attention, short
from tools.gpu.points import PAGE, SHAPE, Point, kv_bytes
from tools.gpu_batches import build, qkv


def bench_attention(points: Sequence[Point], sink: list, deadline: float, backends: Sequence[str] = BACKENDS,
                    dtype: torch.dtype = torch.bfloat16, log=print, device="cuda") -> None:
    """One row per point into `sink` (appended before it is measured, so a failure leaves what came before)."""
    for i, pt in enumerate(points):
        row = {"name": pt.name, "requests": len(pt.requests), "tokens": sum(n for _, _, n in pt.requests),
               "context": max(c for _, c, _ in pt.requests)}
        sink.append(row)
        if time.monotonic() > deadline:
            row["skipped"] = "out of time"
            continue
        try:
            attention_point(pt, row, i, backends, dtype, device)
        except Exception as e:
            row["error"] = short(e)
        said = ", ".join(f"{b} {row.get(f'{b}_ms', row.get(f'{b}_error', '-'))}" for b in backends)
        log(f"  attention {pt.name}: {said}" + (f" ({row['error']})" if "error" in row else ""))
        empty_cache(device)


def attention_point(pt: Point, row: dict, seed: int, backends: Sequence[str], dtype: torch.dtype,
                    device="cuda") -> None:
    heads, kv_heads, dim = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    batch = build(pt.requests, page=PAGE, kv_heads=kv_heads, head_dim=dim, dtype=dtype, device=device, seed=seed)
    q, k, v = qkv(batch.num_tokens, heads, kv_heads, dim, dtype, device, seed=seed)
    row["kv_mb"] = round(kv_bytes(batch.meta, kv_heads, dim, q.element_size()) / 2**20, 1)
    for name in backends:
        try:
            attn = make_attention(name, batch.cache, heads)
            row[f"{name}_plan_ms"] = host_ms(lambda: attn.plan(batch.meta), device=device)
            timing = cuda_ms(lambda: attn.forward(0, q, k, v), device=device)
            row[f"{name}_ms"], row[f"{name}_min_ms"] = timing["ms"], timing["min_ms"]
            if name == "flashinfer":
                row["flashinfer_kernel"] = "decode" if attn.wrapper is attn.decode else (
                    "prefill causal" if attn.plan_inputs.causal else "prefill masked")
        except Exception as e:
            row[f"{name}_error"] = short(e)
    if row.get("flashinfer_ms") and row.get("sdpa_ms"):
        row["speedup"] = round(row["sdpa_ms"] / row["flashinfer_ms"], 2)
    if row.get("flashinfer_ms"):
        row["flashinfer_gb_s"] = round(row["kv_mb"] * 2**20 / (row["flashinfer_ms"] / 1e3) / 1e9, 1)
