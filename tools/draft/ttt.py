"""Training-time test (EAGLE-3): the draft unrolled for several steps over whole sequences at once, each
step fed the draft's own previous output, so training sees what a tree of that depth sees.

Row i of step j stands for the depth-j tree node whose chain ends at position i: it reads token i+j
at position i+j, and as feature the draft's step-(j-1) output at row i (step 0 reads the target's
taps at i-1). It attends to what the node attends to when serving: the chain (step 0's keys at rows
<= i, which the draft cache holds) and its own ancestors (the keys of steps 1..j at row i). Its output
predicts token i+j+1, scored against the target's distribution at position i+j.

Deeper steps may start at a row `start`: only rows whose chains reach the outputs are trained there
(serving drafts deep nodes after the prompt's last token, never inside it), which skips most of a
long prompt's rows at every step but the first (the first keeps them all: they are the chain's keys).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adaserve_backend.models.feature_draft import FeatureDraft


def shifted_rows(x: torch.Tensor, j: int, first: int = 0) -> torch.Tensor:
    """x[:, i + j] at row i, for rows first..T-1 (zeros past the end): step j's inputs (ids) or
    targets (head rows, probabilities, weights) of the rows it computes."""
    out = x[:, first + j :]
    pad = x.shape[1] - first - out.shape[1]
    return torch.cat([out, x.new_zeros(x.shape[0], pad, *x.shape[2:])], dim=1) if pad else out


def unrolled(draft: FeatureDraft, ids: torch.Tensor, taps: torch.Tensor, steps: int,
             start: int = 0) -> list[torch.Tensor]:
    """Final-norm outputs of steps 0..steps-1: [B, T, H] for step 0, [B, T - start, H] (rows start..T-1)
    for the others. ids [B, T]; taps [B, T, k*H] with row i the target's taps at position i-1 (zeros
    at row 0). Each decoder layer keeps its own keys per step; a layer's feature is the residual stream
    the layer before it left (as in FeatureDraft.run)."""
    assert draft.target_layers, "training-time test is for the EAGLE-3 layout"
    t = ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
    cache = [([], []) for _ in draft.layers]  # per layer: keys and values of steps 0..j
    outs = []
    x = draft.fuse(taps, draft.embed_tokens.weight.dtype)
    for j in range(steps):
        first = 0 if j == 0 else start
        if j == 1:
            x = x[:, start:]
        emb = draft.embed_tokens(shifted_rows(ids, j, first))
        positions = (torch.arange(first, t, device=ids.device) + j).clamp(max=draft.max_len - 1).repeat(ids.shape[0])
        cos, sin = draft.rope(positions, emb.dtype)
        for layer, (keys, values) in zip(draft.layers, cache):
            att = _tree_attention(draft.spec, layer, emb, x, cos, sin, keys, values, causal[first:])
            x = x + layer.o_proj(att)
            x = x + layer.mlp(x)
        outs.append(draft.norm(x))
    return outs


def _tree_attention(s, layer, emb, x, cos, sin, keys: list, values: list, causal: torch.Tensor) -> torch.Tensor:
    """One layer's attention for one step's rows [B, rows, H]: each row reads the chain (step 0's keys
    at rows <= its own) and its own ancestors (the keys of steps 1..j at its row); appends its keys."""
    b, rows, _ = x.shape
    q, k, v = layer.qkv(layer.fused_inputs(emb, x).flatten(0, 1), cos, sin)
    rep = s.num_heads // s.num_kv_heads
    q = q.view(b, rows, s.num_heads, s.head_dim).transpose(1, 2)  # [B, heads, rows, D]
    keys.append(k.view(b, rows, s.num_kv_heads, s.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1))
    values.append(v.view(b, rows, s.num_kv_heads, s.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1))
    scale, t = s.head_dim**-0.5, keys[0].shape[2]
    chain = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, h, rows, T]
    own = [(q * km).sum(-1, keepdim=True) * scale for km in keys[1:]]  # ancestors and itself
    probs = torch.softmax(torch.cat([chain, *own], dim=-1).float(), dim=-1).to(q.dtype)
    att = probs[..., :t] @ values[0]
    for m, vm in enumerate(values[1:]):
        att = att + probs[..., t + m : t + m + 1] * vm
    return att.transpose(1, 2).reshape(b, rows, -1)


class SoftTargets:
    """The target's top-k distributions restricted to the draft's head and renormalised, as head rows."""

    def __init__(self, head_vocab: list[int], vocab_size: int) -> None:
        self.index = torch.full((vocab_size,), -1, dtype=torch.long)
        self.index[torch.tensor(head_vocab)] = torch.arange(len(head_vocab))

    def __call__(self, top_ids: torch.Tensor, top_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(head rows [.., k], probabilities [.., k]) of top-k ids and log-probs."""
        rows = self.index[top_ids.long()]
        p = torch.softmax(top_logp.float().masked_fill(rows < 0, float("-inf")), dim=-1).nan_to_num(0.0)
        return rows.clamp(min=0), p


def step_loss(draft: FeatureDraft, hidden: torch.Tensor, rows: torch.Tensor, p: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted soft cross-entropy, hits, count) of one step: hidden [B, T, H]; rows/p [B, T, k] the
    targets of each row; weight [B, T] (0 where the row has no target). Hits count rows whose argmax
    is the target's own choice (its top-1, when the head has it)."""
    logq = F.log_softmax(draft.lm_head(hidden).float(), dim=-1)
    ce = -(p * logq.gather(-1, rows)).sum(-1)
    counted = weight > 0
    hits = ((logq.argmax(-1) == rows[..., 0]) & (p[..., 0] > 0) & counted).sum()
    return (ce * weight).sum() / weight.sum().clamp(min=1e-6), hits, counted.sum()
