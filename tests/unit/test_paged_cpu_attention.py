"""The C++ kernel that reads the paged cache in place (attention/paged_cpu.py) against torch's SDPA
backend on the same cache and metadata: decode steps, token trees spanning several query chunks, a
causal chunk, blocks of 4 to 128 slots, head dims 32 to 128; float32 to rounding, bfloat16 to its precision. The kernel
is also checked end to end against transformers in test_model_runtime.py."""

from __future__ import annotations

import random

import pytest
import torch

from adaserve_backend.attention import paged_cpu
from adaserve_backend.attention.backend import make_backend
from adaserve_backend.attention.cpu_kernel import paged_attention_op
from adaserve_backend.attention.metadata import build_metadata
from adaserve_backend.attention.torch_sdpa import TorchSDPABackend
from adaserve_backend.kv_cache import BlockManager, KVCache

pytestmark = pytest.mark.skipif(paged_attention_op() is None, reason="the C++ kernel does not build here")

KV_HEADS, DIM, HEADS = 3, 64, 9


def tree(rng: random.Random, n: int) -> list[int]:
    return [-1] + [rng.randrange(max(0, i - 3), i) for i in range(1, n)]


@pytest.mark.parametrize("dtype,tol,dim",
                         [(torch.float32, 1e-5, DIM), (torch.bfloat16, 2e-2, 32), (torch.bfloat16, 2e-2, DIM),
                                           (torch.bfloat16, 2e-2, 96), (torch.bfloat16, 2e-2, 128)])
@pytest.mark.parametrize("block_size", [4, 16, 128])
def test_kernel_matches_sdpa(dtype, tol, dim, block_size):
    rng = random.Random(0)
    torch.manual_seed(0)
    blocks = BlockManager(512, block_size)
    cache = KVCache(2, KV_HEADS, dim, 512, block_size, dtype, "cpu")
    cache.data.normal_()
    contexts = [1, 37, 150, 16, 90]
    new = [1, 13, 1, 20, 5]  # decode, a tree over two query chunks, decode, a causal chunk, a tree
    for s, (c, n) in enumerate(zip(contexts, new)):
        blocks.append(s, [-1] + list(range(c - 1)))
        blocks.commit_all(s)
        blocks.append(s, [-1] + list(range(n - 1)) if s == 3 else tree(rng, n) if n > 1 else [-1])
    meta = build_metadata(blocks, list(enumerate(new)), "cpu")
    q = torch.randn(sum(new), HEADS, dim).to(dtype)
    k, v = torch.randn(sum(new), KV_HEADS, dim).to(dtype), torch.randn(sum(new), KV_HEADS, dim).to(dtype)
    ours, ref = paged_cpu.PagedCPUBackend(cache, HEADS, paged_attention_op()), TorchSDPABackend(cache, HEADS)
    ours.plan(meta)
    ref.plan(meta)
    for layer in range(2):
        torch.testing.assert_close(ours.forward(layer, q, k, v).float(),
                                   ref.forward(layer, q, k, v).float(), atol=tol, rtol=tol)


def test_auto_picks_the_kernel_for_bf16_only_and_falls_back_without_it(monkeypatch):
    bf16 = KVCache(1, KV_HEADS, DIM, 8, 4, torch.bfloat16, "cpu")
    fp32 = KVCache(1, KV_HEADS, DIM, 8, 4, torch.float32, "cpu")
    assert isinstance(make_backend("auto", bf16, HEADS), paged_cpu.PagedCPUBackend)
    assert isinstance(make_backend("auto", fp32, HEADS), TorchSDPABackend)  # float32 stays the exact oracle
    monkeypatch.setattr("adaserve_backend.attention.cpu_kernel.paged_attention_op", lambda: None)
    assert isinstance(make_backend("auto", bf16, HEADS), TorchSDPABackend)
    with pytest.raises(RuntimeError, match="could not be built"):
        make_backend("paged_cpu", bf16, HEADS)
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_backend("flash", bf16, HEADS)
