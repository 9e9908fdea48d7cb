"""CUDA graphs of plain decode (adaserve_backend/cuda_graphs/decode.py) captured and replayed on a GPU: each
bucket's replay gives the eager forward's logits (bf16 rounding apart: the padded batch is a different
GEMM shape) and greedy tokens, writes the real KV entries the eager forward writes, and leaves trees and
prefill eager. CPU-side checks of the same code, with a rerun in place of a replay: tests/unit/test_decode_graphs.py."""

from __future__ import annotations

import pytest
import torch

from adaserve_backend.config import CacheConfig
from adaserve_backend.model_runner import ModelRunner, SeqInput
from tests.gpu.test_engine_cuda import random_llama

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="GPU test: no CUDA device here (torch.cuda.is_available() is False)")


def flashinfer_or_skip():
    from adaserve_backend.attention.flashinfer_cuda import flashinfer_importable

    if not flashinfer_importable():
        pytest.skip("CUDA graphs replay FlashInfer attention, which does not import here")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from adaserve_backend.config import ModelConfig
    from adaserve_backend.models import load_model

    path = random_llama(tmp_path_factory.mktemp("graphs") / "target", seed=0, layers=4, sharpen=4.0)
    return load_model(ModelConfig(path=path, dtype="bfloat16", device="cuda", max_model_len=512))


def test_every_bucket_replays_the_eager_decode(model):
    flashinfer_or_skip()
    cache = CacheConfig(block_size=16, num_blocks=256)
    eager = ModelRunner(model, cache, "flashinfer")
    graphed = ModelRunner(model, cache, "flashinfer", graphs=16)
    assert graphed.graphs is not None and graphed.graphs.buckets == (1, 2, 4, 8, 16)
    replays: list[int] = []
    run = graphed.graphs.run
    graphed.graphs.run = lambda ids, *a: (replays.append(len(ids)), run(ids, *a))[1]
    n = 16
    prompts = [[(7 * i + j) % 2000 + 3 for j in range(5 + 9 * i)] for i in range(n)]  # 5-140 tokens
    for r in (eager, graphed):
        for i, p in enumerate(prompts):
            r.forward([SeqInput(i, p)])
            r.commit_all(i)
    same = total = 0
    for step, size in enumerate([1, 2, 3, 5, 8, 11, 16, 16, 7]):
        inputs = [SeqInput(i, [100 + step * 17 + i]) for i in range(size)]
        want, got = eager.forward(inputs), graphed.forward(inputs)
        torch.testing.assert_close(got.logits, want.logits, atol=0.15, rtol=0.05)
        same += int((got.logits.argmax(-1) == want.logits.argmax(-1)).sum())
        total += size
        for i in range(size):
            eager.commit_all(i)
            graphed.commit_all(i)
    assert replays == [1, 2, 3, 5, 8, 11, 16, 16, 7]
    assert same >= 0.95 * total, f"greedy tokens agree on {same} of {total} rows"
    real = eager.kv.data.shape[2]
    torch.testing.assert_close(graphed.kv.data[:, :, :real].float(), eager.kv.data.float(), atol=0.1, rtol=0.05)
    tree = [SeqInput(0, [5, 6, 7], parents=[-1, -1, 0], num_logits=3)]  # not plain decode: eager
    torch.testing.assert_close(graphed.forward(tree).logits, eager.forward(tree).logits, atol=0.15, rtol=0.05)
    assert len(replays) == 9
