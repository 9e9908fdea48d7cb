"""Structured output in the engine: every output token is one the grammar allows, greedy output under
every policy (trees, copies, prefill chunks riding along) equals constrained decoding without
speculation token for token, the draft's beams never propose a forbidden token, and copied candidates
the grammar forbids are pruned before selection."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaserve_backend.grammar.spec import JSON, GrammarSpec
from adaserve_backend.request import FinishReason, Request, SamplingParams
from adaserve_backend.speculation.beam import FORBIDDEN_SCORE
from adaserve_backend.speculation.constrained import prune
from adaserve_backend.speculation.token_tree import CandidateTree
from tests.engines import POLICIES, assert_all_blocks_free, make_engine, run_staggered, workload
from tests.grammar_fixtures import SCHEMA, constrained_reference, grammars, text, valid, vocabulary
from tests.model_fixtures import tiny_checkpoint

SPEC = GrammarSpec.schema(SCHEMA)


def grammar_requests(target: str, n: int = 6, spec: GrammarSpec = SPEC, **fields) -> list[Request]:
    return [dataclasses.replace(r, min_tokens=0, max_tokens=48, grammar=spec, **fields)
            for r in workload(target, n=n, seed=3)]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("drafts_itself", [True, False])
def test_greedy_under_a_grammar_equals_constrained_decoding_without_speculation(policy, drafts_itself):
    target = tiny_checkpoint("llama")
    draft = target if drafts_itself else tiny_checkpoint("llama", seed=1)
    engine = make_engine(target, draft, policy)
    engine.grammars = grammars()
    reqs = grammar_requests(target)
    plain = [dataclasses.replace(r, request_id=f"plain-{r.request_id}") for r in workload(target, n=3, seed=4)]
    mixed = reqs + plain  # unconstrained requests in the same batches
    got = run_staggered(engine, mixed)
    for r in reqs:
        want = constrained_reference(target, r.prompt_ids, SPEC, r.max_tokens)
        assert got[r.request_id] == want, r.request_id
    assert sum(valid(got[r.request_id]) for r in reqs) >= 1  # 48 tokens end most of them
    assert_all_blocks_free(engine)


def test_sampled_outputs_are_always_allowed_by_the_grammar():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    engine.grammars = grammars()
    reqs = grammar_requests(target, n=8, spec=GrammarSpec(JSON),
                            sampling=SamplingParams(temperature=1.0, seed=11))
    reqs = [dataclasses.replace(r, request_id=f"s{i}", sampling=SamplingParams(temperature=1.0, seed=i))
            for i, r in enumerate(reqs)]
    got = run_staggered(engine, reqs)
    for r in reqs:
        state = engine.grammars.start(r.grammar)
        for t in got[r.request_id]:
            state.accept(t)  # raises on a forbidden token
    assert_all_blocks_free(engine)


def test_copied_candidates_the_grammar_forbids_are_pruned_with_their_subtrees():
    state = grammars().start(SPEC)
    v = {w: i for i, w in enumerate(vocabulary())}
    state.accept(v["{"])
    # root "{", then '"name"' (allowed) -> ':' (allowed) ; 'x' (forbidden) -> '"' ; '"age"' (forbidden: order)
    cand = CandidateTree([v["{"], v['"name"'], v[":"], v["x"], v['"'], v['"age"']],
                         [-1, 0, 1, 0, 3, 0], [1.0, 0.9, 0.8, 0.5, 0.4, 0.3], [0, -1, -1, -1, -1, -1])
    seq = type("S", (), {"grammar": state})()
    prune([seq], [cand])
    assert [vocabulary()[t] for t in cand.tokens] == ["{", '"name"', ":"]
    assert cand.parents == [-1, 0, 1] and cand.scores == [1.0, 0.9, 0.8]


def test_the_drafts_beams_propose_only_tokens_the_grammar_allows():
    """Instead of the draft's likeliest tokens, its likeliest allowed ones: beams stay on the grammar."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "spec:3")
    engine.grammars = grammars()
    propose, seen = engine.draft.propose, []

    def watched(plan, max_len):
        cands = propose(plan, max_len)
        for seq, cand in zip(plan.decode, cands):
            if seq.grammar is not None and len(cand) > 1:
                ok = seq.grammar.tree_allows(cand.tokens, cand.parents)
                # a forbidden node only where a level had no allowed token left (then pruned: prune)
                seen.append([good or score == FORBIDDEN_SCORE for good, score in zip(ok, cand.scores)])
        return cands

    engine.draft.propose = watched
    engine.draft.copies.lookup = engine.draft.copies.lookup._replace(ngram=0, suffix_tokens=0)  # the draft alone
    run_staggered(engine, grammar_requests(target, n=3))
    assert seen and all(all(ok) for ok in seen)


def test_a_bad_grammar_is_refused_at_add_request_and_min_tokens_with_one_too():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, None, "continuous")
    engine.grammars = grammars()
    prompt = workload(target, n=1)[0].prompt_ids
    with pytest.raises(ValueError, match="cannot be compiled"):
        engine.add_request(Request("bad", prompt, grammar=GrammarSpec("regex", "(unclosed")))
    with pytest.raises(ValueError, match="not valid JSON"):
        GrammarSpec("json_schema", "{not json")
    with pytest.raises(ValueError, match="min_tokens"):
        engine.add_request(Request("min", prompt, min_tokens=2, grammar=SPEC))
    no_vocab = make_engine(target, None, "continuous")
    with pytest.raises(ValueError, match="tokenizer"):
        no_vocab.add_request(Request("none", prompt, grammar=SPEC))
    assert torch.is_tensor(engine.grammars.start(SPEC).bitmask())


def test_the_last_tokens_close_the_answer_so_it_parses_and_say_length():
    """A random model never ends its JSON by itself: within the last tokens of max_tokens the grammar
    closes it (strings, arrays, the required fields, the stop token), so every answer parses; those it
    closed report finish_reason length, and greedy still equals the oracle (which closes alike)."""
    target = tiny_checkpoint("llama", seed=5)
    engine = make_engine(target, target, "adaserve")
    engine.grammars = grammars()
    reqs = [dataclasses.replace(r, max_tokens=40) for r in grammar_requests(target, n=8)]
    for r in reqs:
        engine.add_request(r)
    got, reasons = {}, {}
    for o in engine.drain():
        got.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            reasons[o.request_id] = o.finish_reason
    for r in reqs:
        assert valid(got[r.request_id]), text(got[r.request_id])
        assert got[r.request_id] == constrained_reference(target, r.prompt_ids, SPEC, r.max_tokens)
    assert FinishReason.LENGTH in reasons.values()
