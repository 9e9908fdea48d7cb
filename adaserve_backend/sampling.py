"""Sampling parameters and the one place logits become a token choice."""

from __future__ import annotations

import torch

from .request import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the target samples from ([..., V] float32) after temperature, top-k, top-p."""
    # Shifted by the maximum first (softmax does not change): a tiny temperature then sends the others to
    # -inf instead of the maximum to inf, whose inf - inf made the whole distribution NaN.
    logits = logits.float()
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """argmax for greedy requests, else one sample from `target_probs`, drawn where `generator` lives."""
    if params.greedy:
        return int(torch.argmax(logits))
    if generator is not None and logits.device != generator.device:
        logits = logits.to(generator.device)
    return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))
