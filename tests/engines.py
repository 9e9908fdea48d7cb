"""Engines over tiny checkpoints for tests, the transformers oracle, and ways to drive them."""

from __future__ import annotations

import torch

from adaserve_backend.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculationConfig
from adaserve_backend.engine import Engine
from adaserve_backend.request import FinishReason, Request
from adaserve_backend.slo import SLO
from tests.model_fixtures import hf_reference, our_model

POLICIES = ["adaserve", "continuous", "sarathi", "priority", "spec:3"]
EOS = 2


def small_config(policy: str, num_blocks: int = 256, max_num_seqs: int = 6, prefill_chunk: int = 8,
                 token_budget: int = 12, **spec) -> EngineConfig:
    """Small caches of 4-token blocks (so block boundaries and preemption happen), small chunks."""
    return EngineConfig(
        target_cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        draft_cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        scheduler=SchedulerConfig(policy=policy, max_num_seqs=max_num_seqs, prefill_chunk=prefill_chunk,
                                  token_budget=token_budget),
        speculation=SpeculationConfig(**{"budget": 24, "draft_budget": 8, "d_max": 4, "w_max": 3, **spec}),
    )


def make_engine(target_path, draft_path, policy, num_blocks=256, tokenizer=None, **spec) -> Engine:
    """An engine over tiny checkpoints (draft_path None: the target drafts for itself), EOS id 2."""
    draft = our_model(draft_path) if draft_path else None
    return Engine(small_config(policy, num_blocks, **spec), target=our_model(target_path),
                  draft=draft, eos_token_ids=[EOS],
                  tokenizer=tokenizer)


def workload(path: str, n: int = 9, seed: int = 0) -> list[Request]:
    vocab = our_model(path).spec.vocab_size
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for i in range(n):
        plen = int(torch.randint(3, 21, (1,), generator=g))
        prompt = torch.randint(3, vocab, (plen,), generator=g).tolist()
        reqs.append(
            Request(
                request_id=f"r{i}",
                prompt_ids=prompt,
                max_tokens=int(torch.randint(4, 17, (1,), generator=g)),
                min_tokens=2 if i % 4 == 0 else 0,
                slo=SLO(tpot_ms=[20.0, 50.0, 150.0][i % 3]),
            )
        )
    return reqs


@torch.no_grad()
def reference(path: str, req: Request) -> list[int]:
    hf = hf_reference(path)
    out = hf.generate(
        torch.tensor([req.prompt_ids]),
        max_new_tokens=req.max_tokens,
        min_new_tokens=req.min_tokens,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )[0, len(req.prompt_ids) :].tolist()
    if EOS in out[req.min_tokens :]:
        out = out[: out.index(EOS, req.min_tokens) + 1]
    return out


def run_staggered(engine: Engine, reqs: list[Request],
                  last_chunks: dict[str, int] | None = None) -> dict[str, list[int]]:
    """Three requests arrive, then two more every iteration. `last_chunks` gets how many tokens each
    request's final iteration emitted."""
    results: dict[str, list[int]] = {}
    finished: dict[str, str] = {}
    pending = list(reqs)
    for r in pending[:3]:
        engine.add_request(r)
    pending = pending[3:]
    while engine.has_work() or pending:
        for r in pending[:2]:
            engine.add_request(r)
        pending = pending[2:]
        for o in engine.step():
            results.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                finished[o.request_id] = o.finish_reason
                if last_chunks is not None:
                    last_chunks[o.request_id] = len(o.new_token_ids)
    assert set(finished) == {r.request_id for r in reqs}
    assert set(finished.values()) <= {FinishReason.STOP, FinishReason.LENGTH}
    return results


def assert_all_blocks_free(engine: Engine) -> None:
    for runner in runners(engine):
        assert runner.blocks.num_free_blocks == runner.blocks.num_blocks


def runners(engine: Engine):
    return [engine.target] + ([engine.draft.runner] if engine.draft else [])
