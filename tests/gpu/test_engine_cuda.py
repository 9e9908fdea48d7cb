"""The engine on CUDA end to end (engine.json `"device": "cuda"`), against transformers on the same GPU.

float32 is the oracle: greedy outputs equal transformers' greedy generate token for token, under the
adaserve policy (a random plain draft, an untrained EAGLE-3-layout feature draft loaded from its file, the
target drafting for itself) and the continuous one, over a batch mix of staggered requests (prefill chunks
beside token trees and decodes; a sampled request draws the same tokens from the same seed), with the
startup calibration timing the GPU. bfloat16 runs the served
path (FlashInfer where tools/gpu_check installed and compiled it, else SDPA; SDPA too) and its agreement
with float32 is reported beside transformers' own bfloat16 against its float32. The embedded SmolLM2 with
the shipped draft runs where its GGUF can be read on this machine (docs/gpu.md says what travels).

The models are random Llama-shaped ones with a few layers (head_dim 128, so bf16 FlashInfer reuses the
kernels the check compiled), built here. Skipped without a CUDA device; pytest's -ra summary prints why.
CPU-side checks of the same plumbing: tests/unit/test_engine_device.py.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from adaserve_backend.config import EMBEDDED_DEFAULT, EMBEDDED_DRAFT, EngineConfig, ModelConfig  # noqa: E402
from adaserve_backend.engine import Engine  # noqa: E402
from adaserve_backend.request import Request, SamplingParams  # noqa: E402
from tests.engines import EOS, assert_all_blocks_free, run_staggered, small_config, workload  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="GPU test: no CUDA device here (torch.cuda.is_available() is False)")

SHAPE = dict(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=128, max_position_embeddings=1024, tie_word_embeddings=False)
MAX_LEN = 512


def random_llama(folder, seed: int, layers: int, sharpen: float) -> str:
    """A random Llama checkpoint of SHAPE with `layers` layers, its head scaled by `sharpen` (peaked
    next-token distributions: float32 rounding on two GPU paths then never flips a greedy choice)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**dict(SHAPE, num_hidden_layers=layers)))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    model.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The target (4 layers), a plain random draft (1 layer) and an untrained EAGLE-3-layout feature draft
    of the target saved as this project's draft file."""
    from adaserve_backend.models.feature_draft import DraftLayout, base_draft, save_draft

    root = tmp_path_factory.mktemp("cuda-engine")
    target = random_llama(root / "target", seed=0, layers=4, sharpen=4.0)
    plain = random_llama(root / "draft", seed=1, layers=1, sharpen=4.0)
    # three distinct taps, low to high, as EAGLE-3 takes them (eagle3_taps repeats one for so few layers)
    layout = DraftLayout(target, layers=[1], head_vocab=list(range(3, 1024)) + [EOS], feature_layers=[0, 2, 3])
    torch.manual_seed(2)
    feature = str(root / "feature-draft.safetensors")
    save_draft(base_draft(layout, max_len=MAX_LEN), layout, feature)
    return {"target": target, "plain": plain, "feature": feature}


def cuda_config(policy: str, target: str, draft: str | None, dtype: str = "float32", graphs: int = 32,
                **spec) -> EngineConfig:
    """tests/engines.py's small engine (4-token pages, 8-token chunks), both models on cuda; draft None:
    the target drafts for itself; graphs: cuda_graph_max_batch (used with FlashInfer only)."""
    base = small_config(policy, **spec)
    model = ModelConfig(path=target, dtype=dtype, device="cuda", max_model_len=MAX_LEN, cuda_graph_max_batch=graphs)
    return dataclasses.replace(base, target=model, draft=draft and ModelConfig(path=draft, dtype=dtype, device="cuda",
                                                                               cuda_graph_max_batch=graphs))


@functools.cache
def hf_cuda(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    from adaserve_backend.models.checkpoint import locate

    loc = locate(path)
    return AutoModelForCausalLM.from_pretrained(loc.directory, dtype=dtype, **loc.kwargs).to("cuda").eval()


@torch.no_grad()
def hf_greedy(path: str, req: Request, dtype: torch.dtype = torch.float32) -> list[int]:
    """transformers' greedy generate on the GPU, cut after the first EOS past min_tokens (as the engine stops)."""
    out = hf_cuda(path, dtype).generate(
        torch.tensor([req.prompt_ids], device="cuda"), max_new_tokens=req.max_tokens, min_new_tokens=req.min_tokens,
        do_sample=False, eos_token_id=EOS, pad_token_id=EOS)[0, len(req.prompt_ids):].tolist()
    if EOS in out[req.min_tokens:]:
        out = out[: out.index(EOS, req.min_tokens) + 1]
    return out


def assert_on_cuda(engine: Engine) -> None:
    assert engine.device.type == "cuda"
    for runner in [engine.target] + ([engine.draft.runner] if engine.draft else []):
        assert runner.device == engine.device and runner.kv.data.device == engine.device
        assert all(p.device == engine.device for p in runner.model.parameters())


def assert_matches(got: dict[str, list[int]], want: dict[str, list[int]]) -> None:
    bad = {rid: (got.get(rid), w) for rid, w in want.items() if got.get(rid) != w}
    assert not bad, "engine (first) and transformers differ: " + "; ".join(
        f"{r}: {g} vs {w}" for r, (g, w) in bad.items())


CASES = [("adaserve", "plain"), ("adaserve", "feature"), ("adaserve", "self"), ("continuous", None)]


@pytest.mark.parametrize("policy, draft", CASES, ids=[f"{p}-{d or 'no-draft'}" for p, d in CASES])
def test_float32_on_cuda_is_transformers_greedy_token_for_token(paths, policy, draft):
    target = paths["target"]
    reqs = workload(target, n=9, seed=1)
    want = {r.request_id: hf_greedy(target, r) for r in reqs}
    engine = Engine(cuda_config(policy, target, None if draft in (None, "self") else paths[draft]), eos_token_ids=[EOS])
    assert_on_cuda(engine)
    assert type(engine.target.attn).__name__ == "TorchSDPABackend"  # float32: FlashInfer has no kernels for it
    assert_matches(run_staggered(engine, reqs), want)
    # a sampled request draws on the host from its seeded generator: the same seed, the same tokens
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    drawn = []
    for i in range(2):
        engine.add_request(Request(f"sampled-{i}", reqs[0].prompt_ids, max_tokens=8, ignore_eos=True, sampling=params))
        drawn.append(engine.run_until_done()[f"sampled-{i}"])
    assert len(drawn[0]) == 8 and drawn[0] == drawn[1]
    assert_all_blocks_free(engine)
    if draft is not None:
        assert engine.draft.runner.model.takes_features == (draft == "feature")
        if draft == "self":
            assert engine.mean_accepted() > 1.8  # a draft identical to the target is always right


def test_the_startup_calibration_times_the_gpu_and_leaves_the_pool_out(paths, caplog):
    target = paths["target"]
    config = cuda_config("adaserve", target, paths["plain"], calibrate=True, calibration_pool=3)
    with caplog.at_level(logging.INFO, logger="adaserve"):
        engine = Engine(config, eos_token_ids=[EOS])  # calibrates, then serves two warm-up requests
    assert "the calibration pool is for CPU engines" in caplog.text
    assert engine.cost is not None and engine.budget >= 1
    assert all(ms > 0 for _, ms in engine.cost.verify_points + engine.cost.draft_points)
    reqs = workload(target, n=6, seed=2)
    assert_matches(run_staggered(engine, reqs), {r.request_id: hf_greedy(target, r) for r in reqs})
    assert_all_blocks_free(engine)


def flashinfer_left_out() -> str | None:
    """Why the bf16 engine cannot take FlashInfer here (tools/gpu_check's word, or the import), or None."""
    if os.environ.get("GPU_CHECK_NO_FLASHINFER"):
        return f"left out by tools/gpu_check: {os.environ['GPU_CHECK_NO_FLASHINFER']}"
    allowed = os.environ.get("GPU_CHECK_FLASHINFER_DTYPES")
    if allowed and "bf16" not in allowed.split(","):
        return "its bf16 kernels did not compile in tools/gpu_check"
    from adaserve_backend.attention.flashinfer_cuda import import_flashinfer

    try:
        import_flashinfer()
    except Exception as e:
        return f"does not import: {type(e).__name__}: {e}"
    return None


def agreement(got: dict[str, list[int]], want: dict[str, list[int]]) -> dict:
    """How far each output follows the float32 one: tokens before the first difference, over all."""
    prefix = 0
    for rid, w in want.items():
        g = got[rid]
        prefix += next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
    total = sum(len(w) for w in want.values())
    return {"identical_requests": sum(got[r] == w for r, w in want.items()), "requests": len(want),
            "prefix_tokens": prefix, "tokens": total, "prefix_fraction": round(prefix / max(total, 1), 4)}


def test_bf16_on_cuda_runs_and_its_agreement_with_float32_is_reported(paths, monkeypatch, record_property):
    from adaserve_backend.attention import flashinfer_cuda

    target, draft = paths["target"], paths["plain"]
    reqs = workload(target, n=9, seed=3)
    fp32 = run_staggered(Engine(cuda_config("adaserve", target, draft), eos_token_ids=[EOS]), reqs)
    assert_matches(fp32, {r.request_id: hf_greedy(target, r) for r in reqs})
    why_not = flashinfer_left_out()
    report = {"transformers_bf16": agreement({r.request_id: hf_greedy(target, r, torch.bfloat16) for r in reqs}, fp32)}
    for backend in ("flashinfer", "flashinfer_eager", "sdpa") if why_not is None else ("sdpa",):
        if backend == "sdpa":
            monkeypatch.setattr(flashinfer_cuda, "flashinfer_importable", lambda: False)
        graphs = 0 if backend == "flashinfer_eager" else 32
        engine = Engine(cuda_config("adaserve", target, draft, dtype="bfloat16", graphs=graphs), eos_token_ids=[EOS])
        assert_on_cuda(engine)
        want_attn = {"flashinfer": "FlashInferBackend", "flashinfer_eager": "FlashInferBackend",
                     "sdpa": "TorchSDPABackend"}[backend]
        assert type(engine.target.attn).__name__ == type(engine.draft.runner.attn).__name__ == want_attn
        # plain decode replays CUDA graphs where the attention is FlashInfer and graphs are asked for
        graphed = backend == "flashinfer"
        assert (engine.target.graphs is not None) == graphed == (engine.draft.runner.graphs is not None)
        got = run_staggered(engine, reqs)
        assert all(0 < len(got[r.request_id]) <= r.max_tokens for r in reqs)
        assert_all_blocks_free(engine)
        report[f"engine_bf16_{backend}"] = agreement(got, fp32)
        monkeypatch.undo()
    if why_not:
        report["flashinfer"] = why_not
    for name, value in report.items():
        record_property(name, value)
        print(f"bf16 vs float32 greedy, {name}: {value}")


def embedded_on_this_machine() -> str | None:
    """Why the embedded SmolLM2 cannot be read here, or None."""
    from adaserve_backend.models.checkpoint import embedded_default_gguf

    try:
        embedded_default_gguf()
        import gguf  # noqa: F401  (transformers reads the GGUF through it)
    except (FileNotFoundError, ImportError) as e:
        return f"the embedded SmolLM2 GGUF cannot be read on this machine ({type(e).__name__}: {e})"
    return None


def test_the_embedded_model_with_the_shipped_draft_on_cuda_is_transformers_greedy():
    if (why := embedded_on_this_machine()) is not None:
        pytest.skip(why)
    reqs = workload(EMBEDDED_DEFAULT, n=6, seed=5)
    want = {r.request_id: hf_greedy(EMBEDDED_DEFAULT, r) for r in reqs}
    config = cuda_config("adaserve", EMBEDDED_DEFAULT, EMBEDDED_DRAFT)
    engine = Engine(config, eos_token_ids=[EOS])
    assert_on_cuda(engine)
    assert_matches(run_staggered(engine, reqs), want)
    assert engine.mean_accepted() > 1.0
