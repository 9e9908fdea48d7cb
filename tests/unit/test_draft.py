"""The project's draft: built from a target's layers with a head over part of the vocabulary, trained
with LoRA, saved as its own tensors only, loaded with the deltas merged; and the engine stays exact
with such a draft."""

from __future__ import annotations

import os

import pytest
import torch

from adaserve_backend.config import EMBEDDED_DRAFT, ModelConfig
from adaserve_backend.draft.model import SHIPPED, DraftLayout, add_lora, base_draft, load_draft, save_draft
from adaserve_backend.draft.teacher import dense_logits
from adaserve_backend.models import load_model
from tests.model_fixtures import tiny_checkpoint
from tests.unit.test_engine import make_engine, reference, run_staggered, workload


def tiny_layout(path: str) -> DraftLayout:
    return DraftLayout(path, layers=[0, 2], head_vocab=list(range(3, 200)) + [2], rank=4)


def test_trained_draft_round_trips_through_its_file(tmp_path):
    path = tiny_checkpoint("llama")
    layout = tiny_layout(path)
    draft = base_draft(layout, max_len=64)
    params = add_lora(draft, layout.rank)
    opt = torch.optim.SGD(params, lr=0.5)
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(3):  # move the LoRA factors and norms away from their initial values
        loss = dense_logits(draft, ids).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        before = dense_logits(draft, ids)
    out = tmp_path / "draft.safetensors"
    save_draft(draft, layout, str(out))
    loaded = load_draft(str(out), ModelConfig(path=str(out), max_model_len=64))
    with torch.no_grad():
        after = dense_logits(loaded, ids)
    assert after.shape[-1] == len(layout.head_vocab)
    assert (before - after).abs().max() < 0.05  # LoRA deltas are stored in bfloat16
    assert loaded.vocab_ids.tolist() == layout.head_vocab


@pytest.mark.parametrize("policy", ["adaserve", "spec:3"])
def test_greedy_stays_exact_with_a_partial_vocabulary_draft(policy, tmp_path):
    target = tiny_checkpoint("llama")
    layout = tiny_layout(target)
    out = tmp_path / "draft.safetensors"
    draft = base_draft(layout, max_len=512)
    add_lora(draft, layout.rank)
    save_draft(draft, layout, str(out))
    engine = make_engine(target, str(out), policy)
    reqs = workload(target)
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    assert engine.draft.model.vocab_ids.tolist() == layout.head_vocab


@pytest.mark.slow
def test_shipped_draft_is_small_and_loads_for_the_embedded_target():
    assert os.path.getsize(SHIPPED) < 20 * 2**20
    draft = load_model(ModelConfig(path=EMBEDDED_DRAFT, dtype="bfloat16"))
    assert draft.vocab_ids is not None and len(draft.layers) < 30
