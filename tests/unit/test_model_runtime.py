"""Our model forward against transformers, the oracle: prefill, decode, chunked prefill, token trees."""

from __future__ import annotations

import random

import pytest
import torch

from adaserve_backend.attention import torch_sdpa
from adaserve_backend.config import EMBEDDED_DEFAULT, CacheConfig
from adaserve_backend.kv_cache import KVCacheFull
from adaserve_backend.model_runner import ModelRunner, SeqInput
from tests.model_fixtures import hf_reference, our_model, tiny_checkpoint

TOL = 1e-3
MODELS = [
    pytest.param("llama", id="tiny-llama"),
    pytest.param("qwen2", id="tiny-qwen2"),
    pytest.param("embedded", id="smollm2-gguf", marks=pytest.mark.slow),
]


def checkpoint(kind: str) -> str:
    return EMBEDDED_DEFAULT if kind == "embedded" else tiny_checkpoint(kind)


def runner_for(path: str, memory_mb: int = 64, block_size: int = 4, attention: str = "auto") -> ModelRunner:
    # Small blocks so sequences span many blocks and paths cross block boundaries.
    return ModelRunner(our_model(path), CacheConfig(block_size=block_size, memory_mb=memory_mb), attention)


@torch.no_grad()
def ref_logits(path: str, ids: list[int]) -> torch.Tensor:
    return hf_reference(path)(torch.tensor([ids])).logits[0].float()


def random_ids(path: str, n: int, seed: int) -> list[int]:
    vocab = our_model(path).spec.vocab_size
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (ours - ref).abs().max().item()
    assert diff < TOL, f"max abs diff {diff}"


def random_tree(rng: random.Random, size: int, min_depth: int = 4) -> list[int]:
    """Parents of a token tree (node 0 is the root, parents precede children) with a path of at
    least `min_depth` below the root and at least one node with two or more children."""
    parents = [-1] + list(range(min_depth))  # a spine of depth min_depth
    while len(parents) < size:
        parents.append(rng.randrange(len(parents)))
    if max(parents.count(p) for p in set(parents)) < 2:
        parents.append(0)
    return parents


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("kind", MODELS)
def test_prefill_and_incremental_decode_match_transformers(kind):
    path = checkpoint(kind)
    runner = runner_for(path)
    ids = random_ids(path, 48, seed=1)
    ref = ref_logits(path, ids)
    prompt = 12
    out = runner.forward([SeqInput(0, ids[:prompt], num_logits=prompt)])
    runner.commit_all(0)
    assert_close(out.logits, ref[:prompt])
    for pos in range(prompt, len(ids)):  # 36 single-token decode steps
        out = runner.forward([SeqInput(0, [ids[pos]])])
        runner.commit_all(0)
        assert_close(out.logits[0], ref[pos])
    runner.free(0)
    assert runner.blocks.num_free_blocks == runner.blocks.num_blocks


@pytest.mark.parametrize("kind", MODELS)
def test_chunked_prefill_matches_transformers(kind):
    path = checkpoint(kind)
    runner = runner_for(path)
    ids = random_ids(path, 40, seed=2)
    ref = ref_logits(path, ids)
    start = 0
    for chunk in (5, 11, 1, 16, 7):
        out = runner.forward([SeqInput(0, ids[start : start + chunk], num_logits=chunk)])
        runner.commit_all(0)
        assert_close(out.logits, ref[start : start + chunk])
        start += chunk
    assert start == len(ids)


@pytest.mark.parametrize("grouping", ["cost", "apart", "paged_cpu"])
@pytest.mark.parametrize("kind", MODELS)
def test_batched_tree_verification_then_commit_and_decode(kind, grouping, monkeypatch):
    """Three sequences verify different trees in one forward (a fourth prefills a chunk beside them);
    each tree node's logits equal transformers' on the node's root-to-node path. After committing one
    accepted path per sequence, the next decode step matches again. "apart": attention splits the
    batch into several padded groups (free extra SDPA calls), "cost": as served (here one group),
    "paged_cpu": the C++ kernel reading the cache in place for every sequence, trees and chunk alike (float32
    here, so its arithmetic is checked to the oracle's tolerance; served in bfloat16)."""
    if grouping == "apart":
        monkeypatch.setattr(torch_sdpa, "GROUP_OVERHEAD_PAIRS", -10**9)
    path = checkpoint(kind)
    runner = runner_for(path, attention="paged_cpu" if grouping == "paged_cpu" else "auto")
    rng = random.Random(3)
    prompts = [random_ids(path, n, seed=10 + n) for n in (9, 17, 5)]
    # Batched prefill of different lengths, leaving each prompt's last token as its tree root.
    runner.forward([SeqInput(i, p[:-1]) for i, p in enumerate(prompts)])
    for i in range(3):
        runner.commit_all(i)
    trees = [random_tree(rng, size) for size in (9, 13, 7)]
    tokens = [[p[-1]] + random_ids(path, len(t) - 1, seed=20 + i) for i, (p, t) in enumerate(zip(prompts, trees))]
    other = random_ids(path, 10, seed=99)
    runner.forward([SeqInput(3, other[:6], num_logits=0)])
    runner.commit_all(3)
    out = runner.forward(
        [SeqInput(i, tokens[i], parents=trees[i], num_logits=len(tokens[i])) for i in range(3)]
        + [SeqInput(3, other[6:], num_logits=4)]
    )
    for i in range(3):
        for node in range(len(trees[i])):
            seq = prompts[i][:-1] + [tokens[i][n] for n in path_to(trees[i], node)]
            assert_close(out.of(i)[node], ref_logits(path, seq)[-1])
    assert_close(out.of(3), ref_logits(path, other)[6:])

    for i in range(3):
        leaf = max(range(len(trees[i])), key=lambda n: (len(path_to(trees[i], n)), n))
        keep = path_to(trees[i], leaf)
        runner.commit(i, keep)
        accepted = prompts[i][:-1] + [tokens[i][n] for n in keep]
        nxt = random_ids(path, 1, seed=30 + i)
        out = runner.forward([SeqInput(i, nxt)])
        runner.commit_all(i)
        assert_close(out.logits[0], ref_logits(path, accepted + nxt)[-1])


@pytest.mark.parametrize("kind", MODELS[:2])
def test_tree_grown_over_several_forwards_like_draft_beam_search(kind):
    """Draft beam steps add tree levels one forward at a time; the new level's parents are region
    tokens written by earlier forwards."""
    path = checkpoint(kind)
    runner = runner_for(path)
    prompt = random_ids(path, 11, seed=4)
    runner.forward([SeqInput(0, prompt[:-3])])
    runner.commit_all(0)
    # step 1: uncommitted catch-up chain ending in the root; steps 2-4: two beams per level
    levels = [(prompt[-3:], None)]
    levels += [(random_ids(path, 2, seed=40), [2, 2]), (random_ids(path, 2, seed=41), [3, 3]),
               (random_ids(path, 2, seed=42), [4, 5])]
    parents, tokens = [], []
    for toks, par in levels:
        out = runner.forward([SeqInput(0, toks, parents=par, num_logits=len(toks))])
        par = par if par is not None else [-1, 0, 1]
        for j, t in enumerate(toks):
            parents.append(par[j])
            tokens.append(t)
            node = len(tokens) - 1
            seq = prompt[:-3] + [tokens[n] for n in path_to(parents, node)]
            assert_close(out.logits[j], ref_logits(path, seq)[-1])


def test_bfloat16_forward_tracks_float32():
    path = tiny_checkpoint("llama")
    ids = random_ids(path, 30, seed=5)
    runners = [ModelRunner(our_model(path, dtype), CacheConfig(block_size=4, memory_mb=8))
               for dtype in ("float32", "bfloat16")]
    outs = [r.forward([SeqInput(0, ids, num_logits=len(ids))]).logits for r in runners]
    assert outs[1].dtype == torch.float32
    assert (outs[0] - outs[1]).abs().max().item() < 0.1 * outs[0].abs().max().item()


@pytest.mark.parametrize("grouping", ["cost", "apart"])
def test_bfloat16_mixed_batch_tracks_float32(grouping, monkeypatch):
    """bfloat16 attention folds query heads into the query length (float32 does not): a tree, a
    decode step and a prefill chunk in one forward stay close to float32's logits."""
    if grouping == "apart":
        monkeypatch.setattr(torch_sdpa, "GROUP_OVERHEAD_PAIRS", -10**9)
    path = tiny_checkpoint("llama")
    prompts = [random_ids(path, n, seed=40 + n) for n in (21, 9, 14)]
    tree = [-1, 0, 0, 1, 1, 2, 3]
    outs = []
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner(our_model(path, dtype), CacheConfig(block_size=4, memory_mb=8))
        runner.forward([SeqInput(0, prompts[0][:-1], num_logits=0), SeqInput(1, prompts[1][:-1], num_logits=0)])
        runner.commit_all(0)
        runner.commit_all(1)
        tokens = [prompts[0][-1]] + random_ids(path, len(tree) - 1, seed=7)
        outs.append(runner.forward([
            SeqInput(0, tokens, parents=tree, num_logits=len(tree)),
            SeqInput(1, prompts[1][-1:]),
            SeqInput(2, prompts[2], num_logits=len(prompts[2])),
        ]).logits)
    assert (outs[0] - outs[1]).abs().max().item() < 0.1 * outs[0].abs().max().item()


def test_out_of_capacity_is_reported_without_side_effects():
    path = tiny_checkpoint("llama")
    runner = ModelRunner(our_model(path), CacheConfig(block_size=64, memory_mb=1))
    seq = 0
    while runner.blocks.num_free_blocks > 1:  # fill all but one block with full-block sequences
        n = 64 * min(runner.blocks.num_free_blocks - 1, 4)
        runner.forward([SeqInput(seq, random_ids(path, n, seed=seq), num_logits=0)])
        runner.commit_all(seq)
        seq += 1
    assert seq >= 2, "the test needs several sequences in the cache"
    before = {i: (list(runner.blocks.seq(i).block_table), runner.blocks.seq(i).num_committed) for i in range(seq)}
    too_many = [SeqInput(1000, random_ids(path, 65, seed=7)), SeqInput(1001, random_ids(path, 3, seed=8))]  # 3 blocks
    assert not runner.can_forward(too_many)
    with pytest.raises(KVCacheFull):
        runner.forward(too_many)
    assert runner.blocks.num_free_blocks == 1 and not runner.blocks.has(1000) and not runner.blocks.has(1001)
    after = {i: (list(runner.blocks.seq(i).block_table), runner.blocks.seq(i).num_committed) for i in range(seq)}
    assert after == before, "sequences outside the failed batch are untouched"
    runner.free(0)  # the scheduler preempts a request: its blocks come back and the batch fits
    assert runner.can_forward(too_many)
    out = runner.forward(too_many)
    assert runner.region_len(1000) == 65 and runner.region_len(1001) == 3 and out.logits.shape[0] == 2


def test_rejects_bad_inputs_before_touching_state():
    path = tiny_checkpoint("llama")
    runner = runner_for(path)
    free = runner.blocks.num_free_blocks
    with pytest.raises(ValueError):
        runner.forward([SeqInput(0, [1, 2]), SeqInput(1, [1], num_logits=2)])
    with pytest.raises(ValueError):
        runner.forward([SeqInput(0, [1] * (runner.max_len + 1))])
    with pytest.raises(ValueError):
        runner.forward([SeqInput(0, [1, 2], parents=[-1, 5])])
    assert runner.blocks.num_free_blocks == free and not runner.blocks.has(0)


@pytest.mark.skipif(not (ops := __import__("adaserve_backend.models.linear",
                                           fromlist=["kernels"]).kernels()) or not ops.pair_gemm,
                    reason="bfloat16 products of any row count take one kernel only with the pair kernel built")
@pytest.mark.parametrize("dtype", ["bfloat16", "q4_1_int8"])
def test_logits_do_not_depend_on_how_a_context_was_computed(dtype):
    """The same token after the same context gets the same logits, bit for bit, whether it is
    decoded alone, verified in a chain or in a tree beside hidden siblings, or prefilled in one chunk or
    several (chunks within the pair kernel's rows where AMX takes larger products): else a repeated
    greedy request could change its answer with the load or a prefix-cache hit, and speculation would
    not be lossless. q4_1_int8 quantizes each row's activations on its own, so it holds there too."""
    if dtype == "q4_1_int8" and not ops.int8_gemm:
        pytest.skip("the integer-dot kernel needs AVX512-VNNI")
    path = EMBEDDED_DEFAULT  # a tiny model's sums round alike either way
    ids = random_ids(path, 60, seed=11)
    P, N = 37, 12  # crosses several 16-key boundaries and block boundaries (block_size 4)
    runner = ModelRunner(our_model(path, dtype), CacheConfig(block_size=4, memory_mb=64))
    for start in range(0, P, 16):
        runner.forward([SeqInput(0, ids[start : min(start + 16, P)], num_logits=0)])
        runner.commit_all(0)
    decoded = []
    for p in range(P, P + N):
        decoded.append(runner.forward([SeqInput(0, [ids[p]])]).logits[0])
        runner.commit_all(0)

    def fresh(seq: int, upto: int, chunk: int) -> None:
        for start in range(0, upto, chunk):
            runner.forward([SeqInput(seq, ids[start : min(start + chunk, upto)], num_logits=0)])
            runner.commit_all(seq)

    fresh(1, P, 16)
    chain = runner.forward([SeqInput(1, ids[P : P + N], parents=list(range(-1, N - 1)), num_logits=N)]).logits
    assert torch.equal(chain, torch.stack(decoded))
    fresh(2, P, 5)  # other chunk boundaries, then a tree: path root -> 2 -> 4 beside hidden nodes 1 and 3
    tree = runner.forward([SeqInput(2, [ids[P], 7, ids[P + 1], 9, ids[P + 2]],
                                    parents=[-1, 0, 0, 1, 2], num_logits=5)]).logits
    assert torch.equal(tree[[0, 2, 4]], torch.stack(decoded[:3]))
    fresh(3, P + 3, 11)
    assert torch.equal(runner.forward([SeqInput(3, ids[P + 3 : P + 4])]).logits[0], decoded[3])
