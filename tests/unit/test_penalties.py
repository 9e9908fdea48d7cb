"""OpenAI's frequency and presence penalties and logit_bias: the same output from plain decoding and
from tree verification (each tree node penalised for its own path), equal to a greedy loop over
transformers' logits with the same adjustments; sampled requests take them too."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest
import torch

from adaserve_backend.request import Request, SamplingParams
from adaserve_backend.sampling import adjusted
from tests.engines import POLICIES, make_engine, workload
from tests.model_fixtures import hf_reference, tiny_checkpoint

PARAMS = SamplingParams(frequency_penalty=0.9, presence_penalty=0.4, logit_bias=((7, 2.5), (11, -100.0)))


@torch.no_grad()
def oracle(path: str, req: Request) -> list[int]:
    """Greedy over transformers' float32 logits, each step adjusted as OpenAI defines the penalties."""
    hf, ids, out = hf_reference(path), list(req.prompt_ids), []
    for _ in range(req.max_tokens):
        logits = adjusted(hf(torch.tensor([ids])).logits[0, -1], req.sampling, Counter(out)).clone()
        if len(out) < req.min_tokens:
            logits[2] = float("-inf")  # min_tokens holds off the end of sequence
        tok = int(torch.argmax(logits))
        out.append(tok)
        ids.append(tok)
        if tok == 2 and len(out) > req.min_tokens:
            break
    return out


def run(policy: str, reqs: list[Request]) -> dict[str, list[int]]:
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, policy, lookup_ngram=3)
    for r in reqs:
        engine.add_request(r)
    return engine.run_until_done()


@pytest.mark.parametrize("policy", POLICIES)
def test_penalised_greedy_output_is_the_same_plain_or_verified_in_trees(policy):
    target = tiny_checkpoint("llama")
    reqs = [dataclasses.replace(r, sampling=PARAMS, max_tokens=12) for r in workload(target, n=4, seed=4)]
    got = run(policy, reqs)
    for r in reqs:
        assert got[r.request_id] == oracle(target, r)
        assert 11 not in got[r.request_id]  # biased by -100: never chosen


def test_penalties_change_the_output_and_a_bias_can_force_a_token():
    target = tiny_checkpoint("llama")
    base = dataclasses.replace(workload(target, n=1, seed=4)[0], max_tokens=12, min_tokens=12)
    plain = run("adaserve", [base])[base.request_id]
    penalised = dataclasses.replace(base, request_id="p", sampling=SamplingParams(frequency_penalty=2.0))
    forced = dataclasses.replace(base, request_id="f", sampling=SamplingParams(logit_bias=((9, 100.0),)))
    got = run("adaserve", [penalised, forced])
    assert max(Counter(got["p"]).values()) <= max(Counter(plain).values())
    assert got["f"] == [9] * 12


def test_sampled_requests_take_the_adjustments_and_bad_values_are_refused():
    target = tiny_checkpoint("llama")
    r = dataclasses.replace(workload(target, n=1)[0], max_tokens=8, min_tokens=8,
                            sampling=SamplingParams(temperature=1.0, seed=3, logit_bias=((9, 100.0),)))
    assert run("adaserve", [r])[r.request_id] == [9] * 8
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((1, 101.0),))
    with pytest.raises(ValueError, match="logit_bias token ids"):
        dataclasses.replace(r, sampling=SamplingParams(logit_bias=((10**6, 1.0),))).validate(320, 512)


@torch.no_grad()
def exact_penalised(path: str, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first three tokens) with the penalties counting the tokens before each (numpy oracle after
    the adjustment)."""
    from tests.unit.test_acceptance import filtered
    from tests.unit.test_engine_sampling_and_leaks import PROMPT, VOCAB

    hf, probs = hf_reference(path), {}
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    logits = hf(torch.tensor([PROMPT + list(p) for p in pairs])).logits.float()

    def dist(row, out):
        return filtered(adjusted(row, params, Counter(out)).double().numpy(), params)

    p1 = dist(logits[0, len(PROMPT) - 1], [])
    for row, (a, b) in enumerate(pairs):
        p2, p3 = dist(logits[row, len(PROMPT)], [a]), dist(logits[row, len(PROMPT) + 1], [a, b])
        for c in range(VOCAB):
            probs[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return probs


@pytest.mark.parametrize("policy", ["adaserve", "continuous"])
def test_sampled_output_keeps_its_penalised_distribution_with_speculation_on_and_off(policy):
    """Chi-square against the exact distribution of three sampled tokens under the penalties and a bias;
    the same samples are clearly not from the unpenalised distribution (the test has power)."""
    from tests.unit.test_engine_sampling_and_leaks import PROMPT, VOCAB, chi_square_pvalue, engine_for

    target = tiny_checkpoint("llama", seed=0, vocab_size=VOCAB, sharpen=6.0)
    draft = tiny_checkpoint("llama", seed=1, vocab_size=VOCAB, sharpen=6.0)
    params = SamplingParams(temperature=0.9, frequency_penalty=1.5, presence_penalty=0.5, logit_bias=((2, 1.0),))
    engine = engine_for(target, draft, policy)
    n = 2000
    for i in range(n):
        engine.add_request(Request(f"s{i}", PROMPT, max_tokens=3, ignore_eos=True,
                                   sampling=dataclasses.replace(params, seed=i)))
    counts = Counter(tuple(t) for t in engine.run_until_done().values())
    assert sum(counts.values()) == n
    assert chi_square_pvalue(counts, exact_penalised(target, params), n) > 1e-3
    assert chi_square_pvalue(counts, exact_penalised(target, SamplingParams(temperature=0.9)), n) < 1e-6
