"""CUDA graphs of plain decode (adaserve_backend/cuda_graphs/decode.py), checked on the CPU: the buckets, which
forwards replay a graph and which stay eager, and that a replay (padding rows, static buffers, the page
tables planned into a bucket's wrapper) gives the eager forward's logits, hidden states and KV entries.

No graph can be captured on the CPU: `eager_capture` reruns the captured function into the same static
outputs, and FlashInfer is the stand-in (tests/flashinfer_stand_in.py) computing with the reference. The
graphs themselves replay on a GPU in tests/gpu/test_engine_cuda.py."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.config import CacheConfig
from adaserve_backend.cuda_graphs.capture import bucket_for, buckets_up_to, eager_capture
from adaserve_backend.model_runner import ModelRunner, SeqInput
from adaserve_backend.models.feature_draft import DraftLayout, base_draft, eagle3_taps
from tests.flashinfer_stand_in import install as stand_in_flashinfer
from tests.model_fixtures import our_model, tiny_checkpoint


def test_buckets_are_1_2_4_8_then_multiples_of_8_up_to_the_largest():
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(32) == (1, 2, 4, 8, 16, 24, 32)
    assert buckets_up_to(12) == (1, 2, 4, 8, 12)
    b = buckets_up_to(32)
    assert [bucket_for(n, b) for n in (1, 2, 3, 5, 9, 17, 32, 33)] == [1, 2, 4, 8, 16, 24, 32, None]


@pytest.fixture
def fake_cuda(monkeypatch):
    return stand_in_flashinfer(monkeypatch)


def runners(model, graphs: int):
    cache = CacheConfig(block_size=4, num_blocks=96)
    return (ModelRunner(model, cache, "flashinfer"),
            ModelRunner(model, cache, "flashinfer", graphs=graphs, graph_capture=eager_capture))


def count_replays(runner) -> list[int]:
    seen: list[int] = []
    run = runner.graphs.run

    def counted(ids, *args):
        seen.append(len(ids))
        return run(ids, *args)

    runner.graphs.run = counted
    return seen


def prefill(rs, prompts, features=None):
    for r in rs:
        r.forward([SeqInput(i, p, features=None if features is None else features(len(p)))
                   for i, p in enumerate(prompts)])
        for i in range(len(prompts)):
            r.commit_all(i)


def close(a, b):
    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_decode_batches_replay_a_bucket_and_match_the_eager_forward(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    eager, graphed = runners(model, graphs=8)
    assert graphed.graphs.buckets == (1, 2, 4, 8)
    assert graphed.kv.data.shape[2] == eager.kv.data.shape[2] + 1  # the scratch block
    replays = count_replays(graphed)
    prompts = [[5 + i + j for j in range(3 + 2 * i)] for i in range(6)]  # page boundaries crossed apart
    prefill((eager, graphed), prompts)
    assert replays == []  # prefill is not plain decode
    for step, members in enumerate([[0], [1, 2, 3], [0, 2, 3, 4, 5], [5, 4], list(range(6))]):
        inputs = [SeqInput(i, [40 + step + i]) for i in members]
        want, got = eager.forward(inputs), graphed.forward(inputs)
        assert got.logits.shape == want.logits.shape and got.offsets == want.offsets
        close(got.logits, want.logits)
        close(got.hidden, want.hidden)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        for i in members:
            eager.commit_all(i)
            graphed.commit_all(i)
    assert replays == [1, 3, 5, 2, 6]
    real = eager.kv.data.shape[2]  # every real block holds what the eager runner wrote; padding wrote elsewhere
    close(graphed.kv.data[:, :, :real], eager.kv.data)


def test_trees_several_tokens_and_batches_past_the_largest_bucket_run_eager(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    eager, graphed = runners(model, graphs=2)
    replays = count_replays(graphed)
    prefill((eager, graphed), [[3, 4, 5], [6, 7], [8, 9, 10, 11]])
    steps = [
        [SeqInput(0, [12]), SeqInput(1, [13]), SeqInput(2, [14])],  # 3 > the largest bucket
        [SeqInput(0, [15, 16], num_logits=2)],  # a chain of two
        [SeqInput(1, [17, 18], parents=[-1, -1], num_logits=2)],  # a tree of two siblings
        [SeqInput(1, [19], parents=[0], num_logits=1)],  # one token, but its region is a tree
        [SeqInput(2, [20], num_logits=0)],  # no logit row wanted
    ]
    for n, inputs in enumerate(steps):
        close(graphed.forward(inputs).logits, eager.forward(inputs).logits)
        if n == 0:
            for r in (eager, graphed):
                for i in range(3):
                    r.commit_all(i)
    assert replays == []
    for r in (eager, graphed):
        r.commit(1, [0, 2])
    inputs = [SeqInput(1, [21])]  # committed again: plain decode
    close(graphed.forward(inputs).logits, eager.forward(inputs).logits)
    assert replays == [1]


def test_a_feature_draft_replays_with_its_features(fake_cuda):
    path = tiny_checkpoint("llama")
    draft = base_draft(DraftLayout(path, layers=[1], head_vocab=list(range(3, 200)), feature_layers=eagle3_taps(3)),
                       max_len=512).place("cpu", torch.bfloat16).eval()
    eager, graphed = runners(draft, graphs=4)
    replays = count_replays(graphed)
    width = draft.fc.in_features
    gen = torch.Generator().manual_seed(0)

    def features(n):
        return torch.randn(n, width, generator=gen)

    prefill((eager, graphed), [[3, 4, 5, 6], [7, 8]], features=lambda n: torch.zeros(n, width))
    for step in range(3):
        f = features(2)
        inputs = [SeqInput(i, [30 + step + i], features=f[i : i + 1]) for i in range(2)]
        want, got = eager.forward(inputs), graphed.forward(inputs)
        close(got.logits, want.logits)
        close(got.features, want.features)
        for i in range(2):
            eager.commit_all(i)
            graphed.commit_all(i)
    assert replays == [2, 2, 2]


def test_graphs_stay_off_on_the_cpu_without_a_capture_and_under_sdpa(fake_cuda):
    model = our_model(tiny_checkpoint("llama"), "bfloat16")
    cache = CacheConfig(block_size=4, num_blocks=16)
    assert ModelRunner(model, cache, "flashinfer", graphs=8).graphs is None  # a CPU model: nothing to capture
    sdpa = ModelRunner(model, cache, "torch", graphs=8, graph_capture=eager_capture)
    assert sdpa.graphs is None  # the SDPA fallback is never captured
