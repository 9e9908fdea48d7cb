"""What the target teaches: its own continuations of the prompts, and at every position of those
sequences its next-token distribution (top-k) and its final hidden state (the draft's input feature)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm import tqdm

from adaserve_backend.attention.dense import DenseCausalBackend
from adaserve_backend.config import CacheConfig, EngineConfig, SchedulerConfig
from adaserve_backend.engine import Engine
from adaserve_backend.models.llama import LlamaModel
from adaserve_backend.request import Request, SamplingParams


def continuations(
    target: LlamaModel, prompts: Sequence[list[int]], max_tokens: int, temperatures: Sequence[float], eos_ids,
    batch: int = 32, seed_offset: int = 0,
) -> list[list[int]]:
    """The target's own outputs for every prompt, generated with continuous batching (prompt i
    sampled with seed seed_offset + i)."""
    cfg = EngineConfig(
        target_cache=CacheConfig(memory_mb=2048),
        scheduler=SchedulerConfig(policy="continuous", max_num_seqs=batch, prefill_chunk=2048),
    )
    engine = Engine(cfg, target=target, eos_token_ids=eos_ids)
    for i, (ids, temp) in enumerate(zip(prompts, temperatures)):
        engine.add_request(Request(str(i), ids, max_tokens=max_tokens,
                                   sampling=SamplingParams(temperature=temp, seed=seed_offset + i)))
    out: dict[str, list[int]] = {}
    with tqdm(total=len(prompts), desc="target continuations") as bar:
        for o in engine.drain():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            bar.update(int(o.finished))
    return [out.get(str(i), []) for i in range(len(prompts))]


def padded_batch(seqs: Sequence[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] right-padded ids and the [B, T] mask of real tokens."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return ids, mask


def dense_run(model: LlamaModel, ids: torch.Tensor,
              features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced (final hidden states [B, T, H], features a draft reads [B, T, F]: LlamaModel.run)
    for right-padded ids [B, T] (differentiable); features [B, T, F] for a feature-conditioned model."""
    b, t = ids.shape
    attn = DenseCausalBackend(b, t)
    flat = None if features is None else features.reshape(b * t, -1)
    hidden, feats = model.run(ids.reshape(-1), attn.positions(ids.device), attn, flat)
    return hidden.view(b, t, -1), feats.view(b, t, -1)


def dense_hidden(model: LlamaModel, ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
    """Teacher-forced final hidden states [B, T, H] (dense_run's first)."""
    return dense_run(model, ids, features)[0]


def dense_head(model: LlamaModel, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of hidden states [B, T, H]."""
    return model.compute_logits(hidden.flatten(0, 1)).view(*hidden.shape[:2], -1)


def dense_logits(model: LlamaModel, ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
    """Teacher-forced logits [B, T, V] for right-padded ids [B, T] (differentiable)."""
    return dense_head(model, dense_hidden(model, ids, features))


def shifted(features: torch.Tensor) -> torch.Tensor:
    """A feature-conditioned draft's inputs [B, T, H]: token i reads the target's feature at i-1."""
    return torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)


@torch.inference_mode()
def teacher_data(target: LlamaModel, seqs: Sequence[list[int]], k: int, batch_tokens: int = 4096,
                 desc: str = "teacher distributions") -> list[tuple[torch.Tensor, ...]]:
    """Per sequence: (ids [T, k] int32, log-probs [T, k] float16) of the target's top-k next tokens,
    and its features [T, feature_size] in bfloat16 (what a draft reads: LlamaModel.run)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    result: list = [None] * len(seqs)
    bar = tqdm(total=sum(len(s) for s in seqs), desc=desc, unit="tok")
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= batch_tokens:
            end += 1
        chunk = [order[i] for i in range(start, end)]
        ids, _ = padded_batch([seqs[i] for i in chunk])
        hidden, feats = dense_run(target, ids)
        logp = torch.log_softmax(target.compute_logits(hidden.flatten(0, 1)), dim=-1).view(*ids.shape, -1)
        top = torch.topk(logp, k, dim=-1)
        for row, i in enumerate(chunk):
            n = len(seqs[i])
            result[i] = (top.indices[row, :n].to(torch.int32), top.values[row, :n].to(torch.float16),
                         feats[row, :n].to(torch.bfloat16).clone())
        bar.update(sum(len(seqs[i]) for i in chunk))
        start = end
    bar.close()
    return result
