"""The `accuracy` step: the largest differences of FlashInfer and SDPA from the torch reference of the
kernel (attention/paged_reference.py), bf16 and fp16, on mixed, decode-only and chain-only batches; against
the reference's output both rounded to the dtype and unrounded (float32 throughout)."""

from __future__ import annotations

from tools.gpu.kernels import DTYPES


def accuracy(ctx) -> list:
    import random

    import torch

    from adaserve_backend.attention.flashinfer_plan import build_plan
    from adaserve_backend.attention.paged_reference import paged_attention
    from tools.gpu.measuring import make_attention, short
    from tools.gpu_batches import build, qkv, random_requests

    rows: list = []
    ctx.results["accuracy"] = rows
    backends = ["sdpa"] if ctx.no_flashinfer else ["flashinfer", "sdpa"]
    batches = {"mixed": None, "decode": ("decode",), "chains": ("prefill", "decode")}
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for i, (label, kinds) in enumerate(batches.items()):
            rng = random.Random(i)
            requests = random_requests(rng, 8, max_context=2048, kinds=kinds or ("decode", "prefill", "tree", "beam"))
            if kinds is None:
                requests.append(("tree", 1500, 64))
            batch = build(requests, dtype=dtype, device="cuda", seed=i)
            q, k, v = qkv(batch.num_tokens, 32, 8, 128, dtype, "cuda", seed=i)
            for name in backends:
                compiled = DTYPES if ctx.flashinfer_dtypes is None else ctx.flashinfer_dtypes
                if name == "flashinfer" and dtype_name not in compiled:
                    continue  # its kernels did not compile: not tried again here
                row = {"dtype": dtype_name, "batch": label, "backend": name, "tokens": batch.num_tokens}
                rows.append(row)
                try:
                    attn = make_attention(name, batch.cache, 32)
                    attn.plan(batch.meta)
                    got = attn.forward(0, q, k, v).float()
                    want = paged_attention(build_plan(batch.meta), q, *batch.cache.layer(0)).float()
                    unrounded = paged_attention(build_plan(batch.meta), q.float(),
                                                *(t.float() for t in batch.cache.layer(0)))
                    row.update(max_abs_err=float((got - want).abs().max()),
                               max_abs_err_vs_unrounded=float((got - unrounded).abs().max()),
                               max_abs_ref=float(want.abs().max()))
                except Exception as e:
                    row["error"] = short(e)
    return rows
