"""The engine against the oracle: greedy outputs equal transformers' greedy generate token for token,
under every policy, with requests of mixed SLOs arriving at different iterations and chunked prefill."""

from __future__ import annotations

import dataclasses

import pytest

from adaserve_backend.config import EMBEDDED_DEFAULT
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.cost_model.step_cost import iteration_record
from adaserve_backend.request import FinishReason, Request
from adaserve_backend.slo import SLO
from tests.engines import POLICIES, assert_all_blocks_free, make_engine, reference, run_staggered, workload
from tests.model_fixtures import tiny_checkpoint

# The oracle cases: (target, draft, engine options, workload options). "other": an unrelated random draft,
# without prompt lookup (this tiny target repeats itself, so copies from the context would be accepted
# where the draft's guesses are not: test_prompt_lookup_grafts_copies...). "kv-pressure": a cache too
# small for all requests at once (64 tokens for 10 requests): admission waits, preemption recomputes.
ORACLE_CASES = {
    "tiny-self-draft": (lambda: ("llama", "self"), dict(lookup_ngram=3), dict()),
    "tiny-other-draft": (lambda: ("llama", tiny_checkpoint("llama", seed=1)), dict(lookup_ngram=0), dict()),
    "kv-pressure": (lambda: ("qwen2", "self"), dict(num_blocks=16), dict(n=10, seed=3)),
    "embedded": (lambda: (EMBEDDED_DEFAULT, None), dict(), dict(n=8, seed=5)),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case",
                         [pytest.param(c, marks=pytest.mark.slow) if c == "embedded" else c for c in ORACLE_CASES])
def test_greedy_matches_transformers(case, policy):
    """Greedy outputs equal transformers' greedy generate, token for token, and every block is freed."""
    pair, options, load = ORACLE_CASES[case]
    target, draft = pair()
    target = tiny_checkpoint(target) if target in ("llama", "qwen2") else target
    engine = make_engine(target, target if draft == "self" else draft, policy, **options)
    reqs = workload(target, **load)
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    assert_all_blocks_free(engine)
    if case == "kv-pressure":
        assert engine.num_preemptions > 0
    if case.startswith("tiny") and policy in ("adaserve", "spec:3"):
        # a draft identical to the target is always right; an unrelated random one almost never
        assert engine.mean_accepted() > 1.8 if case == "tiny-self-draft" else engine.mean_accepted() < 1.2


def steep_profile(tmp_path) -> str:
    """A cost model where every prefill token beyond the knee costs 5 ms: pacing bites."""
    path = str(tmp_path / "profile.json")
    CostModel(Roofline(10.0, 4, 5.0), Roofline(1.0, 4, 0.0), budget=8).save(path)
    return path


def test_slo_paced_prefill_keeps_greedy_exact(tmp_path):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve", profile_path=steep_profile(tmp_path))
    assert engine.cost is not None
    reqs = [dataclasses.replace(r, slo=SLO(tpot_ms=slo)) for r, slo in zip(workload(target), [2.0, 5.0, 1e3] * 3)]
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    assert_all_blocks_free(engine)


def test_a_request_whose_first_token_cannot_come_in_time_is_rejected_while_the_others_match_the_oracle(tmp_path):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve", profile_path=steep_profile(tmp_path))
    reqs = [dataclasses.replace(r, slo=dataclasses.replace(r.slo, ttft_ms=1e7)) for r in workload(target, n=4)]
    doomed = Request("doomed", [5] * 30, max_tokens=8, slo=SLO(ttft_ms=1.0))  # its prefill alone takes > 100 ms
    for r in reqs[:2] + [doomed] + reqs[2:]:
        engine.add_request(r)
    got: dict[str, list[int]] = {}
    ends = {}
    for o in engine.drain():
        got.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            ends[o.request_id] = o
    out = ends["doomed"]
    assert out.finish_reason == FinishReason.REJECTED and got["doomed"] == [] and out.first_token_time is None
    assert out.error.startswith("server cannot meet ttft_slo_ms=1 at the current load (predicted first token in ")
    assert out.stats.overload == "deadline_unreachable" and out.stats.queue_wait_s is not None
    for r in reqs:
        assert ends[r.request_id].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert got[r.request_id] == reference(target, r), r.request_id
    assert engine.scheduler.overloads == {"deadline_unreachable": 1}
    assert_all_blocks_free(engine)


def test_bad_requests_are_rejected_and_the_engine_keeps_serving():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    good = workload(target, n=1)[0]
    bad = [
        Request("e1", []),
        Request("e2", [1, 2], max_tokens=0),
        Request("e3", [1, 2], max_tokens=10_000),
        Request("e4", [10_000]),
        Request("e7", [1, 2], slo=SLO(slo_class="no-such-class")),
        Request("e8", [1, 2], stop_strings=("x",)),  # this engine has no tokenizer
    ]
    for r in bad:
        with pytest.raises(ValueError):
            engine.add_request(r)
    engine.add_request(good)
    with pytest.raises(ValueError, match="in flight"):
        engine.add_request(good)
    assert engine.run_until_done()[good.request_id] == reference(target, good)
    engine.add_request(good)  # finished ids may be reused
    engine.abort(good.request_id)
    outs = [o for o in engine.step()]
    assert [o.finish_reason for o in outs] == [FinishReason.ABORT]
    assert_all_blocks_free(engine)


def test_a_draft_that_does_not_pay_runs_only_when_exploring_and_greedy_stays_exact(tmp_path):
    """With speculation trimmed (an unrelated random draft), iterations that decode without speculating
    run no draft at all, prefill chunks included; explorations first catch the draft up on what it
    skipped. Requests prefilled while it slept still match the oracle token for token."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "adaserve", profile_path=steep_profile(tmp_path))
    draft, ran, lazy = engine.draft, [], []
    forward, schedule = draft.runner.forward, engine.scheduler.schedule
    draft.runner.forward = lambda inputs: ran.append(True) or forward(inputs)

    def watched(now):
        if watched.plain:  # the previous plan decoded without speculating: did the draft run for it?
            lazy.append(bool(ran))
        ran.clear()
        plan = schedule(now)
        watched.plain = bool(plan.decode) and not plan.depth
        return plan

    watched.plain = False
    engine.scheduler.schedule = watched
    # Each iteration is recorded at the profile's time, not this machine's: whether the draft pays is then
    # decided by its (measured) acceptance alone, so how often it sleeps does not hang on a busy CPU.
    record, cost = engine.estimator.record, engine.cost
    engine.estimator.record = lambda it: record(dataclasses.replace(it, latency=cost.iteration_ms(
        it.n, it.depth, it.width, it.verified_tokens + it.prefill_tokens) / 1e3))
    reqs = [dataclasses.replace(r, max_tokens=40, min_tokens=40) for r in workload(target, n=12, seed=7)]
    got: dict[str, list[int]] = {}
    for step in range(10_000):  # one arrival every 6 iterations: most prefill beside plain decoding
        if step % 6 == 0 and step // 6 < len(reqs):
            engine.add_request(reqs[step // 6])
        elif not engine.has_work():
            break
        for o in engine.step():
            assert o.finish_reason in (None, FinishReason.LENGTH), o.error
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    assert_all_blocks_free(engine)
    assert len(lazy) > 20 and not any(lazy)  # many iterations did not speculate, none of them ran the draft
    assert any(it.depth for it in list(engine.scheduler.iteration_stats)[-20:])  # explorations go on


@pytest.mark.parametrize("policy", ["continuous", "adaserve"])
def test_iteration_records_carry_context_prefills_and_the_whole_step(policy):
    """What sim.validate fits step costs to: each plan's cached context (decoding requests' committed
    tokens, prefilling ones' plus their chunk), its prefilling requests, and the whole step's time."""
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), policy)
    schedule, plans = engine.scheduler.schedule, []

    def recording(now):
        plan = schedule(now)
        expected = sum(len(s.tokens) - 1 for s in plan.decode) + sum(s.prefilled + n for s, n in plan.prefill.items())
        plans.append((plan, expected))
        return plan

    engine.scheduler.schedule = recording
    run_staggered(engine, workload(target))
    assert all(plan.context_tokens == expected for plan, expected in plans)
    decoding = [plan for plan, _ in plans if plan.decode]
    stats = list(engine.iteration_stats)
    # chunks ride along unless prefill goes first
    assert len(stats) == len(decoding) and any(s.prefills for s in stats) != engine.policy.prefill_first
    assert [(s.context_tokens, s.prefills) for s in stats] == [(p.context_tokens, len(p.prefill)) for p in decoding]
    assert all(s.step >= s.latency > 0 for s in stats)
    # the draft's first step reads at least each drafting request's root; plain steps run no draft
    assert all(s.draft_chain_tokens >= s.n if s.depth else s.draft_chain_tokens == 0 for s in stats)
    assert any(s.depth for s in stats) == (policy == "adaserve")
    records = [iteration_record(s) for s in stats]  # what a bench row keeps of them, yield included
    assert [(r["accepted"], r["drafts"]) for r in records] == [(s.accepted, sum(s.accepted_drafts)) for s in stats]
    assert all(r["drafts"] == r["accepted"] - r["n"] for r in records)  # one bonus token per verification


@pytest.mark.parametrize("lookup_ngram, suffix_tokens", [(0, 0), (3, 0), (0, 16), (3, 16)])
def test_prompt_lookup_grafts_copies_and_greedy_stays_exact(lookup_ngram, suffix_tokens, monkeypatch):
    """Prompts that repeat a phrase, an unrelated draft: copies from the context (prompt lookup) and
    from every request's (the suffix index) join the trees (the draft's own guesses almost never
    hold) and the outputs still equal the oracle's."""
    import adaserve_backend.speculation.copies as copies

    grafted = []
    real_graft = copies.graft
    monkeypatch.setattr(copies, "graft",
                        lambda tree, tokens, *a, **k: (grafted.append(len(tokens)), real_graft(tree, tokens, *a, **k)))
    target = tiny_checkpoint("llama")
    engine = make_engine(target, tiny_checkpoint("llama", seed=1), "adaserve", lookup_ngram=lookup_ngram,
                         suffix_tokens=suffix_tokens)
    reqs = [Request(f"r{i}", [7 + i, 40, 41, 42, 43, 44] * 3 + [7 + i, 40], max_tokens=12,
                    slo=SLO(tpot_ms=20.0)) for i in range(4)]
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    assert_all_blocks_free(engine)
    assert (sum(grafted) > 0) == bool(lookup_ngram or suffix_tokens)
