"""The `graphs` measurement: the engine's own decode step (ModelRunner.forward: metadata, plan, forward, the
logits) at Llama-3.1-8B's shape, eager and replayed as a CUDA graph (adaserve_backend/cuda_graphs/decode.py).

The model is the engine's LlamaModel with random bf16 weights, built on the device (no checkpoint can be
carried). A few layers are timed, twice: with `layers` and with half as many, so the per-layer cost and
the fixed cost (embedding, head, plan, host work) separate, and a 32-layer step is fixed + 32 x per-layer.
Times are wall times of whole steps, the GPU synchronized: what a decode iteration costs the engine, host
work included, not a kernel's time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from tools.gpu.measuring import short, sync
from tools.gpu.points import PAGE, SHAPE

BATCHES = (1, 16)
CONTEXT = 1024


def random_llama_model(layers: int, device="cuda", dtype=torch.bfloat16, shape: dict = SHAPE, max_len: int = 4096):
    """The engine's LlamaModel at `shape` with `layers` random layers, made on `device`."""
    from transformers import LlamaConfig

    from adaserve_backend.models.llama import LlamaModel, LlamaSpec

    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"], num_hidden_layers=layers,
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                         head_dim=shape["head_dim"],
                         rope_theta=shape["rope_theta"], max_position_embeddings=max_len, tie_word_embeddings=False)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden, inter = shape["hidden"], shape["intermediate"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]

    def w(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=dtype) * 0.02

    sd = {"model.embed_tokens.weight": w(shape["vocab"], hidden), "lm_head.weight": w(shape["vocab"], hidden),
          "model.norm.weight": torch.ones(hidden, device=device, dtype=dtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": torch.ones(hidden, device=device, dtype=dtype),
                   p + "post_attention_layernorm.weight": torch.ones(hidden, device=device, dtype=dtype),
                   p + "self_attn.q_proj.weight": w(q, hidden), p + "self_attn.k_proj.weight": w(kv, hidden),
                   p + "self_attn.v_proj.weight": w(kv, hidden), p + "self_attn.o_proj.weight": w(hidden, q),
                   p + "mlp.gate_proj.weight": w(inter, hidden), p + "mlp.up_proj.weight": w(inter, hidden),
                   p + "mlp.down_proj.weight": w(hidden, inter)})
    with torch.device(device):
        model = LlamaModel(LlamaSpec.from_hf_config(config), config, sd, max_len)
    del sd
    return model.place(device, dtype).eval()


def step_ms(runner, batch: int, context: int, steps: int, device) -> float:
    """Median wall time of a decode step of `batch` requests of `context` tokens (the prompts prefilled
    first, each step's token committed, as the engine does)."""
    from adaserve_backend.model_runner import SeqInput

    for i in range(batch):
        runner.forward([SeqInput(i, [(i * 7 + j) % 1000 + 10 for j in range(context)], num_logits=1)])
        runner.commit_all(i)
    times = []
    for s in range(steps):
        sync(device)
        t = time.perf_counter()
        runner.forward([SeqInput(i, [100 + s + i]) for i in range(batch)])
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
        for i in range(batch):
            runner.commit_all(i)
    for i in range(batch):
        runner.free(i)
    return statistics.median(times[2:]) if len(times) > 4 else statistics.median(times)


def bench_graphs(sink: dict, deadline: float, layers: int = 4, batches: Sequence[int] = BATCHES,
                 context: int = CONTEXT, steps: int = 20, device="cuda", log=print, shape: dict = SHAPE,
                 capture=None) -> None:
    """Per batch, eager and graph step times at `layers` and layers // 2, and the 32-layer estimates.
    `capture`: the graphs' capture function (the CPU tests pass cuda_graphs.capture.eager_capture)."""
    from adaserve_backend.config import CacheConfig
    from adaserve_backend.model_runner import ModelRunner

    half = max(layers // 2, 1)
    sink.update(layers=[layers, half], context=context, batches=list(batches), scaled_to=shape["layers"])
    rows = sink.setdefault("points", [])
    model = random_llama_model(layers, device=device, shape=shape, max_len=context + steps + 64)
    cache = CacheConfig(block_size=PAGE, num_blocks=max(batches) * (-(-(context + steps + 8) // PAGE)) + 8)
    times: dict[tuple[str, int, int], float] = {}
    for n_layers in (layers, half):
        model.layers = model.layers[:n_layers]  # the first half stays for the second pass
        for mode, graphs in (("eager", 0), ("graph", max(batches))):
            if time.monotonic() > deadline:
                sink["skipped"] = "out of time"
                break
            try:
                runner = ModelRunner(model, cache, "flashinfer" if device != "cpu" or capture else "auto",
                                     graphs=graphs, graph_capture=capture)
                if graphs and runner.graphs is None:
                    raise RuntimeError(f"no graphs: attention {type(runner.attn).__name__}")
                for b in batches:
                    times[(mode, n_layers, b)] = step_ms(runner, b, context, steps, device)
                    log(f"  graphs {mode} b{b}, {n_layers} layers: {times[(mode, n_layers, b)]:.3f} ms/step")
                del runner
            except Exception as e:
                sink.setdefault("errors", []).append(f"{mode}, {n_layers} layers: {short(e)}")
                log(f"  graphs {mode}, {n_layers} layers: {short(e)}")
            if device != "cpu":
                torch.cuda.empty_cache()
    for mode in ("eager", "graph"):
        for b in batches:
            full, part = times.get((mode, layers, b)), times.get((mode, half, b))
            if full is None or part is None or layers == half:
                continue
            per_layer = (full - part) / (layers - half)
            fixed = full - layers * per_layer
            est = fixed + shape["layers"] * per_layer
            rows.append(dict(mode=mode, batch=b, context=context, ms_at=[round(full, 3), round(part, 3)],
                             layer_ms=round(per_layer, 4), fixed_ms=round(fixed, 3), est_step_ms=round(est, 3),
                             weights_tb_s=round(weight_bytes(shape) / (est / 1e3) / 1e12, 3) if est > 0 else None))
    sink["targets"] = graph_targets(rows)


def weight_bytes(shape: dict, element: int = 2) -> int:
    """Bytes of weights a decode step reads at `shape`: every layer's projections and the output head."""
    h, inter = shape["hidden"], shape["intermediate"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    per_layer = (q + 2 * kv) * h + h * q + 3 * h * inter
    return element * (shape["layers"] * per_layer + shape["vocab"] * h)


def graph_targets(rows: Sequence[dict]) -> dict:
    """Issue 72's batch-1 decode target (<= 6.5 ms at 32 layers) judged on the engine's step, both modes."""
    out = {}
    for r in rows:
        if r["batch"] == 1:
            out[f"b1_decode_{r['mode']}_ms"] = r["est_step_ms"]
            out[f"b1_decode_{r['mode']}_ok"] = r["est_step_ms"] <= 6.5
    eager = {r["batch"]: r["est_step_ms"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        if r["mode"] == "graph" and r["batch"] in eager and r["est_step_ms"] > 0:
            out[f"b{r['batch']}_graph_speedup"] = round(eager[r["batch"]] / r["est_step_ms"], 2)
    return out
