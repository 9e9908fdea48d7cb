"""Automatic prefix caching: the block pool's sharing and LRU eviction, and the engine against the
oracle with requests that share long prefixes (plain and feature-conditioned drafts, eviction
pressure, preemption): greedy outputs unchanged, prefixes reused, every block back at the end."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaserve_backend.engine import Engine
from adaserve_backend.kv_cache import BlockManager
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO
from tests.engines import EOS, assert_all_blocks_free, reference, run_staggered, small_config
from tests.model_fixtures import our_model, tiny_checkpoint


def filled(blocks: BlockManager, seq_id: int, tokens: list[int]) -> None:
    blocks.append(seq_id, list(range(-1, len(tokens) - 1)))
    blocks.commit_all(seq_id)
    blocks.publish(seq_id, tokens)


def test_full_committed_blocks_are_shared_read_only_and_evicted_least_recently_used():
    blocks = BlockManager(6, 4, prefix_caching=True)
    a, b = list(range(10, 20)), list(range(10, 18)) + [99, 98]
    filled(blocks, 1, a)  # 10 tokens: two full blocks keyed, the third is partial
    assert blocks.pool.num_cached == 2
    assert len(blocks.match(a, 9)[0]) == 2 and len(blocks.match(a, 7)[0]) == 1  # whole blocks within the limit
    assert len(blocks.match(b, 9)[0]) == 2 and blocks.match([10, 11, 12, 0], 4)[0] == []
    shared, keys = blocks.match(b, 9)
    blocks.attach(2, shared, keys)
    assert blocks.num_committed(2) == 8 and [blocks.pool.refs(x) for x in shared] == [2, 2]
    blocks.append(2, [-1, 0])  # writes go past the shared blocks, into a block of its own
    assert blocks.table(2)[2] not in blocks.table(1)
    blocks.free(1)
    blocks.free(2)
    assert blocks.num_free_blocks == 6 and blocks.pool.num_cached == 2  # idle, still findable
    filled(blocks, 3, [7] * 12)  # three fresh blocks: the free ones first, then the idle ones
    filled(blocks, 4, [8] * 8)  # two more: the last free one, then the idle one released first
    # a sequence releases its blocks last to first, so a prefix loses its tail before its head
    assert len(blocks.match(a, 9)[0]) == 1 and blocks.pool.num_cached == 6
    with pytest.raises(ValueError):
        blocks.attach(3, [], [])


def test_a_block_without_its_payload_is_keyed_but_not_cached_and_caching_can_be_off():
    blocks = BlockManager(4, 4, prefix_caching=True)
    blocks.append(1, list(range(-1, 7)))
    blocks.commit_all(1)
    blocks.publish(1, list(range(8)), lambda i: "feature" if i == 1 else None)
    assert len(blocks.seq(1).keys) == 2 and blocks.match(list(range(8)), 8)[0] == []  # its first block is missing
    off = BlockManager(4, 4)
    filled(off, 1, list(range(8)))
    assert off.match(list(range(8)), 8) == ([], []) and off.pool.num_cached == 0


def shared_prefix_requests(vocab: int, n: int = 8, prefix: int = 22, seed: int = 7) -> list[Request]:
    """A common prefix (a system prompt) and a short distinct question each."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, vocab, (prefix,), generator=g).tolist()
    return [Request(f"r{i}", system
                    + torch.randint(3, vocab, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist(),
                    max_tokens=int(torch.randint(4, 13, (1,), generator=g)),
                    slo=SLO(tpot_ms=[20.0, 50.0, 150.0][i % 3]))
            for i in range(n)]


def feature_draft(target: str, tmp_path):
    from tests.unit.test_draft import tiny_draft

    return our_model(tiny_draft(target, tmp_path, train_steps=2, kind="eagle3")[0])


@pytest.mark.parametrize("policy, draft, num_blocks", [
    ("adaserve", "self", 256), ("continuous", None, 256), ("sarathi", None, 20),  # 20: evictions and preemptions
    ("adaserve", "feature", 256), ("adaserve", "feature", 20), ("spec:3", "self", 256),
])
def test_requests_sharing_a_prefix_reuse_its_blocks_and_greedy_stays_exact(policy, draft, num_blocks, tmp_path):
    target = tiny_checkpoint("llama")
    model = our_model(target)
    drafter = {"self": model, "feature": feature_draft(target, tmp_path) if draft == "feature"
               else None, None: None}[draft]
    config = small_config(policy, num_blocks)
    engine = Engine(config, target=model, draft=drafter, eos_token_ids=[EOS])
    reqs = shared_prefix_requests(model.spec.vocab_size)
    got = run_staggered(engine, reqs)
    for r in reqs:
        assert got[r.request_id] == reference(target, r), r.request_id
    stats = engine.scheduler.prefix_stats
    assert stats.hit >= 4 * 5, stats  # most late arrivals skip at least one block of the system prompt
    assert_all_blocks_free(engine)

    off = dataclasses.replace(config, target_cache=dataclasses.replace(config.target_cache, prefix_caching=False))
    engine = Engine(off, target=model, draft=drafter, eos_token_ids=[EOS])
    assert run_staggered(engine, reqs) == got and engine.scheduler.prefix_stats.hit == 0


def test_a_waiting_request_is_predicted_with_the_prefill_its_cached_prefix_saves():
    """First-token predictions for waiting requests count only what the prefix cache does not hold, so
    a request whose prompt is mostly cached is not refused as if it had to prefill all of it."""
    from adaserve_backend.config import SchedulerConfig
    from adaserve_backend.scheduler.policies import make_policy
    from adaserve_backend.scheduler.scheduler import Scheduler
    from adaserve_backend.sequence import Sequence
    from tests.unit.test_scheduler import SPEC, START, TableEstimator, decoding, running, seq

    def waiting_request(cached: bool):
        est = TableEstimator({1: 0.05, 2: 0.08}, prefill_token_s=0.1)  # 17 prompt tokens: 1.7 s > the 1 s target
        blocks = BlockManager(64, 4, prefix_caching=True)
        prompt = list(range(3, 19)) + [99]
        if cached:
            filled(blocks, 10**6, prompt[:16])  # an earlier request's 16 tokens, now idle in the cache
            blocks.free(10**6)
        sched = Scheduler(SchedulerConfig(prefill_chunk=256, overload="reject"), SPEC,
                          make_policy("adaserve"), est, blocks, None)
        decoding(running(sched, seq(60))[0], 10, 0.6)  # on track at 50 ms per token, not at 92: it holds admissions
        s = Sequence(Request("w", prompt, max_tokens=4), 777, SLO(100.0, 1000.0), START, frozenset(), None, len(prompt))
        sched.add(s)
        return sched.schedule(START).rejected, s

    rejected, _ = waiting_request(cached=False)
    assert [s.request.request_id for s, _ in rejected] == ["w"]
    rejected, s = waiting_request(cached=True)
    assert not rejected and s.cached_prefix == 16


def test_each_output_reports_the_prompt_tokens_the_cache_served():
    """usage.prompt_tokens_details.cached_tokens: a prompt seen before reports its cached blocks' tokens
    (whole 4-token blocks here), a new one none."""
    from tests.engines import make_engine

    target = tiny_checkpoint("llama")
    engine = make_engine(target, target, "adaserve")
    prompt = list(range(5, 23))  # 18 tokens: four whole blocks
    cached = {}
    for rid in ("first", "again"):
        engine.add_request(Request(rid, prompt, max_tokens=2))
        for o in engine.drain():
            cached[o.request_id] = o.num_cached_tokens
    assert cached["first"] == 0 and cached["again"] == 16
