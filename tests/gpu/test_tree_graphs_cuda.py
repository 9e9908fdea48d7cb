"""CUDA graphs of the draft's beam steps (adaserve_backend/cuda_graphs/tree.py) captured and replayed on a GPU:
beam-step-shaped forwards (q tokens per request hung off a tree, all q logits wanted) at every captured
width and several batch sizes give the eager forward's logits (bf16 rounding apart: a padded batch is
another GEMM shape) and greedy tokens and write the real KV entries the eager forward writes; an EAGLE-3
layout draft's beam steps, its own features fed back, do too. CPU-side checks of the same code, with a
rerun in place of a replay: tests/unit/test_tree_graphs.py."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.config import CacheConfig
from adaserve_backend.model_runner import ModelRunner, SeqInput
from tests.gpu.test_engine_cuda import random_llama

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="GPU test: no CUDA device here (torch.cuda.is_available() is False)")

WIDTHS = (2, 3, 4)


def flashinfer_or_skip():
    from adaserve_backend.attention.flashinfer_cuda import flashinfer_importable

    if not flashinfer_importable():
        pytest.skip("CUDA graphs replay FlashInfer attention, which does not import here")


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    return random_llama(tmp_path_factory.mktemp("tree-graphs") / "target", seed=0, layers=4, sharpen=4.0)


def load(path):
    from adaserve_backend.config import ModelConfig
    from adaserve_backend.models import load_model

    return load_model(ModelConfig(path=path, dtype="bfloat16", device="cuda", max_model_len=512))


def counted(graphs) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    run = graphs.run
    graphs.run = lambda ids, pos, meta, f: (seen.append((len(meta.q_lens), meta.q_lens[0])), run(ids, pos, meta, f))[1]
    return seen


def beam_rounds(eager, graphed, rounds, features=None):
    """Per round: a root token each, then two beam steps of q tokens (off the root, then off the first
    level); compares every forward, keeps the root. Returns (greedy rows that agree, rows)."""
    same = total = 0
    for step, (size, q) in enumerate(rounds):
        members = range(size)
        root = [SeqInput(i, [100 + step * 17 + i], features=features and features(1, taps=True)) for i in members]
        level = [SeqInput(i, [200 + 13 * step + 5 * i + k for k in range(q)], [0] * q, q,
                          features and features(q, taps=False)) for i in members]
        deeper = [SeqInput(i, [400 + 11 * step + 3 * i + k for k in range(q)], [1 + (k * 7) % q for k in range(q)], q,
                           features and features(q, taps=False)) for i in members]
        for inputs in (root, level, deeper):
            want, got = eager.forward(inputs), graphed.forward(inputs)
            torch.testing.assert_close(got.logits, want.logits, atol=0.15, rtol=0.05)
            same += int((got.logits.argmax(-1) == want.logits.argmax(-1)).sum())
            total += want.logits.shape[0]
        for r in (eager, graphed):
            for i in members:
                r.commit(i, [0])
    return same, total


def prefill(runners, prompts, features=None):
    for r in runners:
        for i, p in enumerate(prompts):
            r.forward([SeqInput(i, p, features=features and features(len(p), taps=True))])
            r.commit_all(i)


def test_every_width_replays_the_eager_beam_steps(target_path):
    flashinfer_or_skip()
    model = load(target_path)
    cache = CacheConfig(block_size=16, num_blocks=256)
    eager = ModelRunner(model, cache, "flashinfer")
    graphed = ModelRunner(model, cache, "flashinfer", graphs=8, beam_widths=WIDTHS)
    assert graphed.tree_graphs is not None
    assert set(graphed.tree_graphs.graphs) == {(b, q) for b in (1, 2, 4, 8) for q in WIDTHS}
    replays = counted(graphed.tree_graphs)
    prefill((eager, graphed), [[(7 * i + j) % 2000 + 3 for j in range(5 + 17 * i)] for i in range(8)])  # 5-124
    rounds = [(1, 2), (3, 4), (8, 3), (5, 2), (8, 4), (2, 3)]
    same, total = beam_rounds(eager, graphed, rounds)
    assert replays == [r for r in rounds for _ in range(2)]
    assert same >= 0.95 * total, f"greedy tokens agree on {same} of {total} rows"
    real = eager.kv.data.shape[2]
    torch.testing.assert_close(graphed.kv.data[:, :, :real].float(), eager.kv.data.float(), atol=0.1, rtol=0.05)


def test_a_feature_draft_replays_its_beam_steps(target_path):
    from adaserve_backend.models.feature_draft import DraftLayout, base_draft

    flashinfer_or_skip()
    layout = DraftLayout(target_path, layers=[1], head_vocab=list(range(3, 1024)), feature_layers=[0, 2, 3])
    torch.manual_seed(2)
    draft = base_draft(layout, max_len=512).place("cuda", torch.bfloat16).eval()
    cache = CacheConfig(block_size=16, num_blocks=64)
    eager = ModelRunner(draft, cache, "flashinfer")
    graphed = ModelRunner(draft, cache, "flashinfer", graphs=4, beam_widths=WIDTHS)
    replays = counted(graphed.tree_graphs)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def features(n: int, taps: bool):  # the target's taps for a chain, the draft's own h-wide outputs for beams
        width = draft.fc.in_features if taps else draft.spec.hidden_size
        return torch.randn(n, width, device="cuda", generator=gen)

    prefill((eager, graphed), [[3 + i + j for j in range(20 + 9 * i)] for i in range(3)], features)
    rounds = [(1, 4), (3, 2), (2, 3)]
    same, total = beam_rounds(eager, graphed, rounds, features)
    assert replays == [r for r in rounds for _ in range(2)]
    assert same >= 0.95 * total, f"greedy tokens agree on {same} of {total} rows"
