"""Every accepted request ends with exactly one final output, whatever else goes wrong."""

from __future__ import annotations

import pytest

from adaserve_backend.engine import Engine
from adaserve_backend.request import FinishReason, Request, SamplingParams
from adaserve_backend.slo import SLO
from tests.engines import assert_all_blocks_free, make_engine, reference, workload
from tests.model_fixtures import our_model, tiny_checkpoint


def test_fail_all_answers_a_queued_abort():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    engine.add_request(Request("a", [5, 6, 7], max_tokens=8))
    engine.add_request(Request("b", [5, 6, 7], max_tokens=8))
    engine.step()
    engine.abort("a")  # still in the inbox when the failure hits
    engine.add_request(Request("c", [5, 6], max_tokens=8))  # ditto
    outs = engine.fail_all("boom")
    reasons = {o.request_id: o.finish_reason for o in outs}
    assert reasons == {"a": FinishReason.ABORT, "b": FinishReason.ERROR, "c": FinishReason.ERROR}
    assert all(o.finished for o in outs)
    assert not engine.has_work()
    assert_all_blocks_free(engine)


def test_inputs_made_unused_by_others_are_still_validated():
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    with pytest.raises(ValueError, match="slo_class"):
        engine.add_request(Request("x", [5, 6], slo=SLO(50.0, None, "no-such-class")))
    for bad in ([-1], [10_000]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            engine.add_request(Request("y", [5, 6], stop_token_ids=tuple(bad)))
    assert not engine.has_work()


def poisoned(request_id: str) -> Request:
    """A request whose sampling fails inside the step (top_k = -1 slipped past validation)."""
    sampling = SamplingParams(temperature=1.0, seed=1)
    object.__setattr__(sampling, "top_k", -1)
    return Request(request_id, [5, 6, 7], max_tokens=6, sampling=sampling)


@pytest.mark.parametrize("policy", ["adaserve", "continuous"])
def test_a_failing_request_ends_alone(policy):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, policy)
    good = workload(target, n=2)
    engine.add_request(good[0])
    engine.step()  # one decoding when the poisoned one prefills, one prefilling along
    engine.add_request(poisoned("bad"))
    engine.add_request(good[1])
    outs = list(engine.drain())
    finals = {o.request_id: o for o in outs if o.finished}
    assert finals["bad"].finish_reason == FinishReason.ERROR and "internal error" in finals["bad"].error
    for r in good:
        assert finals[r.request_id].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert [t for o in outs if o.request_id == r.request_id for t in o.new_token_ids] == reference(target, r)
    assert_all_blocks_free(engine)


def test_a_draft_that_does_not_fit_the_target_is_refused_at_load():
    from adaserve_backend.models.feature_draft import DraftLayout, base_draft
    from adaserve_backend.speculation.draft_fit import check_tokenizers_match

    target = tiny_checkpoint("llama")
    with pytest.raises(ValueError, match="vocabulary"):
        make_engine(target, tiny_checkpoint("llama", vocab_size=300), "adaserve")
    narrow = tiny_checkpoint("llama", hidden_size=32)
    feature_draft = base_draft(DraftLayout(narrow, [0], list(range(100))), max_len=512)
    cfg = make_engine(target, target, "adaserve").config
    with pytest.raises(ValueError, match="hidden size"):
        Engine(cfg, target=our_model(target), draft=feature_draft)

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    check_tokenizers_match(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1}))
    with pytest.raises(ValueError, match="tokenizer"):
        check_tokenizers_match(Tok({"a": 0, "b": 1}), Tok({"b": 0, "a": 1}))


def test_a_missing_profile_is_an_error_not_a_silent_fallback(tmp_path):
    target = tiny_checkpoint("llama")
    with pytest.raises(FileNotFoundError, match="profile_path"):
        make_engine(target, target, "adaserve", profile_path=str(tmp_path / "no-such-profile.json"))
    assert make_engine(target, target, "adaserve").cost is None  # none configured: the documented defaults
