"""A stand-in for flashinfer's two paged wrappers, for running FlashInferBackend (attention/flashinfer_cuda.py)
on the CPU: they read their arguments as flashinfer's documented contract does (kv lengths from the page
indptr and last-page lengths, mask segments of qo_len x kv_len bits from those) and compute with the torch
reference of the kernel. Where the real flashinfer-python imports (never in CI; on the CPU too with the
unpacked wheel on PYTHONPATH), every call is also bound to the real signatures, so a renamed or misspelt
argument fails here rather than on a lent GPU.

The prefill wrapper in graph mode (`use_cuda_graph=True`) keeps flashinfer 0.6.18's contract (prefill.py):
the batch is fixed at construction (len(qo_indptr_buf) - 1), the first plan fixes the most query rows,
plan copies the page tables, the packed mask and its byte offsets into the given buffers (raising where
flashinfer raises: another batch size, more rows, more page indices than the buffer holds, a mask without
mask buffers), and run reads only those buffers, masked whenever custom_mask_buf was given. So a graph's
plan that wrote the wrong buffers computes the wrong thing here too."""

from __future__ import annotations

import inspect
import sys
import types

import torch

from adaserve_backend.attention import flashinfer_cuda
from adaserve_backend.attention.flashinfer_plan import FlashInferPlan, pack_segments
from adaserve_backend.attention.paged_reference import paged_attention


def real_flashinfer():
    """The installed flashinfer, when one imports here, to bind calls to its signatures."""
    module = sys.modules.get("flashinfer")
    if isinstance(module, types.ModuleType) and not getattr(module, "STAND_IN", False):
        return module
    try:
        import flashinfer
    except Exception:
        return None
    return flashinfer


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []


def bind(real, cls_name: str, method: str, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name, bound to the real flashinfer's signature when it is importable."""
    if real is not None:
        cls = getattr(real, cls_name)
        fn = getattr(cls, "_plan_impl", None) if method == "plan" and cls_name.startswith("BatchDecode") else None
        fn = fn or getattr(cls, method)
        bound = inspect.signature(fn).bind(None, *args, **kwargs)
        return {k: v for k, v in bound.arguments.items() if k != "self"}
    return {"args": args, **kwargs}


def stand_in(recorder: Recorder, real) -> types.ModuleType:
    """flashinfer's two paged wrappers as their contract reads the arguments, computing with the reference."""

    def interpret(qo_indptr, kv_indptr, indices, last, page, custom_mask) -> FlashInferPlan:
        for t in (qo_indptr, kv_indptr, last, indices):
            assert t.dtype == torch.int32, "every index array is int32"
        q_lens = qo_indptr.diff().tolist()
        kv_lens = ((kv_indptr.diff() - 1) * page + last).tolist()  # as _compute_page_mask_indptr reads them
        packed = offsets = None
        if custom_mask is not None:
            assert custom_mask.dtype == torch.bool and custom_mask.dim() == 1
            packed, offsets = pack_segments(custom_mask, [q * k for q, k in zip(q_lens, kv_lens)])
        return FlashInferPlan(page, qo_indptr, kv_indptr, indices, last, custom_mask, packed, offsets,
                              tuple(q_lens), tuple(kv_lens))

    class Prefill:
        def __init__(self, *args, **kwargs) -> None:
            recorder.calls.append(("prefill.init", bind(real, "BatchPrefillWithPagedKVCacheWrapper", "__init__",
                                                        args, kwargs)))
            assert kwargs.get("kv_layout") == "NHD" and kwargs.get("backend") == "fa2"
            self.graph = None
            if kwargs.get("use_cuda_graph"):
                self.graph = GraphBuffers(kwargs["qo_indptr_buf"], kwargs["paged_kv_indptr_buf"],
                                          kwargs["paged_kv_indices_buf"], kwargs["paged_kv_last_page_len_buf"],
                                          kwargs.get("custom_mask_buf"), kwargs.get("mask_indptr_buf"))

        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, **kw) -> None:
            args = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                    num_kv_heads, head_dim_qk, page_size)
            recorder.calls.append(("prefill.plan", bind(real, "BatchPrefillWithPagedKVCacheWrapper", "plan", args, kw)))
            assert kw.get("packed_custom_mask") is None, "flashinfer PR 2201: custom_mask only"
            assert kw["pos_encoding_mode"] == "NONE"
            assert kw["causal"] == (kw.get("custom_mask") is None)
            self.plan_ = interpret(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size,
                                   kw.get("custom_mask"))
            self.dtype = kw["q_data_type"]
            if self.graph is not None:
                self.graph.write(self.plan_)

        def run(self, q, paged_kv_cache, *args, out=None, **kw):
            recorder.calls.append(("prefill.run", bind(real, "BatchPrefillWithPagedKVCacheWrapper", "run",
                                                       (q, paged_kv_cache) + args, dict(kw, out=out))))
            assert q.dtype == self.dtype and q.stride(-1) == 1
            plan = self.plan_ if self.graph is None else self.graph.read(self.plan_.page_size)
            out.copy_(paged_attention(plan, q, *paged_kv_cache))
            return out

    class Decode(Prefill):
        def __init__(self, *args, **kwargs) -> None:
            recorder.calls.append(("decode.init", bind(real, "BatchDecodeWithPagedKVCacheWrapper", "__init__",
                                                       args, kwargs)))
            assert kwargs.get("use_tensor_cores") is True and kwargs.get("backend") == "fa2"

        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
            args = (indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
            recorder.calls.append(("decode.plan", bind(real, "BatchDecodeWithPagedKVCacheWrapper", "plan", args, kw)))
            assert kw["pos_encoding_mode"] == "NONE"
            qo = torch.arange(len(last_page_len) + 1, dtype=torch.int32)  # one query per request
            self.plan_ = interpret(qo, indptr, indices, last_page_len, page_size, None)
            self.dtype = kw["q_data_type"]

        def run(self, q, paged_kv_cache, *args, out=None, **kw):
            recorder.calls.append(("decode.run", bind(real, "BatchDecodeWithPagedKVCacheWrapper", "run",
                                                      (q, paged_kv_cache) + args, dict(kw, out=out))))
            assert q.shape[0] == len(self.plan_.q_lens) and q.dtype == self.dtype
            out.copy_(paged_attention(self.plan_, q, *paged_kv_cache))
            return out

    module = types.ModuleType("flashinfer")
    module.STAND_IN = True
    module.BatchPrefillWithPagedKVCacheWrapper = Prefill
    module.BatchDecodeWithPagedKVCacheWrapper = Decode
    return module


class GraphBuffers:
    """A graph-mode prefill wrapper's buffers: what plan writes and run reads (flashinfer 0.6.18)."""

    def __init__(self, qo_indptr, kv_indptr, indices, last, mask, mask_indptr) -> None:
        self.qo_indptr, self.kv_indptr, self.indices, self.last = qo_indptr, kv_indptr, indices, last
        self.mask, self.mask_indptr = mask, mask_indptr
        self.batch = len(qo_indptr) - 1
        if len(kv_indptr) != self.batch + 1 or len(last) != self.batch:
            raise ValueError("graph-mode buffers of different batch sizes")
        self.max_rows = None  # fixed by the first plan

    def write(self, p: FlashInferPlan) -> None:
        rows = int(p.qo_indptr[-1])
        self.max_rows = rows if self.max_rows is None else self.max_rows
        if len(p.q_lens) != self.batch:
            raise ValueError(f"a plan of {len(p.q_lens)} requests for a graph-mode wrapper of {self.batch}")
        if rows > self.max_rows:
            raise ValueError(f"{rows} query rows where the first plan fixed {self.max_rows}")
        if len(p.paged_kv_indices) > len(self.indices):
            raise ValueError("The length of paged_kv_indices exceeds the allocated buffer size.")
        self.qo_indptr.copy_(p.qo_indptr)
        self.kv_indptr.copy_(p.paged_kv_indptr)
        self.last.copy_(p.paged_kv_last_page_len)
        self.indices[: len(p.paged_kv_indices)].copy_(p.paged_kv_indices)
        if p.packed_custom_mask is not None:
            if self.mask is None or self.mask_indptr is None:
                raise ValueError("custom_mask_buf must be initialized with a torch.Tensor in cuda graph mode")
            self.mask[: len(p.packed_custom_mask)].copy_(p.packed_custom_mask)  # raises past the buffer's end
            self.mask_indptr.copy_(p.mask_indptr)

    def read(self, page: int) -> FlashInferPlan:
        """The plan the captured kernels see: the buffers' contents, masked iff a mask buffer was given."""
        q_lens = self.qo_indptr.diff().tolist()
        kv_lens = ((self.kv_indptr.diff() - 1) * page + self.last).tolist()
        return FlashInferPlan(page, self.qo_indptr, self.kv_indptr, self.indices, self.last, None, self.mask,
                              self.mask_indptr if self.mask is not None else None, tuple(q_lens), tuple(kv_lens))


def install(monkeypatch) -> Recorder:
    """FlashInferBackend over CPU caches from now on (until the monkeypatch undoes it), flashinfer replaced by
    the stand-in; returns the record of the calls (`bound_to_real`: checked against the real signatures)."""
    real = real_flashinfer()
    recorder = Recorder()
    monkeypatch.setitem(sys.modules, "flashinfer", stand_in(recorder, real))
    monkeypatch.setattr(flashinfer_cuda, "require_cuda", lambda cache: None)
    monkeypatch.setattr(flashinfer_cuda, "workspace", lambda device: torch.zeros(1024, dtype=torch.uint8))
    recorder.bound_to_real = real is not None
    return recorder
