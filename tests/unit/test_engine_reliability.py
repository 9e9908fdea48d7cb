"""Every accepted request ends with exactly one final output, whatever else goes wrong."""

from __future__ import annotations

from adaserve_backend.request import FinishReason, Request
from tests.model_fixtures import tiny_checkpoint
from tests.unit.test_engine import assert_all_blocks_free, make_engine


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
