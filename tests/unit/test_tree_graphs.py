"""CUDA graphs of the draft's beam steps (adaserve_backend/cuda_graphs/tree.py), checked on the CPU: the keys
captured, which forwards replay one and which stay eager, and that a replay (padding requests on the
scratch blocks under their own mask, static buffers, the page tables and mask planned into a key's
graph-mode prefill wrapper) gives the eager forward's logits, hidden states, features and KV entries, and
the beam search its trees.

No graph can be captured on the CPU: `eager_capture` reruns the captured function into the same static
outputs, and FlashInfer is the stand-in (tests/flashinfer_stand_in.py), whose graph-mode prefill wrapper
computes from the buffers its plan wrote. The graphs themselves replay on a GPU in
tests/gpu/test_tree_graphs_cuda.py."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.config import CacheConfig, EngineConfig, SpeculationConfig
from adaserve_backend.cuda_graphs.capture import eager_capture
from adaserve_backend.model_runner import ModelRunner, SeqInput
from adaserve_backend.models.feature_draft import DraftLayout, base_draft, eagle3_taps
from adaserve_backend.speculation import draft_worker
from adaserve_backend.speculation.beam import BeamRequest, beam_search
from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tests.model_fixtures import our_model, tiny_checkpoint
from tests.unit.test_decode_graphs import close, prefill


@pytest.fixture
def fake_cuda(monkeypatch):
    return stand_in_flashinfer(monkeypatch)


def runners(model, graphs: int, widths, block_size: int = 4, num_blocks: int = 96):
    cache = CacheConfig(block_size=block_size, num_blocks=num_blocks)
    return (ModelRunner(model, cache, "flashinfer"),
            ModelRunner(model, cache, "flashinfer", graphs=graphs, graph_capture=eager_capture, beam_widths=widths))


def count_replays(runner) -> list[tuple[str, int, int]]:
    """(which graphs, requests, tokens per request) of every replay from now on."""
    seen: list[tuple[str, int, int]] = []
    for name, graphs in (("decode", runner.graphs), ("tree", runner.tree_graphs)):
        def counted(ids, positions, meta, features, run=graphs.run, name=name):
            seen.append((name, len(meta.q_lens), meta.q_lens[0]))
            return run(ids, positions, meta, features)

        graphs.run = counted
    return seen


def same_forward(eager, graphed, inputs):
    want, got = eager.forward(inputs), graphed.forward(inputs)
    assert got.logits.shape == want.logits.shape and got.offsets == want.offsets
    assert got.token_offsets == want.token_offsets
    close(got.logits, want.logits)
    close(got.hidden, want.hidden)
    assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
    return want, got


def beam_levels(eager, graphed, members, q, step):
    """A root step (one token each) and two beam steps of q tokens each, hung off the root and then off
    the first level's nodes, as beam.py feeds them; the root is kept, the beams go."""
    same_forward(eager, graphed, [SeqInput(i, [50 + step + i]) for i in members])
    level = [SeqInput(i, [60 + step + i + k for k in range(q)], [0] * q, q) for i in members]
    same_forward(eager, graphed, level)
    deeper = [SeqInput(i, [90 + step + k for k in range(q)], [1 + (k * 7) % q for k in range(q)], q) for i in members]
    same_forward(eager, graphed, deeper)
    for r in (eager, graphed):
        for i in members:
            r.commit(i, [0])


def test_beam_steps_replay_their_bucket_and_width_and_match_the_eager_forward(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    eager, graphed = runners(model, graphs=8, widths=(2, 3, 4, 1))
    tree = graphed.tree_graphs
    assert tree.widths == (2, 3, 4) and tree.buckets == (1, 2, 4, 8)
    assert set(tree.graphs) == {(b, q) for b in (1, 2, 4, 8) for q in (2, 3, 4)}
    assert graphed.kv.data.shape[2] == eager.kv.data.shape[2] + 1  # 4 scratch slots fit one block of 4
    replays = count_replays(graphed)
    prompts = [[5 + i + j for j in range(3 + 2 * i)] for i in range(6)]  # page boundaries crossed apart
    prefill((eager, graphed), prompts)
    rounds = [([0], 2), ([1, 2, 3], 4), (list(range(6)), 3), ([5, 4], 4), ([2], 3)]
    for step, (members, q) in enumerate(rounds):
        beam_levels(eager, graphed, members, q, step)
    want = []
    for members, q in rounds:
        want += [("decode", len(members), 1), ("tree", len(members), q), ("tree", len(members), q)]
    assert replays == want
    real = eager.kv.data.shape[2]  # every real block holds what the eager runner wrote; padding wrote elsewhere
    close(graphed.kv.data[:, :, :real], eager.kv.data)


def test_the_beam_search_finds_the_eager_trees(fake_cuda):
    model = our_model(tiny_checkpoint("llama", sharpen=4.0), "bfloat16")
    eager, graphed = runners(model, graphs=4, widths=(2, 3))
    replays = count_replays(graphed)
    prompts = [[7 + 3 * i + j for j in range(4 + 3 * i)] for i in range(3)]
    for width, depth in ((3, 3), (2, 4)):
        trees = []
        for r in (eager, graphed):
            trees.append(beam_search(r, [BeamRequest(i, p) for i, p in enumerate(prompts)], depth, width))
            for i, p in enumerate(prompts):
                r.commit(i, list(range(len(p))))
        for want, got in zip(*trees):
            assert got.tokens == want.tokens and got.parents == want.parents
            assert got.scores == pytest.approx(want.scores, rel=0.05)
        prompts = [[t.tokens[-1]] for t in trees[0]]  # the next search reads on from one token each
    assert replays == [("tree", 3, 3)] * 2 + [("decode", 3, 1)] + [("tree", 3, 2)] * 3


def test_a_feature_draft_replays_its_beam_steps_with_its_own_features(fake_cuda):
    """An EAGLE-3 draft reads the target's taps (3h wide) with its chain and its own h-wide outputs with
    its beams: both through one graph, the taps fused before the copy; width 1 is decode's graph."""
    path = tiny_checkpoint("llama")
    draft = base_draft(DraftLayout(path, layers=[1], head_vocab=list(range(3, 200)), feature_layers=eagle3_taps(3)),
                       max_len=512).place("cpu", torch.bfloat16).eval()
    eager, graphed = runners(draft, graphs=4, widths=(2, 3))
    assert graphed.tree_graphs.static.features.shape[1] == draft.spec.hidden_size < draft.fc.in_features
    replays = count_replays(graphed)
    gen = torch.Generator().manual_seed(0)
    prompts = [[3, 4, 5, 6], [7, 8], [9, 10, 11]]
    taps = [torch.randn(len(p), draft.fc.in_features, generator=gen) for p in prompts]
    for width in (3, 1, 2):
        trees = []
        for r in (eager, graphed):
            requests = [BeamRequest(i, p, f) for i, (p, f) in enumerate(zip(prompts, taps))]
            trees.append(beam_search(r, requests, 3, width))
            for i, p in enumerate(prompts):
                r.commit(i, list(range(len(p))))
        for want, got in zip(*trees):
            assert got.tokens == want.tokens and got.parents == want.parents
        prompts = [[t.tokens[-1]] for t in trees[0]]
        taps = [torch.randn(1, draft.fc.in_features, generator=gen) for _ in prompts]
    # the root steps of one token each replay decode's graph with the taps, fused first
    assert replays == [("tree", 3, 3)] * 2 + [("decode", 3, 1)] * 3 + [("decode", 3, 1)] + [("tree", 3, 2)] * 2
    inputs = [SeqInput(i, [40 + i, 41 + i], [-1, -1], 2, torch.randn(2, draft.spec.hidden_size, generator=gen))
              for i in range(3)]
    want, got = same_forward(eager, graphed, inputs)
    close(got.features, want.features)


def test_other_forwards_stay_eager(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    eager, graphed = runners(model, graphs=2, widths=(2, 3))
    replays = count_replays(graphed)
    prefill((eager, graphed), [[3, 4, 5], [6, 7], [8, 9, 10, 11]])
    steps = [
        [SeqInput(0, [12, 13], [-1, -1], 2), SeqInput(1, [14, 15], [-1, -1], 2),
         SeqInput(2, [16, 17], [-1, -1], 2)],  # 3 requests > the largest bucket
        [SeqInput(0, [18, 19, 20, 21], [-1, -1, -1, -1], 4)],  # 4 tokens: no graph of 4
        [SeqInput(0, [22, 23], [-1, 0], 1)],  # not every logit wanted
        [SeqInput(0, [24, 25], [-1, -1], 2), SeqInput(1, [26, 27, 28], [-1, -1, -1], 3)],  # 2 and 3 tokens
        [SeqInput(1, [29], [0], 1)],  # one token onto a tree: neither decode nor a beam step
    ]
    for inputs in steps:
        same_forward(eager, graphed, inputs)
    assert replays == []
    inputs = [SeqInput(2, [30, 31], [-1, 0], 2)]  # 2 tokens, every logit wanted: a beam step's shape, replayed
    same_forward(eager, graphed, inputs)
    assert replays == [("tree", 1, 2)]


def test_widths_past_a_block_take_more_scratch_blocks(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    eager, graphed = runners(model, graphs=2, widths=(3, 5), block_size=2)
    assert graphed.kv.data.shape[2] == eager.kv.data.shape[2] + 3  # 5 scratch slots in blocks of 2
    replays = count_replays(graphed)
    prefill((eager, graphed), [[3, 4, 5], [6, 7, 8, 9, 10]])
    beam_levels(eager, graphed, [0, 1], 5, 0)
    beam_levels(eager, graphed, [1], 3, 1)
    assert [r for r in replays if r[0] == "tree"] == [("tree", 2, 5)] * 2 + [("tree", 1, 3)] * 2
    real = eager.kv.data.shape[2]
    close(graphed.kv.data[:, :, :real], eager.kv.data)


def test_a_region_past_the_buffers_runs_eager(fake_cuda):
    """The buffers hold max_len keys a request; a tree's region can reach past that (its depth cannot)."""
    model = our_model(tiny_checkpoint("llama"), "bfloat16")  # max_len 512
    eager, graphed = runners(model, graphs=1, widths=(4,), num_blocks=140)
    replays = count_replays(graphed)
    prefill((eager, graphed), [[3 + j % 200 for j in range(500)]])
    parents = [-1] * 4
    for level in range(4):  # regions of 4, 8, 12, 16 tokens: keys 504 ... 516
        same_forward(eager, graphed, [SeqInput(0, [20 + level] * 4, parents, 4)])
        parents = [4 * level + k for k in range(4)]
    assert replays == [("tree", 1, 4)] * 3


def test_graphs_stay_off_on_the_cpu_without_a_capture(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    cache = CacheConfig(block_size=4, num_blocks=16)
    runner = ModelRunner(model, cache, "flashinfer", graphs=8, beam_widths=(2, 3))
    assert runner.graphs is None and runner.tree_graphs is None and runner.kv.data.shape[2] == 16
    sdpa = ModelRunner(model, cache, "torch", graphs=8, graph_capture=eager_capture, beam_widths=(2, 3))
    assert sdpa.graphs is None and sdpa.tree_graphs is None


def test_the_draft_worker_asks_for_the_configured_beam_widths(monkeypatch):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    made = []
    real = draft_worker.ModelRunner
    monkeypatch.setattr(draft_worker, "ModelRunner", lambda *a, **kw: made.append(kw) or real(*a, **kw))
    target = ModelRunner(model, CacheConfig(block_size=4, num_blocks=16))
    config = EngineConfig(speculation=SpeculationConfig(w_max=3), draft_cache=CacheConfig(num_blocks=16))
    draft_worker.DraftWorker.for_target(target, config, draft=model)
    (kw,) = made
    assert list(kw["beam_widths"]) == [2, 3] and kw["graphs"] == config.draft.cuda_graph_max_batch
