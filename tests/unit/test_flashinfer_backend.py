"""The FlashInfer backend's CPU-side parts (attention/flashinfer_cuda.py): a clear error without flashinfer,
the refusals (a CPU or float32 cache), the one-read chain check and the host index arrays against the plan
module's, and the whole plan/forward plumbing run on the CPU against a stand-in for flashinfer's two
wrappers. The stand-in reads its arguments as flashinfer's documented contract does (kv lengths from the
page indptr and last-page lengths, mask segments of qo_len x kv_len bits from those) and computes with the
torch reference; where the real flashinfer-python is importable, every call is also bound to the real
signatures. The kernels themselves are tests/gpu's business."""

from __future__ import annotations

import random
import sys

import pytest
import torch

from adaserve_backend.attention import flashinfer_cuda
from adaserve_backend.attention.flashinfer_cuda import (
    FlashInferBackend,
    batch_is_causal,
    host_index,
    import_flashinfer,
)
from adaserve_backend.attention.flashinfer_plan import build_plan, is_causal
from adaserve_backend.attention.metadata import build_metadata
from adaserve_backend.attention.paged_reference import paged_attention
from adaserve_backend.kv_cache import KVCache
from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tools.gpu_batches import KINDS, build, qkv, random_requests


def test_a_missing_flashinfer_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer raises ImportError
    with pytest.raises(ImportError, match="flashinfer-python.*docs/gpu.md"):
        import_flashinfer()
    flashinfer_cuda.flashinfer_importable.cache_clear()
    try:
        assert flashinfer_cuda.flashinfer_importable() is False
    finally:
        flashinfer_cuda.flashinfer_importable.cache_clear()


def test_refuses_a_cpu_cache_and_a_float32_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ValueError, match="CUDA cache"):
        FlashInferBackend(KVCache(1, 2, 16, 4, 4, torch.bfloat16, "cpu"), 4)
    monkeypatch.setattr(flashinfer_cuda, "require_cuda", lambda cache: None)
    with pytest.raises(ValueError, match="bfloat16 and float16"):
        FlashInferBackend(KVCache(1, 2, 16, 4, 4, torch.float32, "cpu"), 4)
    with pytest.raises(ValueError, match="evenly"):
        FlashInferBackend(KVCache(1, 3, 16, 4, 4, torch.bfloat16, "cpu"), 4)
    with pytest.raises(ImportError, match="flashinfer-python"):  # checks first, then the import
        FlashInferBackend(KVCache(1, 2, 16, 4, 4, torch.bfloat16, "cpu"), 4)


@pytest.mark.parametrize("seed", range(12))
def test_the_one_read_chain_check_and_the_host_arrays_agree_with_the_plan_module(seed):
    rng = random.Random(seed)
    kinds = rng.choice([KINDS, ("decode",), ("prefill", "decode"), ("prefill",), ("tree",)])
    batch = build(random_requests(rng, rng.randrange(1, 7), max_context=80, max_chunk=40, max_tree=12, kinds=kinds),
                  page=rng.choice([1, 4, 16]), kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu", seed=seed)
    assert batch_is_causal(batch.meta) == is_causal(batch.meta.masks)
    plan = build_plan(batch.meta)
    host = host_index(plan.q_lens, plan.kv_lens, plan.page_size)
    assert all(t.device.type == "cpu" and t.dtype == torch.int32 for t in host)
    assert [t.tolist() for t in host] == [plan.qo_indptr.tolist(), plan.paged_kv_indptr.tolist(),
                                          plan.paged_kv_last_page_len.tolist()]


def test_a_chain_check_sees_one_wrong_bit():
    batch = build([("prefill", 5, 6), ("decode", 9, 1)], page=4, kv_heads=1, head_dim=8, dtype=torch.float32,
                  device="cpu")
    assert batch_is_causal(batch.meta)
    batch.meta.masks[0][3, 7] = False  # one ancestor hidden: no longer FlashInfer's causal rule
    assert not batch_is_causal(batch.meta) and not is_causal(batch.meta.masks)


# ---- the plumbing, against a stand-in for flashinfer -----------------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch):
    return stand_in_flashinfer(monkeypatch)


@pytest.mark.parametrize("seed", range(6))
def test_plan_and_forward_through_the_stand_in(fake_cuda, seed):
    rng = random.Random(50 + seed)
    heads, kv_heads = rng.choice([(4, 4), (8, 2), (6, 1)])
    requests = random_requests(rng, rng.randrange(2, 7), max_context=60, max_chunk=30, max_tree=10)
    batch = build(requests, page=rng.choice([1, 4, 16]), kv_heads=kv_heads, head_dim=16, dtype=torch.bfloat16,
                  device="cpu", layers=2, seed=seed)
    backend = FlashInferBackend(batch.cache, heads)
    kinds = [kind for kind, _, _ in requests]
    new = list(enumerate(batch.meta.q_lens))
    for step, wanted in enumerate([KINDS, ("decode",), ("prefill", "decode"), ("tree", "beam"), KINDS]):
        chosen = [new[i] for i, kind in enumerate(kinds) if kind in wanted]
        if not chosen:
            continue
        meta = build_metadata(batch.blocks, chosen, "cpu")
        backend.plan(meta)
        p = build_plan(meta)
        if p.decode_only:
            assert backend.wrapper is backend.decode
        else:
            assert backend.wrapper is backend.prefill and backend.plan_inputs.causal == p.causal
        for layer in (0, 1):
            q, k, v = qkv(sum(meta.q_lens), heads, kv_heads, 16, torch.bfloat16, "cpu", seed=step * 2 + layer)
            assert q.shape[0] == 1 or not q.is_contiguous()  # a view of the fused projection, as the model's
            got = backend.forward(layer, q, k, v)
            want = paged_attention(p, q, *batch.cache.layer(layer))  # over the pages forward() wrote into
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    runs = [args for name, args in fake_cuda.calls if name.endswith(".run")]
    assert runs and all(args.get("out") is not None for args in runs)
    if fake_cuda.bound_to_real:  # the calls were bound to flashinfer's own signatures: named as it names them
        plans = [args for name, args in fake_cuda.calls if name == "prefill.plan"]
        assert plans and all("custom_mask" in args and "paged_kv_last_page_len" in args for args in plans)


def test_the_kv_pair_is_the_cache_itself(fake_cuda):
    batch = build([("tree", 20, 5), ("decode", 3, 1)], page=4, kv_heads=2, head_dim=16, dtype=torch.float16,
                  device="cpu", layers=3)
    backend = FlashInferBackend(batch.cache, 4)
    for layer in range(3):
        k_cache, v_cache = backend.layers[layer]
        want_k, want_v = batch.cache.layer(layer)
        assert k_cache.data_ptr() == want_k.data_ptr() and v_cache.data_ptr() == want_v.data_ptr()
        assert k_cache.shape == (batch.cache.data.shape[2], 4, 2, 16)  # [pages, page_size, kv_heads, D]: NHD
    with pytest.raises(ValueError, match="pages of"):
        other = build([("decode", 3, 1)], page=8, kv_heads=2, head_dim=16, dtype=torch.float16, device="cpu")
        backend.plan(other.meta)


def test_backend_choice_by_device_dtype_and_whether_flashinfer_imports():
    from adaserve_backend.attention.backend import BACKENDS, choose_backend

    def never() -> bool:
        raise AssertionError("flashinfer's import is tried only for a half-precision CUDA cache under auto")

    assert "flashinfer" in BACKENDS
    assert choose_backend("auto", "cpu", torch.bfloat16, never) == "paged_cpu"
    assert choose_backend("auto", "cpu", torch.float32, never) == "torch"
    assert choose_backend("auto", "cuda", torch.float32, never) == "torch"  # float32 stays the exact oracle
    for dtype in (torch.bfloat16, torch.float16):
        assert choose_backend("auto", "cuda", dtype, lambda: True) == "flashinfer"
        assert choose_backend("auto", "cuda", dtype, lambda: False) == "torch"  # the fallback
    for name in ("torch", "paged_cpu", "flashinfer"):
        assert choose_backend(name, "cuda", torch.bfloat16, never) == name


def test_make_backend_by_name(monkeypatch):
    from adaserve_backend.attention.backend import make_backend
    from adaserve_backend.attention.torch_sdpa import TorchSDPABackend

    cache = KVCache(1, 2, 16, 8, 4, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="CUDA cache"):
        make_backend("flashinfer", cache, 4)
    assert isinstance(make_backend("torch", cache, 4), TorchSDPABackend)
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_backend("flash", cache, 4)
    stand_in_flashinfer(monkeypatch)
    assert isinstance(make_backend("flashinfer", cache, 4), FlashInferBackend)
