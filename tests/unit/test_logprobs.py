"""Log-probabilities of emitted tokens: the target's own at each position, whatever speculation verified
(tree or plain decode), aligned with the tokens through stops; only requests that ask get them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaserve_backend.request import Request, SamplingParams
from adaserve_backend.sampling import target_probs, token_logprobs
from tests.engines import make_engine, reference, workload
from tests.model_fixtures import hf_reference, tiny_checkpoint


def run(policy: str, reqs: list[Request]):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, policy, lookup_ngram=3)
    tokens, logprobs = {}, {}
    for r in reqs:
        engine.add_request(r)
    for o in engine.drain():
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.new_logprobs is not None:
            assert len(o.new_logprobs) == len(o.new_token_ids)
            logprobs.setdefault(o.request_id, []).extend(o.new_logprobs)
    return tokens, logprobs


@torch.no_grad()
def oracle_logprobs(path: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    logits = hf_reference(path)(torch.tensor([prompt + output])).logits[0, len(prompt) - 1: -1]
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("policy", ["adaserve", "continuous", "spec:3"])
def test_greedy_logprobs_are_the_targets_own_under_every_policy(policy):
    target = tiny_checkpoint("llama")
    reqs = [dataclasses.replace(r, logprobs=3 if i % 2 == 0 else None) for i, r in enumerate(workload(target))]
    tokens, logprobs = run(policy, reqs)
    for r in reqs:
        assert tokens[r.request_id] == reference(target, r)
        if r.logprobs is None:
            assert r.request_id not in logprobs  # only the requests that ask pay for them
            continue
        ref = oracle_logprobs(target, r.prompt_ids, tokens[r.request_id])
        got = logprobs[r.request_id]
        assert [g.token for g in got] == tokens[r.request_id]
        torch.testing.assert_close(torch.tensor([g.logprob for g in got]),
                                   ref.gather(-1, torch.tensor(tokens[r.request_id])[:, None])[:, 0],
                                   rtol=0, atol=1e-4)
        for g, row in zip(got, ref):
            assert len(g.top) == 3 and g.top[0][0] == g.token  # greedy: the chosen token is the likeliest
            assert [t for t, _ in g.top] == row.topk(3).indices.tolist()


def test_speculation_never_changes_a_logprob():
    target = tiny_checkpoint("llama")
    reqs = [dataclasses.replace(r, logprobs=0) for r in workload(target, seed=2)]
    plain, spec = run("continuous", reqs)[1], run("adaserve", reqs)[1]
    for r in reqs:
        torch.testing.assert_close(torch.tensor([g.logprob for g in spec[r.request_id]]),
                                   torch.tensor([g.logprob for g in plain[r.request_id]]), rtol=0, atol=1e-5)
        assert all(g.top == () for g in spec[r.request_id])


def test_sampled_logprobs_are_of_the_distribution_sampled_from():
    torch.manual_seed(0)
    rows = torch.randn(4, 50)
    params = SamplingParams(temperature=0.7, top_p=0.8, top_k=10, seed=1)
    probs = target_probs(rows, params)
    tokens = torch.multinomial(probs, 1)[:, 0].tolist()
    out = token_logprobs(rows, tokens, params, top=12)
    for row_p, t, lp in zip(probs, tokens, out):
        assert lp.logprob == pytest.approx(float(torch.log(row_p[t])), abs=1e-6)
        kept = int((row_p > 0).sum())
        assert sum(v > float("-inf") for _, v in lp.top) == kept  # filtered tokens: -inf
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_logprobs_stay_one_per_token_to_the_length_limit_and_are_bounded():
    target = tiny_checkpoint("llama")
    r = dataclasses.replace(workload(target, n=1)[0], max_tokens=16, min_tokens=16, logprobs=1)
    tokens, logprobs = run("adaserve", [r])
    assert len(logprobs[r.request_id]) == len(tokens[r.request_id]) == 16
    with pytest.raises(ValueError, match="logprobs must be in"):
        dataclasses.replace(r, logprobs=21).validate(10**6, 10**6)


@torch.no_grad()
def test_prompt_logprobs_score_every_prompt_token_even_when_the_prefix_is_cached():
    """As evaluation harnesses ask (echo + logprobs): each prompt token's logprob given the tokens before
    it, the first None, on the first output; a prompt whose prefix the cache holds is still scored whole
    (chunked prefill included: the tests' chunks are 8 tokens)."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    prompt = list(range(5, 30))
    plain = Request("warm", prompt, max_tokens=2)
    scored = Request("scored", prompt, max_tokens=2, prompt_logprobs=1)
    outputs = {}
    for r in (plain, scored):
        engine.add_request(r)
        for o in engine.drain():
            if o.prompt_logprobs is not None:
                outputs[o.request_id] = o.prompt_logprobs
    got = outputs["scored"]
    assert "warm" not in outputs and len(got) == len(prompt) and got[0] is None
    ref = torch.log_softmax(hf_reference(target)(torch.tensor([prompt])).logits[0, :-1].float(), -1)
    want = ref.gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor([g.logprob for g in got[1:]]), want, rtol=0, atol=1e-4)
    assert [g.token for g in got[1:]] == prompt[1:] and all(len(g.top) == 1 for g in got[1:])


def test_bfloat16_logprobs_are_the_same_with_and_without_speculation():
    """The served dtype: one kernel at every row count (models/kernel_choice.py), so a token verified
    in a tree reports the logprob plain decoding gives it, to the bit."""
    from adaserve_backend.engine import Engine
    from tests.engines import small_config
    from tests.model_fixtures import our_model

    target = tiny_checkpoint("llama")
    reqs = [dataclasses.replace(r, logprobs=2) for r in workload(target, seed=5)]
    got = {}
    for policy in ("continuous", "adaserve"):
        engine = Engine(small_config(policy, lookup_ngram=3), target=our_model(target, "bfloat16"),
                        draft=our_model(target, "bfloat16"), eos_token_ids=[2])
        for r in reqs:
            engine.add_request(r)
        out = {}
        for o in engine.drain():
            out.setdefault(o.request_id, []).extend(o.new_logprobs or [])
        got[policy] = out
    assert engine.mean_accepted() > 1.0  # trees were verified
    for r in reqs:
        assert got["adaserve"][r.request_id] == got["continuous"][r.request_id]
