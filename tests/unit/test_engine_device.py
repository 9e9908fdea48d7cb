"""The engine's device plumbing, checked on the CPU: the device in engine.json is validated at load (its
spelling, target and draft together, the CPU-only dtypes, a GPU the process cannot see), and no tensor an
engine step makes lands on a device nobody named. That second check runs whole engine steps with torch's
default device set to "meta": a tensor made without a device then is a meta tensor, and the step fails
where it meets the model's real ones, as it would fail on a GPU where such a tensor lands on the CPU.
The same steps on the GPU: tests/gpu/test_engine_cuda.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaserve_backend.attention.backend import make_backend
from adaserve_backend.config import EMBEDDED_DRAFT, EngineConfig, ModelConfig
from adaserve_backend.device import check_device, synchronize
from adaserve_backend.engine import Engine
from adaserve_backend.kv_cache import KVCache
from adaserve_backend.models import load_model
from adaserve_backend.models.feature_draft import DraftLayout, base_draft, eagle3_taps
from adaserve_backend.request import Request, SamplingParams
from tests.engines import EOS, reference, run_staggered, small_config, workload
from tests.model_fixtures import our_model, tiny_checkpoint

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_a_device_is_cpu_cuda_or_cuda_n(device):
    assert ModelConfig(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:", "cuda:x", "mps", "meta", ""])
def test_any_other_device_is_refused_when_the_config_is_made(device):
    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N"):
        ModelConfig(device=device)


@pytest.mark.parametrize("dtype", ["q4_1", "q4_1_int8", "q8_0"])
def test_the_cpu_kernel_dtypes_are_refused_on_cuda(dtype):
    assert ModelConfig(dtype=dtype).device == "cpu"
    with pytest.raises(ValueError, match=f"dtype {dtype} runs the project's CPU kernels"):
        ModelConfig(dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_float32_and_the_half_types_are_allowed_on_cuda(dtype):
    assert ModelConfig(dtype=dtype, device="cuda").dtype == dtype


def test_target_and_draft_must_share_a_device():
    with pytest.raises(ValueError, match="the draft is on cpu and the target on cuda"):
        EngineConfig(target=ModelConfig(device="cuda"))  # the default draft is on the CPU
    with pytest.raises(ValueError, match="both run on one device"):
        EngineConfig(target=ModelConfig(device="cuda:0"), draft=ModelConfig(path=EMBEDDED_DRAFT, device="cuda:1"))
    same = EngineConfig(target=ModelConfig(device="cuda"), draft=ModelConfig(path=EMBEDDED_DRAFT, device="cuda:0"))
    assert same.draft.device == "cuda:0"  # plain cuda is device 0
    assert EngineConfig(target=ModelConfig(device="cuda"), draft=None).draft is None


def test_in_engine_json_a_draft_that_names_no_device_follows_the_target():
    assert EngineConfig.from_dict({"target": {"device": "cuda"}}).draft.device == "cuda"  # the default draft
    cfg = EngineConfig.from_dict({"target": {"device": "cuda:1"}, "draft": {"path": EMBEDDED_DRAFT}})
    assert (cfg.target.device, cfg.draft.device) == ("cuda:1", "cuda:1")
    with pytest.raises(ValueError, match="both run on one device"):
        EngineConfig.from_dict({"target": {"device": "cuda"}, "draft": {"path": EMBEDDED_DRAFT, "device": "cpu"}})
    with pytest.raises(ValueError, match="both run on one device"):
        EngineConfig.from_dict({"draft": {"device": "cuda"}})  # the target stays on the CPU
    assert EngineConfig.from_dict({"target": {"device": "cuda"}, "draft": None}).draft is None
    assert EngineConfig.from_dict({}).draft.device == "cpu"


@NO_CUDA
def test_cuda_without_a_visible_gpu_fails_at_load_with_the_reason():
    path = tiny_checkpoint("llama")
    with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
        check_device("cuda")
    with pytest.raises(ValueError, match=r"'cuda' asked for, but torch.cuda.is_available\(\) is False"):
        load_model(ModelConfig(path=path, device="cuda"))
    config = dataclasses.replace(small_config("continuous"), target=ModelConfig(path=path, device="cuda"), draft=None)
    with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
        Engine(config)  # before any weights are read


def test_a_model_on_another_device_than_the_config_says_is_refused():
    target = our_model(tiny_checkpoint("llama"))
    moved = load_model(ModelConfig(path=tiny_checkpoint("llama"), max_model_len=512)).to("meta")
    with pytest.raises(ValueError, match="the target model is on meta; the config says cpu"):
        Engine(small_config("continuous"), target=moved)
    with pytest.raises(ValueError, match="the draft is on meta and the target on cpu"):
        Engine(small_config("adaserve"), target=target, draft=moved)


def test_the_cpu_attention_kernel_is_refused_for_a_cache_elsewhere():
    cache = KVCache(1, 2, 8, 4, 4, torch.bfloat16, "meta")
    with pytest.raises(ValueError, match="paged_cpu runs a CPU kernel; the cache is on meta"):
        make_backend("paged_cpu", cache, 4)


def test_check_device_and_synchronize_on_the_cpu():
    assert check_device("cpu") == torch.device("cpu")
    synchronize("cpu")  # nothing to wait for


def feature_draft(path: str):
    """An untrained EAGLE-3-layout draft over the tiny target: it reads the target's taps as features."""
    torch.manual_seed(0)
    return base_draft(DraftLayout(path, layers=[1], head_vocab=list(range(3, 200)) + [EOS],
                                  feature_layers=eagle3_taps(3)), max_len=512).place("cpu", torch.float32).eval()


def engine_for(path: str, policy: str, draft: str | None) -> Engine:
    drafts = {"plain": lambda: our_model(tiny_checkpoint("llama", seed=1)), "feature": lambda: feature_draft(path),
              "self": lambda: our_model(path)}
    model = drafts[draft]() if draft else None
    return Engine(small_config(policy), target=our_model(path), draft=model, eos_token_ids=[EOS])


@pytest.mark.parametrize("policy, draft", [("adaserve", "plain"), ("adaserve", "feature"), ("spec:3", "self"),
                                           ("continuous", None)])
def test_no_tensor_an_engine_step_makes_lands_on_a_device_nobody_named(policy, draft):
    """Whole steps (prefill chunks, draft beams, tree verification, commits, sampling) with torch's
    default device set to meta: every tensor they make names its device (the runner's, or the host for
    what is built there and copied once), and the greedy outputs still equal transformers'."""
    path = tiny_checkpoint("llama")
    reqs = workload(path, n=6)
    want = {r.request_id: reference(path, r) for r in reqs}
    engine = engine_for(path, policy, draft)
    with torch.device("meta"):
        got = run_staggered(engine, reqs)
        sampled = Request("sampled", reqs[0].prompt_ids, max_tokens=6, ignore_eos=True,
                          sampling=SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3))
        engine.add_request(sampled)
        out = engine.run_until_done()
    assert got == want
    assert len(out["sampled"]) == 6
    for runner in [engine.target] + ([engine.draft.runner] if engine.draft else []):
        assert runner.device == engine.device == torch.device("cpu")
        assert runner.kv.data.device == runner.device
