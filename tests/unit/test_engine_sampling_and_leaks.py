"""Lossless sampling through the engine (chi-square against the target's exact distribution, with
and without temperature, top-k and top-p) and no leaked KV blocks after hundreds of requests with
cancellations and preemptions."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch
from scipy.stats import chi2

from adaserve_backend.engine import Engine
from adaserve_backend.request import FinishReason, Request, SamplingParams
from adaserve_backend.slo import SLO
from tests.engines import small_config
from tests.model_fixtures import hf_reference, our_model, tiny_checkpoint
from tests.unit.test_acceptance import filtered

VOCAB = 6
PROMPT = [1, 4, 2, 5, 3]


def engine_for(target: str, draft: str, policy: str = "adaserve", num_blocks: int = 2048, max_num_seqs: int = 64,
               dtype: str = "float32") -> Engine:
    cfg = small_config(policy, num_blocks, max_num_seqs, prefill_chunk=64, token_budget=64,
                       budget=max_num_seqs * 4, draft_budget=max_num_seqs * 2, d_max=3, w_max=2)
    return Engine(cfg, target=our_model(target, dtype), draft=our_model(draft, dtype))


@torch.no_grad()
def exact_distribution(path: str, params: SamplingParams,
                       dtype: torch.dtype = torch.float32) -> dict[tuple[int, ...], float]:
    """P(first three tokens) under the model's own sampling with `params` (logits computed in `dtype`,
    filtered by test_acceptance's numpy oracle, not the production filter)."""
    hf = hf_reference(path).to(dtype)
    probs = {}
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    logits = hf(torch.tensor([PROMPT + list(p) for p in pairs])).logits.double().numpy()
    p1 = filtered(logits[0, len(PROMPT) - 1], params)
    for row, (a, b) in enumerate(pairs):
        p2 = filtered(logits[row, len(PROMPT)], params)
        p3 = filtered(logits[row, len(PROMPT) + 1], params)
        for c in range(VOCAB):
            probs[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return probs


def chi_square_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square, pooling outcomes expected fewer than 5 times into one bin."""
    stat, bins, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for outcome, p in probs.items():
        exp, obs = p * n, counts.get(outcome, 0)
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
        else:
            stat += (obs - exp) ** 2 / exp
            bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    return float(chi2.sf(stat, bins - 1))


@pytest.mark.parametrize("dtype,params", [
    ("float32", SamplingParams(temperature=0.9, top_k=3, top_p=0.8)),
    ("bfloat16", SamplingParams(temperature=1.0)),
], ids=["float32-top_k-top_p", "bfloat16"])
def test_sampling_through_token_trees_is_lossless(dtype, params):
    """The filters apply to every sampled token, the first (from the prefill) and those verified in
    trees the unfiltered draft proposed. bfloat16 runs the served path (oneDNN-prepacked weights); its
    reference is the model's own bfloat16 distribution."""
    target = tiny_checkpoint("llama", seed=0, vocab_size=VOCAB, sharpen=6.0)
    draft = tiny_checkpoint("llama", seed=1, vocab_size=VOCAB, sharpen=6.0)
    engine = engine_for(target, draft, dtype=dtype)
    n = 3000
    for i in range(n):
        sampling = dataclasses.replace(params, seed=i)
        engine.add_request(Request(f"s{i}", PROMPT, max_tokens=3, ignore_eos=True, sampling=sampling))
    outs = engine.run_until_done()
    counts: dict[tuple[int, ...], int] = {}
    for toks in outs.values():
        counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
    assert sum(counts.values()) == n
    # the draft disagrees often enough for the rejection path to matter
    assert 1.1 < engine.mean_accepted() < 2.5
    exact = exact_distribution(target, params, getattr(torch, dtype))
    assert all(exact[k] > 0 for k in counts), "a token the filters remove was emitted"
    assert chi_square_pvalue(counts, exact, n) > 1e-3
    # the test has power: the same samples are clearly not from the draft's distribution, nor (with
    # filters) from the target's unfiltered one
    assert chi_square_pvalue(counts, exact_distribution(draft, params, getattr(torch, dtype)), n) < 1e-6
    if params.top_k or params.top_p < 1:
        raw = SamplingParams(temperature=params.temperature)
        assert chi_square_pvalue(counts, exact_distribution(target, raw, getattr(torch, dtype)), n) < 1e-6


def test_hundreds_of_requests_with_cancellations_and_preemptions_leak_nothing():
    target = tiny_checkpoint("llama")
    engine = engine_for(target, tiny_checkpoint("llama", seed=1), num_blocks=40, max_num_seqs=8)
    rng = random.Random(0)
    vocab = our_model(target).spec.vocab_size
    finals: dict[str, str] = {}
    submitted, cancelled = [], set()
    for i in range(200):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 30))]
        sampling = SamplingParams(temperature=rng.choice([0.0, 0.8]), seed=i)
        engine.add_request(Request(f"q{i}", prompt, max_tokens=rng.randint(1, 20), sampling=sampling,
                                   slo=SLO(tpot_ms=rng.choice([20.0, 80.0]))))
        submitted.append(f"q{i}")
        if rng.random() < 0.2:
            victim = rng.choice(submitted)
            engine.abort(victim)
            cancelled.add(victim)
        for o in engine.step():
            assert o.request_id not in finals, "a request got two final responses"
            if o.finished:
                finals[o.request_id] = o.finish_reason
    engine.abort("never-submitted")
    for o in engine.drain():
        assert o.request_id not in finals
        if o.finished:
            finals[o.request_id] = o.finish_reason
    assert set(finals) == set(submitted), "every accepted request ends with a final response"
    assert {r for r, why in finals.items() if why == FinishReason.ABORT} <= cancelled
    assert any(why == FinishReason.ABORT for why in finals.values())
    assert engine.num_preemptions > 0
    for runner in (engine.target, engine.draft.runner):
        assert runner.blocks.num_free_blocks == runner.blocks.num_blocks


@pytest.mark.parametrize("policy", ["adaserve", "continuous"])
def test_an_engine_nobody_holds_is_freed_at_once(policy):
    """No reference cycle through the engine: tools that build one engine after another (draft data
    generation, evaluation) get each one's KV cache back when they drop it, not at some later full
    garbage collection (generation ran out of memory at 2 GB per dropped engine)."""
    import gc
    import weakref

    path = tiny_checkpoint("llama")
    engine = engine_for(path, path, policy)
    engine.add_request(Request("a", PROMPT, max_tokens=4))
    list(engine.drain())
    gone = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert gone() is None
    finally:
        gc.enable()
