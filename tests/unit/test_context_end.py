"""A request that fills the context to its last position, under every speculative policy: the draft
never runs a beam past the context (it drafts no deeper than the room left), and the output is the
oracle's."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.request import Request
from tests.engines import make_engine, reference
from tests.model_fixtures import tiny_checkpoint


@pytest.mark.parametrize("policy", ["adaserve", "spec:3"])
def test_a_request_ending_at_the_last_position_of_the_context_is_served_whole(policy):
    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, policy, num_blocks=1024)  # the target drafts for itself: deep trees
    max_tokens = 10
    vocab = engine.vocab_size
    prompt = torch.randint(3, vocab, (engine.max_model_len - max_tokens,), generator=torch.Generator().manual_seed(0))
    req = Request("end", prompt.tolist(), max_tokens=max_tokens, min_tokens=max_tokens)
    engine.add_request(req)
    out, error = [], None
    while engine.has_work():
        for o in engine.step():
            out.extend(o.new_token_ids)
            error = error or o.error
    assert error is None and out == reference(target, req)
