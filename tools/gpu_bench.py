"""The measurements of `tools/gpu_check.py`, on CUDA: attention per layer, FlashInfer against torch's SDPA
(the fallback), on batches of token trees, decodes and a mix at Llama-3.1-8B's attention shape; and a
stack of a few decoder layers at Llama-3.1-8B's shape with random bfloat16 weights, timed per forward for
token budgets from 1 to 2,048 and scaled to 32 layers.

Everything is eager (no CUDA graphs yet): a figure is the median of CUDA-event timings of single calls
after warm-up, so launch overhead the GPU waits for counts. Imports torch and this project's attention
and kv_cache modules only (the GPU machine runs this with its own Python).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tools.gpu_batches import Request, build, qkv

# Llama-3.1-8B
SHAPE = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256, layers=32,
             rope_theta=500000.0)
PAGE = 16
BACKENDS = ("flashinfer", "sdpa")

# Dense bf16 tensor-core peak and HBM bandwidth from the vendors' sheets, by a substring of the device name.
SPEC_PEAKS = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12)}


def short(e: BaseException, limit: int = 600) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def cuda_ms(fn: Callable[[], object], warmup: int = 3, reps: int = 10, device="cuda") -> dict:
    """Median and minimum of `reps` CUDA-event timings of fn(), after `warmup` calls (wall time on a CPU,
    where the tests run this code)."""
    for _ in range(warmup):
        fn()
    sync(device)
    if torch.device(device).type != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return {"ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    return {"ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}


def host_ms(fn: Callable[[], object], reps: int = 3, device="cuda") -> float:
    """Median wall time of fn() up to the GPU's finishing it (planning: host work and copies)."""
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def make_attention(name: str, cache, heads: int):
    if name == "flashinfer":
        from adaserve_backend.attention.flashinfer_cuda import FlashInferBackend

        return FlashInferBackend(cache, heads)
    if name == "sdpa":
        from adaserve_backend.attention.torch_sdpa import TorchSDPABackend

        return TorchSDPABackend(cache, heads)
    raise ValueError(name)


def spec_peaks(device_name: str) -> tuple[float | None, float | None]:
    for key, peaks in SPEC_PEAKS.items():
        if key in device_name:
            return peaks
    return None, None


def measured_peaks() -> dict:
    """A device-to-device copy of 1 GiB (bytes read + written) and an 8192^3 bf16 matrix product."""
    return {"copy_tb_s": round(_copy_tb_s(), 3), "bf16_matmul_tflops": round(_matmul_tflops(), 1)}


def _copy_tb_s() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = cuda_ms(lambda: y.copy_(x), warmup=2, reps=5)["ms"]
    return 2 * x.numel() / (t / 1e3) / 1e12


def _matmul_tflops() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = cuda_ms(lambda: a @ b, warmup=3, reps=10)["ms"]
    return 2 * 8192**3 / (t / 1e3) / 1e12


# ---- attention per layer --------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    name: str
    requests: tuple[Request, ...]


def same(kind: str, count: int, n: int, context: int) -> tuple[Request, ...]:
    return tuple((kind, context, n) for _ in range(count))


def attention_points(quick: bool = False) -> list[Point]:
    """Batches of trees (8/32/64 requests x 16-64 tree tokens, contexts 512-4096), decode batches, a mix."""
    trees = [(8, 16, 512), (8, 64, 4096), (32, 16, 1024), (32, 64, 2048), (64, 16, 4096), (64, 32, 1024),
             (64, 64, 4096)]
    decodes = [(8, 2048), (32, 2048), (64, 4096)]
    if quick:
        trees, decodes = [(8, 64, 4096), (32, 64, 2048), (64, 32, 1024)], [(32, 2048)]
    points = [Point(f"{b} trees x {n} @ {c}", same("tree", b, n, c)) for b, n, c in trees]
    points += [Point(f"{b} decodes @ {c}", same("decode", b, 1, c)) for b, c in decodes]
    mix = (("prefill", 0, 512),) + same("tree", 16, 32, 2048) + same("decode", 16, 1, 2048)
    points.append(Point("mix: 512-token prefill + 16 trees x 32 + 16 decodes @ 2048", mix))
    return points


def kv_bytes(meta, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes of keys and values one layer's attention reads."""
    return sum(meta.kv_lens) * kv_heads * head_dim * 2 * itemsize


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


# ---- a stack of decoder layers at Llama-3.1-8B's shape -----------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class RandomDecoderStack:
    """`layers` Llama decoder layers (fused QKV and gate/up projections, RoPE, SwiGLU) with random weights,
    and the output head; attention through a planned backend over a KV cache of as many layers."""

    def __init__(self, layers: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0, max_pos: int = 8192,
                 device="cuda") -> None:
        s = SHAPE
        self.layers, self.dtype, self.device = layers, dtype, device
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, generator=gen, dtype=dtype, device=device) * 0.02)

        hidden, inter, D = s["hidden"], s["intermediate"], s["head_dim"]
        q, kv = s["heads"] * D, s["kv_heads"] * D
        self.weights = [dict(ln1=torch.ones(hidden, dtype=dtype, device=device), qkv=w(q + 2 * kv, hidden),
                             o=w(hidden, q), ln2=torch.ones(hidden, dtype=dtype, device=device),
                             gate_up=w(2 * inter, hidden), down=w(hidden, inter))
                        for _ in range(layers)]
        self.norm = torch.ones(hidden, dtype=dtype, device=device)
        self.lm_head = w(s["vocab"], hidden)
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
        freqs = torch.arange(max_pos, dtype=torch.float32, device=device)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    @property
    def layer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights[0].values())

    @property
    def layer_params(self) -> int:
        return sum(t.numel() for t in self.weights[0].values())

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        s = SHAPE
        heads, kv_heads, D = s["heads"], s["kv_heads"], s["head_dim"]
        cos = self.cos.index_select(0, positions).to(self.dtype)[:, None, :]
        sin = self.sin.index_select(0, positions).to(self.dtype)[:, None, :]
        for i, w in enumerate(self.weights):
            qk, v = F.linear(rms_norm(x, w["ln1"]), w["qkv"]).split([(heads + kv_heads) * D, kv_heads * D], dim=-1)
            qk = rotate(qk.view(-1, heads + kv_heads, D), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=1)
            a = attn.forward(i, q, k, v.view(-1, kv_heads, D))
            x = x + F.linear(a.reshape(x.shape[0], -1), w["o"])
            gate, up = F.linear(rms_norm(x, w["ln2"]), w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        return x

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(rows, self.norm), self.lm_head)


def layer_points(quick: bool = False) -> list[Point]:
    """The issue's targets (batch-1 decode, a 64-token tree at batch 1 and 16, a 2,048-token prefill) and
    the curve of tokens per forward, 1 to 1,024, as min(T, 16) requests of T / min(T, 16) tokens each
    (trees; one token each is decode), all at a context of 1,024."""
    points = [Point("b1 decode", same("decode", 1, 1, 1024)), Point("b1 tree 64", same("tree", 1, 64, 1024)),
              Point("b16 decode", same("decode", 16, 1, 1024)), Point("b16 tree 64", same("tree", 16, 64, 1024)),
              Point("b1 prefill 2048", (("prefill", 0, 2048),))]
    budgets = [1, 4, 16, 64, 256, 1024] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for t in budgets:
        b = min(t, 16)
        n = t // b
        reqs = same("decode" if n == 1 else "tree", b, n, 1024)
        if all(reqs != p.requests for p in points):
            points.append(Point(f"curve {t} tokens ({b} x {n})", reqs))
    return points


def logit_rows(requests: Sequence[Request]) -> int:
    """Rows that need logits: every new token of decodes and trees, the last of a prefill chunk."""
    return sum(1 if kind == "prefill" else n for kind, _, n in requests)


def attention_pairs(meta) -> int:
    """Query-key pairs the masks allow (attention FLOPs are 4 x heads x head_dim x pairs per layer)."""
    return int(sum(int(m.sum()) for m in meta.masks))


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


def empty_cache(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


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


def targets(points: Sequence[dict]) -> dict:
    """Issue 72's speed targets, per backend, from the layer points (eager; CUDA graphs would come later)."""
    out = {}
    for name in BACKENDS:
        by = {p["name"]: p for p in points if p.get("backend") == name and "est_forward_ms" in p}
        t: dict = {}
        if "b1 decode" in by:
            d = by["b1 decode"]
            t["b1_decode_ms"] = d["est_forward_ms"]
            t["b1_decode_ok"] = d["est_forward_ms"] <= 6.5
            if "hbm_fraction" in d:
                t["b1_decode_hbm_fraction"] = d["hbm_fraction"]
        for b in ("b1", "b16"):
            if f"{b} decode" in by and f"{b} tree 64" in by:
                ratio = by[f"{b} tree 64"]["est_forward_ms"] / by[f"{b} decode"]["est_forward_ms"]
                t[f"{b}_tree64_over_decode"] = round(ratio, 3)
                t[f"{b}_tree64_ok"] = ratio <= 1.15
        if "b1 prefill 2048" in by and "flops_fraction" in by["b1 prefill 2048"]:
            t["prefill2048_flops_fraction"] = by["b1 prefill 2048"]["flops_fraction"]
            t["prefill2048_ok"] = by["b1 prefill 2048"]["flops_fraction"] >= 0.6
        if t:
            out[name] = t
    return out
