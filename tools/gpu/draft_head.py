"""An EAGLE-3-style draft head at Llama-3.1-8B's width with random weights, and its beam step, for timing
where no checkpoint can be carried (the shapes are a real head's, so the times stand for its).

The head, as EAGLE-3 builds it: the target's token embedding (all 128,256 rows: a step gathers one row
per token) and the previous hidden state, each RMS-normed and concatenated, so the one decoder layer's
QKV projection takes 2 x hidden inputs; attention over the head's own paged KV cache; O, RMSNorm, SwiGLU
MLP with the hidden state as the residual; a final norm and an output head over the reduced draft
vocabulary (32,000 rows), whose ids map back to the target's through EAGLE-3's d2t offsets. A beam step
keeps the top w of each row's log-probabilities (w = the beam width), as beam scores add them up.

`step` reads only its arguments and the weights and returns fresh tensors, so the same call runs eagerly
and inside a CUDA graph (its inputs then static tensors); attention is a callable (q, k, v) -> output that
writes k and v into the cache first, so eager backends and a graph-mode wrapper plug in alike."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tools.gpu.decoder_stack import rms_norm, rotate
from tools.gpu.points import SHAPE

DRAFT_VOCAB = 32000  # EAGLE-3's reduced draft vocabulary for Llama-3.1-8B

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RandomDraftHead:
    """One decoder layer with a 2 x hidden QKV input, the embedding table and the draft-vocabulary head."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, seed: int = 0, max_pos: int = 8192,
                 device="cuda") -> None:
        s = SHAPE
        self.dtype, self.device = dtype, device
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*shape):
            return torch.randn(*shape, generator=gen, dtype=dtype, device=device) * 0.02

        def ones():
            return torch.ones(s["hidden"], dtype=dtype, device=device)

        hidden, inter, D = s["hidden"], s["intermediate"], s["head_dim"]
        q, kv = s["heads"] * D, s["kv_heads"] * D
        self.embed = w(s["vocab"], hidden)  # the target's table: a step reads only its rows
        self.weights = dict(embed_norm=ones(), hidden_norm=ones(), qkv=w(q + 2 * kv, 2 * hidden), o=w(hidden, q),
                            ln2=ones(), gate_up=w(2 * inter, hidden), down=w(hidden, inter), norm=ones(),
                            lm_head=w(DRAFT_VOCAB, hidden))
        self.d2t = torch.zeros(DRAFT_VOCAB, dtype=torch.long, device=device)  # draft id -> target id offset
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
        freqs = torch.arange(max_pos, dtype=torch.float32, device=device)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights every step reads whole (the embedding table aside: one row per token)."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def bytes_read(self, tokens: int) -> int:
        """Weights, embedding rows and d2t entries one step of `tokens` rows reads (KV aside)."""
        row = self.embed.shape[1] * self.embed.element_size()
        return self.weight_bytes + tokens * (row + self.d2t.element_size())

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend,
             width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One beam step for T rows: tokens [T] (target ids), hidden [T, hidden] (each row's parent state),
        positions [T]. Returns the new hidden states [T, hidden] (the next step's input), and per row the
        top-`width` log-probabilities [T, width] and target token ids [T, width]."""
        s, w = SHAPE, self.weights
        heads, kv_heads, D = s["heads"], s["kv_heads"], s["head_dim"]
        x = torch.cat([rms_norm(F.embedding(tokens, self.embed), w["embed_norm"]),
                       rms_norm(hidden, w["hidden_norm"])], dim=-1)
        qk, v = F.linear(x, w["qkv"]).split([(heads + kv_heads) * D, kv_heads * D], dim=-1)
        cos = self.cos.index_select(0, positions)[:, None, :]
        sin = self.sin.index_select(0, positions)[:, None, :]
        q, k = rotate(qk.view(-1, heads + kv_heads, D), cos, sin).split([heads, kv_heads], dim=1)
        a = attend(q, k, v.view(-1, kv_heads, D))
        h = hidden + F.linear(a.reshape(tokens.shape[0], -1), w["o"])
        gate, up = F.linear(rms_norm(h, w["ln2"]), w["gate_up"]).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, w["down"])
        logits = F.linear(rms_norm(h, w["norm"]), w["lm_head"])
        scores, ids = logits.float().log_softmax(dim=-1).topk(width, dim=-1)
        return h, scores, ids + self.d2t[ids]
