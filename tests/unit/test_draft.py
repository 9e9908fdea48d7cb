"""The project's draft: a feature-conditioned draft built from a target layer with a head over part of
the vocabulary, saved as its own tensors only, in both layouts (EAGLE-3: fused taps of three target
layers; EAGLE-1-style: the final hidden state); it reads the target's true features for every token it
keeps, the engine stays exact with it under every policy, preemption included, and training-time test
computes exactly what serving computes at every tree depth."""

from __future__ import annotations

import os

import pytest
import torch

from adaserve_backend.config import EMBEDDED_DRAFT, CacheConfig, ModelConfig
from adaserve_backend.model_runner import ModelRunner, SeqInput
from adaserve_backend.models import load_model
from adaserve_backend.models.feature_draft import (
    SHIPPED,
    DraftLayout,
    base_draft,
    eagle3_taps,
    load_draft,
    save_draft,
    trainable,
    trained_draft,
)
from tests.engines import POLICIES, make_engine, reference, run_staggered, workload
from tests.model_fixtures import our_model, tiny_checkpoint
from tools.draft.teacher import dense_logits, dense_run, shifted
from tools.draft.ttt import unrolled

LAYOUTS = ("eagle3", "eagle1")


def tiny_draft(path: str, tmp_path, train_steps: int = 0, kind: str = "eagle3", layers=(1,)):
    """A tiny draft saved to a file: (its path, the model, sample ids and features); with train_steps,
    its tensors are first moved away from their initial values."""
    taps = eagle3_taps(3) if kind == "eagle3" else []
    layout = DraftLayout(path, layers=list(layers), head_vocab=list(range(3, 200)) + [2], feature_layers=taps)
    draft = base_draft(layout, max_len=512)
    opt = torch.optim.SGD(trainable(draft), lr=0.5)
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    width = draft.spec.hidden_size * max(len(taps), 1)
    features = torch.randn(2, 12, width, generator=torch.Generator().manual_seed(1))
    for _ in range(train_steps):
        loss = dense_logits(draft, ids, features).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path / "draft.safetensors"
    save_draft(draft, layout, str(out))
    return str(out), draft, ids, features


@pytest.mark.parametrize("kind", LAYOUTS)
def test_trained_draft_round_trips_through_its_file(kind, tmp_path):
    out, draft, ids, features = tiny_draft(tiny_checkpoint("llama"), tmp_path, train_steps=3, kind=kind)
    with torch.no_grad():
        before = dense_logits(draft, ids, features)
    loaded = load_draft(out, ModelConfig(path=out, max_model_len=64))
    with torch.no_grad():
        after = dense_logits(loaded, ids, features)
    assert after.shape[-1] == len(loaded.vocab_ids)
    assert (before - after).abs().max() < 0.05  # matrices are stored in bfloat16
    assert os.path.getsize(out) < sum(p.numel() for p in trainable(draft)) * 2.2  # shared tensors not stored


def test_head_rows_keeps_the_most_frequent_rows_of_the_head(tmp_path):
    """ModelConfig.head_rows: the same draft proposing only from its head's first rows (the most frequent
    tokens): those rows' logits are unchanged, nothing else is proposed, and bad values fail loudly."""
    out, _, ids, features = tiny_draft(tiny_checkpoint("llama"), tmp_path)
    whole = load_draft(out, ModelConfig(path=out, max_model_len=64))
    part = load_draft(out, ModelConfig(path=out, max_model_len=64, head_rows=50))
    assert part.vocab_ids.tolist() == whole.vocab_ids[:50].tolist()
    with torch.no_grad():
        assert torch.equal(dense_logits(part, ids, features), dense_logits(whole, ids, features)[..., :50])
    with pytest.raises(ValueError, match="exceeds"):
        load_draft(out, ModelConfig(path=out, max_model_len=64, head_rows=len(whole.vocab_ids) + 1))
    with pytest.raises(ValueError, match="head_rows must be >= 1"):
        ModelConfig(path=out, head_rows=0)
    with pytest.raises(ValueError, match="trained draft only"):
        load_model(ModelConfig(path=tiny_checkpoint("llama"), head_rows=50))


def test_a_saved_draft_warm_starts_training(tmp_path):
    """tools.draft.train --init: the saved weights and layout come back trainable, and a step moves them."""
    out, draft, ids, features = tiny_draft(tiny_checkpoint("llama"), tmp_path, train_steps=3, kind=LAYOUTS[0])
    warm, layout = trained_draft(out, max_len=64)
    assert tuple(layout.feature_layers) == warm.target_layers
    with torch.no_grad():
        assert (dense_logits(warm, ids, features) - dense_logits(draft, ids, features)).abs().max() < 0.05
    params = trainable(warm)
    before = [p.detach().clone() for p in params]
    loss = dense_logits(warm, ids, features).logsumexp(-1).mean()
    loss.backward()
    torch.optim.SGD(params, lr=0.1).step()
    assert any((p - b).abs().max() > 0 for p, b in zip(params, before))


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_stays_exact_with_a_feature_draft(policy, kind, tmp_path):
    target = tiny_checkpoint("llama")
    out, *_ = tiny_draft(target, tmp_path, train_steps=2, kind=kind)
    engine = make_engine(target, out, policy)
    reqs = workload(target)
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id


@pytest.mark.parametrize("kind", LAYOUTS)
def test_draft_reads_the_targets_features_for_every_token_it_keeps(kind, tmp_path):
    """Under KV pressure (preemptions, recompute), every token of every sequence is read by the draft
    at least once with the target's exact feature of the position before it (and position 0 with zeros)."""
    target = tiny_checkpoint("qwen2")
    out, *_ = tiny_draft(target, tmp_path, kind=kind)
    # No copies: an iteration that verifies copies alone runs no draft, and what it accepted waits for
    # the draft's next read, which need not come before the request ends.
    engine = make_engine(target, out, "adaserve", num_blocks=16, lookup_ngram=0, suffix_tokens=0)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    model = engine.draft.runner.model
    original = model.run

    def recording(ids, positions, attn, features=None):
        if features.shape[-1] != model.spec.hidden_size or kind == "eagle1":  # the chain, not tree levels
            seen.append((ids.clone(), positions.clone(), features.clone()))
        return original(ids, positions, attn, features)

    model.run = recording
    reqs = workload(target, n=10, seed=3)
    last: dict[str, int] = {}
    got = run_staggered(engine, reqs, last)
    assert engine.num_preemptions > 0
    ids = torch.cat([s[0] for s in seen])
    positions = torch.cat([s[1] for s in seen])
    features = torch.cat([s[2] for s in seen])
    tmodel = our_model(target)
    tmodel.feature_layers = model.target_layers
    for r in reqs:
        seq = r.prompt_ids + got[r.request_id]
        with torch.no_grad():
            truth = shifted(dense_features(tmodel, torch.tensor([seq])))[0]
        # what the final iteration emitted is never fed to anything (the request ended)
        for p, tok in enumerate(seq[: len(seq) - last[r.request_id]]):
            rows = ((positions == p) & (ids == tok)).nonzero().flatten()
            close = (features[rows] - truth[p]).abs().amax(-1) < 1e-4
            assert close.any(), (r.request_id, p)


def dense_features(model, ids: torch.Tensor) -> torch.Tensor:
    return dense_run(model, ids)[1]


@pytest.mark.parametrize("layers", [(1,), (1, 2)])
def test_training_time_test_computes_what_serving_computes_at_every_depth(layers, tmp_path):
    """Row i of unrolled step j is the depth-j node under position i: fed through the paged runner as
    a chain and then a path of tree nodes (each reading its parent's output state), the draft gives
    the same logits, so training optimises exactly what the engine runs (one decoder layer or more)."""
    target = our_model(tiny_checkpoint("llama"))
    _, draft, *_ = tiny_draft(tiny_checkpoint("llama"), tmp_path, train_steps=3, layers=layers)
    target.feature_layers = draft.target_layers
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(5))
    steps = 3
    with torch.no_grad():
        taps = shifted(dense_features(target, ids))
        trained = unrolled(draft, ids, taps, steps)
    for i in (0, 4, 6):
        runner = ModelRunner(draft, CacheConfig(num_blocks=8, block_size=4))
        out = runner.forward([SeqInput(0, ids[0, : i + 1].tolist(), features=taps[0, : i + 1])])
        assert torch.allclose(out.of(0)[-1], draft.compute_logits(trained[0][0, i : i + 1])[0], atol=1e-4)
        state, parent = out.features_of(0)[-1:], i
        for j in range(1, steps):
            out = runner.forward([SeqInput(0, [ids[0, i + j].item()], parents=[parent], features=state)])
            assert torch.allclose(out.of(0)[0], draft.compute_logits(trained[j][0, i : i + 1])[0], atol=1e-4), (i, j)
            state, parent = out.features_of(0), parent + 1


def test_training_time_test_from_a_later_row_computes_the_same_rows(tmp_path):
    """Deeper steps started at a later row (training skips prompt rows there) give those rows exactly
    what the full unroll gives them."""
    target = our_model(tiny_checkpoint("llama"))
    _, draft, *_ = tiny_draft(tiny_checkpoint("llama"), tmp_path, train_steps=3, layers=(1, 2))
    target.feature_layers = draft.target_layers
    ids = torch.randint(3, 300, (2, 11), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        taps = shifted(dense_features(target, ids))
        full = unrolled(draft, ids, taps, 3)
        cropped = unrolled(draft, ids, taps, 3, start=5)
    assert torch.equal(cropped[0], full[0])
    for j in (1, 2):
        assert cropped[j].shape[1] == 6
        assert torch.allclose(cropped[j], full[j][:, 5:], atol=1e-5), j


def test_a_draft_file_for_another_layout_is_rejected(tmp_path):
    out, *_ = tiny_draft(tiny_checkpoint("llama"), tmp_path)
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    tensors = load_file(out)
    with safe_open(out, "pt") as f:
        meta = f.metadata()
    tensors.pop(next(k for k in tensors if k.startswith("fc.")))
    save_file(tensors, out, metadata=meta)
    with pytest.raises(ValueError, match="does not match its layout"):
        load_draft(out, ModelConfig(path=out, max_model_len=64))


@pytest.mark.slow
def test_shipped_draft_is_small_and_loads_for_the_embedded_target():
    """It fits the embedded target and, reading the target's features, predicts the target's next token
    on ordinary text far more often than chance (a draft loaded wrong would almost never)."""
    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate
    from adaserve_backend.speculation.draft_fit import check_draft_fits

    assert os.path.getsize(SHIPPED) < 20 * 2**20
    draft = load_model(ModelConfig(path=EMBEDDED_DRAFT, dtype="float32"))
    target = our_model(EMBEDDED_DEFAULT)
    check_draft_fits(target, draft)
    assert draft.takes_features and len(set(draft.vocab_ids.tolist())) == len(draft.vocab_ids)
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    ids = torch.tensor([load_tokenizer(locate(EMBEDDED_DEFAULT))(text)["input_ids"]])
    with torch.no_grad():
        target.feature_layers = draft.target_layers
        features = dense_features(target, ids)
        target_next = dense_logits(target, ids).argmax(-1)
        draft_next = draft.vocab_ids[dense_logits(draft, ids, shifted(features)).argmax(-1)]
    agreement = (draft_next == target_next)[0, 1:].float().mean().item()
    assert agreement > 0.3, agreement  # 0.43 for the shipped EAGLE-3 draft (prompt text, float32)
