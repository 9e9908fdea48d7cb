"""The `draft` measurement: one beam step of an EAGLE-3-style draft head at Llama-3.1-8B's width
(tools/gpu/draft_head.py), eager and captured whole in a CUDA graph, against issue 72's target (a step
within 0.25 ms with CUDA graphs at batch 1-32; judged in tools/gpu/targets.py).

A beam step at batch b and width w: b requests, each with w new tokens (one per beam) over its committed
draft context plus the tokens drafted before in its tree. Width 1 is a chain (a decode over the context);
width 4 hangs the new tokens off a tree of 4 drafted earlier ("beam" in tools/gpu_batches.py), under a
custom mask built by the project's plan code. The step: embedding gather, the layer (its K and V written
into the paged cache), the head, top-w per row.

- eager: the step op by op with the attention backend the engine would use (FlashInferBackend, or SDPA
  when flashinfer is missing), planned once before the timings.
- graph: FlashInfer only. A graph-mode wrapper with fixed buffers (tools/gpu/graphed_attention.py) is
  planned outside the graph; the whole step is warmed up on a side stream, captured, and `replay()` is
  timed. Its outputs are checked against the eager step's (largest hidden-state difference, share of
  top-w ids that agree), so a graph that read the wrong mask or pages would show.

Plan times (host) are reported beside: a real beam step plans every time, graphs or not. `capture` is the
seam of the CPU tests (a CUDA graph needs a GPU): there a capture that reruns the step runs the same graph
path, wrapper and plan included, through a FlashInfer stand-in."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tools.gpu.draft_head import DRAFT_VOCAB, RandomDraftHead
from tools.gpu.measuring import cuda_ms, empty_cache, host_ms, make_attention, short
from tools.gpu.peaks import spec_peaks
from tools.gpu.points import PAGE, SHAPE, kv_bytes, same
from tools.gpu.targets import DRAFT_STEP_MS, draft_step_ok, draft_targets
from tools.gpu_batches import build

Capture = Callable[[Callable[[], tuple]], tuple[Callable[[], None], tuple]]


@dataclass(frozen=True)
class DraftPoint:
    batch: int
    width: int
    context: int

    @property
    def name(self) -> str:
        return f"b{self.batch} w{self.width} @ {self.context}"

    @property
    def requests(self):
        if self.width == 1:
            return same("decode", self.batch, 1, self.context)
        return same("beam", self.batch, self.width, self.context)


def draft_points(quick: bool = False) -> list[DraftPoint]:
    """Batches 1-32 at widths 1 and 4, over committed draft contexts of 512 and 2,048 tokens (512 first:
    a run short of time keeps the whole batch range at one context)."""
    batches = (1, 8, 32) if quick else (1, 4, 8, 16, 32)
    contexts = (512,) if quick else (512, 2048)
    return [DraftPoint(b, w, c) for c in contexts for w in (1, 4) for b in batches]


def cuda_capture(fn: Callable[[], tuple]) -> tuple[Callable[[], None], tuple]:
    """The engine's capture (adaserve_backend/cuda_graphs/capture.py), in a memory pool of its own."""
    from adaserve_backend.cuda_graphs.capture import cuda_capture as engine_capture

    return engine_capture(fn, None)


def bench_draft(sink: dict, deadline: float, backend: str = "flashinfer", quick: bool = False, log=print,
                device="cuda", points: Sequence[DraftPoint] | None = None, capture: Capture | None = None,
                no_graphs: str | None = None) -> None:
    """Rows into sink["points"] (each appended before it is measured), the target judged into
    sink["targets"]. `no_graphs`: why graphs are not measured, when the caller knows (flashinfer missing);
    on a device other than CUDA they are not unless a `capture` is given."""
    s = SHAPE
    cuda = torch.device(device).type == "cuda"
    if capture is None and cuda:
        capture = cuda_capture
    if backend != "flashinfer":
        no_graphs = no_graphs or f"the graph path is FlashInfer's, and this run's attention is {backend}"
    elif capture is None:
        no_graphs = no_graphs or "CUDA graphs need a CUDA device"
    spec_bw = spec_peaks(torch.cuda.get_device_properties(0).name)[1] if cuda else None
    sink.update(backend=backend, graphs=no_graphs is None, target_ms=DRAFT_STEP_MS, draft_vocab=DRAFT_VOCAB,
                embed_rows=s["vocab"], shape=dict(s), spec_hbm_bytes_s=spec_bw)
    if no_graphs:
        sink["graphs_not_measured"] = no_graphs
    rows = sink.setdefault("points", [])
    if cuda:
        empty_cache(device)
    head = RandomDraftHead(device=device)
    sink["weight_mb"] = round(head.weight_bytes / 2**20, 1)
    for i, pt in enumerate(draft_points(quick) if points is None else points):
        row = {"name": pt.name, "batch": pt.batch, "width": pt.width, "context": pt.context}
        rows.append(row)
        if time.monotonic() > deadline:
            row["skipped"] = "out of time"
            continue
        try:
            draft_point(head, pt, row, i, backend, None if no_graphs else capture, spec_bw)
        except Exception as e:
            row["error"] = short(e)
        log(f"  draft {pt.name}: eager {row.get('eager_ms', '-')} ms, graph {row.get('graph_ms', '-')} ms"
            + (f" ({row.get('error') or row.get('graph_error')})" if "error" in row or "graph_error" in row else ""))
        empty_cache(device)
    sink["targets"] = draft_targets(rows)


def draft_point(head: RandomDraftHead, pt: DraftPoint, row: dict, seed: int, backend: str,
                capture: Capture | None, spec_bw: float | None) -> None:
    s, device = SHAPE, head.device
    batch = build(pt.requests, page=PAGE, kv_heads=s["kv_heads"], head_dim=s["head_dim"], dtype=head.dtype,
                  device=device, layers=1, seed=seed)
    n = batch.num_tokens
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randint(0, head.embed.shape[0], (n,), generator=gen, device=device)
    hidden = torch.randn(n, s["hidden"], generator=gen, dtype=head.dtype, device=device)
    positions = batch.positions
    kv_read = kv_bytes(batch.meta, s["kv_heads"], s["head_dim"], hidden.element_size())
    read = head.bytes_read(n) + kv_read
    row.update(tokens=n, kv_mb=round(kv_read / 2**20, 2), read_mb=round(read / 2**20, 1))

    attn = make_attention(backend, batch.cache, s["heads"])
    row["eager_plan_ms"] = host_ms(lambda: attn.plan(batch.meta), device=device)

    def eager():
        return head.step(tokens, hidden, positions, lambda q, k, v: attn.forward(0, q, k, v), pt.width)

    t = cuda_ms(eager, warmup=3, reps=10, device=device)
    row.update(eager_ms=t["ms"], eager_min_ms=t["min_ms"])
    if spec_bw:
        row["eager_hbm_fraction"] = round(read / (t["ms"] / 1e3) / spec_bw, 3)
    if capture is None:
        return
    ref = eager()
    try:
        graph_point(head, pt, row, batch, (tokens, hidden, positions), ref, capture, read, spec_bw)
    except Exception as e:
        row["graph_error"] = short(e)


def graph_point(head: RandomDraftHead, pt: DraftPoint, row: dict, batch, inputs: tuple, ref: tuple,
                capture: Capture, read: int, spec_bw: float | None) -> None:
    """The step captured whole with a graph-mode wrapper planned outside, its replay timed and checked."""
    from tools.gpu.graphed_attention import GraphedAttention

    device = head.device
    attn = GraphedAttention(batch.cache, batch.meta, SHAPE["heads"], causal=pt.width == 1)
    row["graph_kernel"] = attn.kernel
    row["graph_plan_ms"] = host_ms(attn.plan, device=device)
    tokens, hidden, positions = inputs
    replay, out = capture(lambda: head.step(tokens, hidden, positions, attn.attend, pt.width))
    t = cuda_ms(replay, warmup=3, reps=20, device=device)
    row.update(graph_ms=t["ms"], graph_min_ms=t["min_ms"], target_ok=draft_step_ok(t["ms"]),
               speedup=round(row["eager_ms"] / t["ms"], 2) if t["ms"] > 0 else None)
    if spec_bw:
        row["hbm_fraction"] = round(read / (t["ms"] / 1e3) / spec_bw, 3)
    replay()
    h, _, ids = out
    row["graph_max_abs_diff"] = round(float((h.float() - ref[0].float()).abs().max()), 5)
    row["graph_ids_agree"] = round(float((ids == ref[2]).float().mean()), 4)
