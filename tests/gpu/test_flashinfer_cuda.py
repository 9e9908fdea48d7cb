"""Attention on CUDA against the torch reference of FlashInfer's kernel (attention/paged_reference.py),
which reads nothing but the plan inputs and the NHD pages: FlashInferBackend (attention/flashinfer_cuda.py)
on mixed batches (prefill chunks, token trees, draft beam steps, decodes), on decode-only batches (the
decode wrapper), on chain-only batches (causal, no mask), across forwards of every kind on one backend,
with GQA groups of 1 to 8, pages of 1 to 32 slots, bf16 and fp16; FlashInfer's own packing of our mask
against ours (the bytes the kernel reads); and TorchSDPABackend on CUDA, the fallback, in bf16, fp16 and
float32. Batches: tools/gpu_batches.py (scattered pages, random keys and values, q a strided view).

Skipped without a CUDA device, and the FlashInfer tests without flashinfer-python; pytest's -ra summary
prints the reason. `python3 -m tools.gpu_check` runs them on a lent GPU machine (docs/gpu.md).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from adaserve_backend.attention.flashinfer_plan import build_plan, unpack_segments
from adaserve_backend.attention.metadata import build_metadata
from adaserve_backend.attention.paged_reference import paged_attention
from adaserve_backend.attention.torch_sdpa import TorchSDPABackend
from tools.gpu_batches import KINDS, build, qkv, random_requests

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="GPU test: no CUDA device here (torch.cuda.is_available() is False)")

HEADS, KV_HEADS, DIM = 32, 8, 128  # Llama-3.1-8B's attention
TOLERANCE = {
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.float32: dict(atol=1e-4, rtol=1e-4),
}
HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.fixture(scope="module")
def flashinfer_backend():
    """The FlashInferBackend class, or a skip saying why it cannot run here."""
    if os.environ.get("GPU_CHECK_NO_FLASHINFER"):
        pytest.skip(f"flashinfer left out by tools/gpu_check: {os.environ['GPU_CHECK_NO_FLASHINFER']}")
    from adaserve_backend.attention.flashinfer_cuda import FlashInferBackend, import_flashinfer

    try:
        import_flashinfer()
    except Exception as e:
        pytest.skip(f"flashinfer does not import here: {type(e).__name__}: {e}")
    return FlashInferBackend


def compiled(dtype: torch.dtype) -> None:
    """Skip a FlashInfer test of a dtype whose kernels tools/gpu_check could not compile (not tried again)."""
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    allowed = os.environ.get("GPU_CHECK_FLASHINFER_DTYPES")
    if allowed and names[dtype] not in allowed.split(","):
        pytest.skip(f"flashinfer's {names[dtype]} kernels did not compile in tools/gpu_check")


def attend(backend, batch, heads: int, seed: int, layer: int = 0, meta=None):
    """(backend output, reference output, q) for one forward of random q, k, v over `batch`'s cache, planned
    with `meta` (default: the batch's own)."""
    meta = meta or batch.meta
    kv_heads, dim = batch.cache.data.shape[-2], batch.cache.data.shape[-1]
    q, k, v = qkv(sum(meta.q_lens), heads, kv_heads, dim, batch.cache.data.dtype, "cuda", seed)
    backend.plan(meta)
    got = backend.forward(layer, q, k, v)  # writes this forward's keys and values into the pages first
    plan = getattr(backend, "plan_inputs", None) or build_plan(meta)
    want = paged_attention(plan, q, *batch.cache.layer(layer))
    assert got.shape == q.shape and got.dtype == q.dtype and torch.isfinite(got).all()
    return got, want, q


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("seed, page", [(0, 16), (1, 16), (2, 1), (3, 7), (4, 32)])
def test_mixed_batches_match_the_reference(flashinfer_backend, dtype, seed, page):
    compiled(dtype)
    rng = random.Random(seed)
    requests = random_requests(rng, rng.randrange(3, 9))
    requests.append(("tree", rng.randrange(1, 700), 64))  # at least one tree: the custom-mask path
    batch = build(requests, page=page, kv_heads=KV_HEADS, head_dim=DIM, dtype=dtype, seed=seed)
    backend = flashinfer_backend(batch.cache, HEADS)
    got, want, _ = attend(backend, batch, HEADS, seed)
    assert backend.wrapper is backend.prefill and not backend.plan_inputs.causal
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


@pytest.mark.parametrize("heads, kv_heads", [(8, 8), (9, 3), (16, 2), (28, 4), (32, 8)])  # groups 1, 3, 8, 7, 4
def test_gqa_groups(flashinfer_backend, heads, kv_heads):
    rng = random.Random(heads)
    for kinds in (("tree", "prefill", "decode", "beam"), ("decode",), ("prefill", "decode")):
        batch = build(random_requests(rng, 5, kinds=kinds), kv_heads=kv_heads, head_dim=DIM, seed=heads)
        got, want, _ = attend(flashinfer_backend(batch.cache, heads), batch, heads, seed=heads)
        torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("dtype", HALF)
def test_decode_batches_take_the_decode_wrapper(flashinfer_backend, dtype):
    compiled(dtype)
    requests = [("decode", c, 1) for c in (1, 15, 16, 17, 700, 2048, 33)]
    batch = build(requests, kv_heads=KV_HEADS, head_dim=DIM, dtype=dtype, seed=5)
    backend = flashinfer_backend(batch.cache, HEADS)
    got, want, _ = attend(backend, batch, HEADS, seed=5)
    assert backend.wrapper is backend.decode
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", HALF)
def test_chain_batches_plan_causal_and_match_their_masks(flashinfer_backend, dtype):
    compiled(dtype)
    requests = [("prefill", 0, 300), ("prefill", 129, 64), ("decode", 40, 1), ("prefill", 5, 1)]
    batch = build(requests, kv_heads=KV_HEADS, head_dim=DIM, dtype=dtype, seed=6)
    backend = flashinfer_backend(batch.cache, HEADS)
    got, want, q = attend(backend, batch, HEADS, seed=6)
    assert backend.wrapper is backend.prefill and backend.plan_inputs.causal
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])
    # the reference through the mask bits instead of the causal rule: the same attention
    masked = paged_attention(build_plan(batch.meta, causal=False), q, *batch.cache.layer(0))
    torch.testing.assert_close(masked, want, atol=0, rtol=0)


def test_flashinfer_packs_our_mask_into_the_bytes_our_plan_has(flashinfer_backend):
    """plan(custom_mask=) packs with segment_packbits; the kernel then reads mask_indptr bytes. Both must be
    what build_plan computes (the reference reads those), for several requests (where PR 2201 bites)."""
    rng = random.Random(7)
    batch = build(random_requests(rng, 6, kinds=("tree", "beam", "prefill")) + [("tree", 9, 13)],
                  kv_heads=KV_HEADS, head_dim=DIM, seed=7)
    backend = flashinfer_backend(batch.cache, HEADS)
    backend.plan(batch.meta)
    packed = getattr(backend.prefill, "_custom_mask_buf", None)
    offsets = getattr(backend.prefill, "_mask_indptr_buf", None)
    if packed is None or offsets is None:
        pytest.skip("this flashinfer keeps its packed mask under other names")
    p = backend.plan_inputs
    assert offsets.tolist() == p.mask_indptr.tolist()
    assert torch.equal(packed.to(torch.uint8), p.packed_custom_mask)
    lengths = [q * k for q, k in zip(p.q_lens, p.kv_lens)]
    assert torch.equal(unpack_segments(packed.to(torch.uint8), offsets, lengths), p.custom_mask)


def test_one_backend_across_forwards_of_every_kind(flashinfer_backend):
    """One backend over one cache, planned forward after forward as the engine does, each forward a
    different subset of the sequences (trees, decodes, chains, all), over two layers: nothing a plan leaves
    in a wrapper (a packed mask, a backend choice) may leak into the next."""
    rng = random.Random(8)
    requests = random_requests(rng, 10) + [("tree", 33, 40), ("decode", 70, 1), ("prefill", 0, 90)]
    batch = build(requests, kv_heads=KV_HEADS, head_dim=DIM, layers=2, seed=8)
    new = list(enumerate(batch.meta.q_lens))
    kinds = [kind for kind, _, _ in requests]
    subsets = [("tree", "beam"), ("decode",), ("prefill", "decode"), KINDS, ("tree",), ("decode",)]
    backend = flashinfer_backend(batch.cache, HEADS)
    for step, wanted in enumerate(subsets):
        chosen = [new[i] for i, kind in enumerate(kinds) if kind in wanted]
        meta = build_metadata(batch.blocks, chosen, "cuda")
        for layer in (0, 1):
            got, want, _ = attend(backend, batch, HEADS, seed=step, layer=layer, meta=meta)
            torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])
        if wanted == ("decode",):
            assert backend.wrapper is backend.decode


@pytest.mark.parametrize("dtype", HALF + [pytest.param(torch.float32, id="fp32")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sdpa_on_cuda_matches_the_reference(dtype, seed):
    rng = random.Random(100 + seed)
    requests = random_requests(rng, rng.randrange(2, 8)) + [("tree", 300, 32)]
    batch = build(requests, page=rng.choice([1, 16]), kv_heads=KV_HEADS, head_dim=DIM, dtype=dtype, seed=seed)
    got, want, _ = attend(TorchSDPABackend(batch.cache, HEADS), batch, HEADS, seed)
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_sdpa_on_cuda_decode_and_chains():
    for requests in ([("decode", c, 1) for c in (1, 64, 900)], [("prefill", 0, 128)], [("prefill", 64, 64)]):
        batch = build(requests, kv_heads=KV_HEADS, head_dim=DIM, seed=3)
        got, want, _ = attend(TorchSDPABackend(batch.cache, HEADS), batch, HEADS, seed=3)
        torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])


def test_auto_picks_flashinfer_for_half_caches_and_sdpa_for_float32(flashinfer_backend):
    from adaserve_backend.attention.backend import make_backend

    for dtype in (torch.bfloat16, torch.float16):  # choosing builds the backend, runs no kernel
        cache = build([("decode", 5, 1)], kv_heads=KV_HEADS, head_dim=DIM, dtype=dtype).cache
        assert isinstance(make_backend("auto", cache, HEADS), flashinfer_backend)
        assert isinstance(make_backend("torch", cache, HEADS), TorchSDPABackend)
    cache = build([("decode", 5, 1)], kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32).cache
    assert isinstance(make_backend("auto", cache, HEADS), TorchSDPABackend)  # float32: the exact oracle
