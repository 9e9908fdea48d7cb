"""The `layers` measurement: a few decoder layers at Llama-3.1-8B's shape (tools/gpu/decoder_stack.py)
timed per forward for token budgets from 1 to 2,048 with each attention backend, scaled to 32 layers plus
the output head and the plan; with the HBM and FLOP rates reached, against the sheet's and the measured
peaks, and issue 72's targets judged from them.

The layers are alike in cost, so a few timed stand for all 32 (`--layers`, 4 by default)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from tools.gpu.decoder_stack import RandomDecoderStack
from tools.gpu.measuring import BACKENDS, cuda_ms, empty_cache, host_ms, make_attention, short
from tools.gpu.peaks import measured_peaks, spec_peaks
from tools.gpu.points import PAGE, SHAPE, Point, attention_pairs, kv_bytes, layer_points, logit_rows
from tools.gpu.targets import targets
from tools.gpu_batches import build


def bench_layers(layers: int, sink: dict, deadline: float, backends: Sequence[str] = BACKENDS,
                 quick: bool = False, log=print, device="cuda", points: Sequence[Point] | None = None) -> None:
    s = SHAPE
    cuda = torch.device(device).type == "cuda"
    spec_flops, spec_bw = spec_peaks(torch.cuda.get_device_properties(0).name) if cuda else (None, None)
    sink.update(layers=layers, scaled_to=s["layers"], shape=dict(s), spec_bf16_flops=spec_flops,
                spec_hbm_bytes_s=spec_bw)
    if cuda:
        try:
            sink["measured"] = measured_peaks()
        except Exception as e:
            sink["measured_error"] = short(e)
        empty_cache(device)
    stack = RandomDecoderStack(layers, device=device)
    sink["layer_weight_mb"] = round(stack.layer_bytes / 2**20, 1)
    rows = sink.setdefault("points", [])
    for i, pt in enumerate(layer_points(quick) if points is None else points):
        base = {"name": pt.name, "requests": len(pt.requests), "tokens": sum(n for _, _, n in pt.requests),
                "context": max(c for _, c, _ in pt.requests)}
        if time.monotonic() > deadline:
            rows.append(dict(base, skipped="out of time"))
            continue
        try:
            layer_point(stack, pt, base, i, backends, rows, (spec_flops, spec_bw), log)
        except Exception as e:
            rows.append(dict(base, error=short(e)))
        empty_cache(device)
    sink["targets"] = targets(rows)


def layer_point(stack: RandomDecoderStack, pt: Point, base: dict, seed: int, backends: Sequence[str],
                points: list, peaks: tuple, log) -> None:
    s, layers, device = SHAPE, stack.layers, stack.device
    spec_flops, spec_bw = peaks
    batch = build(pt.requests, page=PAGE, kv_heads=s["kv_heads"], head_dim=s["head_dim"], dtype=stack.dtype,
                  device=device, layers=layers, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch.num_tokens, s["hidden"], generator=gen, dtype=stack.dtype, device=device)
    rows = x[: logit_rows(pt.requests)]
    lm_ms = cuda_ms(lambda: stack.logits(rows), warmup=2, reps=5, device=device)["ms"]
    pairs = attention_pairs(batch.meta)
    kv_read = kv_bytes(batch.meta, s["kv_heads"], s["head_dim"], x.element_size())
    lm_bytes = stack.lm_head.numel() * stack.lm_head.element_size()
    for name in backends:
        row = dict(base, backend=name, lm_head_ms=lm_ms)
        points.append(row)
        try:
            attn = make_attention(name, batch.cache, s["heads"])
            row["plan_ms"] = host_ms(lambda: attn.plan(batch.meta), device=device)
            t = cuda_ms(lambda: stack.forward(x, batch.positions, attn), warmup=2, reps=5, device=device)
            per_layer = t["ms"] / layers
            est = per_layer * s["layers"] + lm_ms + row["plan_ms"]
            row.update(layer_ms=round(per_layer, 4), est_forward_ms=round(est, 3),
                       tokens_per_s=round(base["tokens"] / (est / 1e3)))
            moved = s["layers"] * (stack.layer_bytes + kv_read) + lm_bytes
            flops = (2 * base["tokens"] * s["layers"] * stack.layer_params + 2 * rows.shape[0] * stack.lm_head.numel()
                     + s["layers"] * 4 * s["heads"] * s["head_dim"] * pairs)
            row["hbm_tb_s"] = round(moved / (est / 1e3) / 1e12, 3)
            row["tflops"] = round(flops / (est / 1e3) / 1e12, 1)
            if spec_bw:
                row["hbm_fraction"] = round(moved / (est / 1e3) / spec_bw, 3)
            if spec_flops:
                row["flops_fraction"] = round(flops / (est / 1e3) / spec_flops, 3)
        except Exception as e:
            row["error"] = short(e)
        log(f"  layers {pt.name} [{name}]: "
            + (f"{row['layer_ms']} ms/layer, est. {row['est_forward_ms']} ms at {s['layers']} layers"
               if "layer_ms" in row else row.get("error", "")))
