"""Sampling parameters and the one place logits become a token choice."""

from __future__ import annotations

from collections import Counter

import torch

from .request import SamplingParams, TokenLogprob


def adjusted(logits: torch.Tensor, params: SamplingParams, counts: Counter) -> torch.Tensor:
    """One position's logits [V] after OpenAI's penalties (`counts`: each token's occurrences in the
    output before this position) and logit_bias; the same rows plain decoding and tree verification
    give, so both choose alike."""
    if not params.adjusts:
        return logits
    logits = logits.float().clone()
    if counts and (params.frequency_penalty or params.presence_penalty):
        ids = torch.tensor(list(counts), device=logits.device)
        n = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
        logits[ids] -= params.frequency_penalty * n + params.presence_penalty
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=logits.device)
        logits[ids] += torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype, device=logits.device)
    return logits


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


def token_logprobs(rows: torch.Tensor, tokens: list[int], params: SamplingParams, top: int) -> list[TokenLogprob]:
    """Each token's log-probability under the distribution its row's choice was made from, and the `top`
    likeliest tokens there: a sampled request's `target_probs` (temperature, top-k, top-p: tokens those
    filters drop are -inf), a greedy request's model distribution (temperature 1, no filters; its argmax
    is the token chosen). Rows are the target's logits at the token's position, the same numbers with or
    without speculation (models/kernel_choice.py), so speculation never changes a logprob."""
    rows = rows.float()
    logp = torch.log_softmax(rows, dim=-1) if params.greedy else torch.log(target_probs(rows, params))
    chosen = logp.gather(-1, torch.tensor(tokens, device=logp.device).unsqueeze(-1)).squeeze(-1).tolist()
    if top:
        values, ids = torch.topk(logp, min(top, logp.shape[-1]), dim=-1)
        alts = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        alts = [()] * len(tokens)
    return [TokenLogprob(t, lp, a) for t, lp, a in zip(tokens, chosen, alts)]
