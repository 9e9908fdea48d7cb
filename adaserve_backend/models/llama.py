"""A Llama-family decoder (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5) over a paged KV cache.

One forward serves prefill, draft beam steps and tree verification: it takes the flattened new tokens
of many sequences with their positions, and leaves who-sees-whom to the planned attention backend.
Q/K/V and gate/up projections are fused into one matmul each (fewer, larger GEMMs on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.backend import AttentionBackend
from .fused_layer import decoder_layer_ops, fused_stack, run_layers
from .linear import Linear, prepack_all


@dataclass(frozen=True)
class LlamaSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None
    hidden_act: str

    @classmethod
    def from_hf_config(cls, config) -> "LlamaSpec":
        heads = config.num_attention_heads
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", True) is False:  # Qwen2 ships a window it does not use
            window = None
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=window,
            hidden_act=config.hidden_act,
        )


def rope_tables(config, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, head_dim] in float32, computed by transformers' own RoPE initialisers so every
    scaling variant (linear, llama3, yarn, longrope, ...) matches the reference exactly."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * rotary.inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/signed_sin [T, 1, D]. The rotate-half convention of transformers,
    x * cos + cat(-x2, x1) * sin, computed as x * cos + cat(x2, x1) * cat(-sin, sin): the same products
    bit for bit (negation is exact), with one flip instead of two slices, a negation and a cat."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    return x * cos + swapped * signed_sin


class DecoderLayer(nn.Module):
    def __init__(self, spec: LlamaSpec, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> None:
        super().__init__()
        self.spec = spec
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.qkv_proj = Linear(spec.hidden_size, q + 2 * kv, bias=qkv_bias)
        self.o_proj = Linear(q, spec.hidden_size, bias=o_bias)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=mlp_bias)
        self.act = {"silu": F.silu, "gelu": F.gelu}[spec.hidden_act]

    def forward(self, layer: int, x, cos, sin, attn: AttentionBackend) -> torch.Tensor:
        q, k, v = self.qkv(self.input_layernorm(x), cos, sin)
        x = x + self.o_proj(attn.forward(layer, q, k, v).reshape(x.shape[0], -1))
        return x + self.mlp(x)

    def qkv(self, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries [T, heads, D], keys and values [T, kv_heads, D] of normed inputs h."""
        s = self.spec
        qk, v = self.qkv_proj(h).split([(s.num_heads + s.num_kv_heads) * s.head_dim,
                                        s.num_kv_heads * s.head_dim], dim=-1)
        # Queries and keys rotate together: one set of kernels for both instead of two.
        qk = apply_rope(qk.view(-1, s.num_heads + s.num_kv_heads, s.head_dim), cos, sin)
        q, k = qk.split([s.num_heads, s.num_kv_heads], dim=1)
        return q, k, v.view(-1, s.num_kv_heads, s.head_dim)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class LlamaModel(nn.Module):
    """head_vocab: token ids the output head covers (a draft proposing only frequent tokens); logits
    row j is token head_vocab[j]. None: the full vocabulary.

    forward returns the final-norm hidden state of every token: the input of the output head, and the
    feature a feature-conditioned draft (models/feature_draft.py) reads from the target."""

    takes_features = False  # whether forward needs a feature vector per token besides its id
    # Layers whose input `run` returns as features (set on a target serving an EAGLE-3 draft).
    feature_layers: tuple[int, ...] = ()
    layer_ops = None  # the C++ decoder-layer ops (fused_layer.py) once placed where they apply

    def __init__(
        self,
        spec: LlamaSpec,
        hf_config,
        state_dict: dict[str, torch.Tensor],
        max_len: int,
        head_vocab: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.vocab_ids = None if head_vocab is None else torch.tensor(head_vocab, dtype=torch.long)
        has = lambda suffix: f"model.layers.0.{suffix}" in state_dict  # noqa: E731
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, has("self_attn.q_proj.bias"), has("self_attn.o_proj.bias"), has("mlp.gate_proj.bias"))
            for _ in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size if head_vocab is None else len(head_vocab), bias=False)
        self.max_len = max_len
        # Plain attributes, not buffers: the tables stay float32 whatever dtype the weights take.
        self.rope_cos, sin = rope_tables(hf_config, max_len)
        half = sin.shape[-1] // 2
        self.rope_signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # see apply_rope
        self._load(state_dict)

    def place(self, device: torch.device | str, dtype: torch.dtype) -> "LlamaModel":
        self.to(device=device, dtype=dtype)
        self.rope_cos, self.rope_signed_sin = self.rope_cos.to(device), self.rope_signed_sin.to(device)
        if self.vocab_ids is not None:
            self.vocab_ids = self.vocab_ids.to(device)
        prepack_all(self)
        self.layer_ops = decoder_layer_ops(self)
        return self

    @torch.no_grad()
    def _load(self, sd: dict[str, torch.Tensor]) -> None:
        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"checkpoint lacks {name}")
            return sd[name]

        def cat(*names: str) -> torch.Tensor:
            return torch.cat([take(n) for n in names], dim=0)

        self.embed_tokens.weight.copy_(take("model.embed_tokens.weight"))
        self.norm.weight.copy_(take("model.norm.weight"))
        own_head = "lm_head.weight" in sd and not self.spec.tie_word_embeddings
        head_name = "lm_head.weight" if own_head else "model.embed_tokens.weight"
        head = take(head_name)
        if self.vocab_ids is not None and head.shape[0] != len(self.vocab_ids):
            head = head[self.vocab_ids]
        self.lm_head.weight.copy_(head)
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            layer.input_layernorm.weight.copy_(take(p + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(take(p + "post_attention_layernorm.weight"))
            layer.qkv_proj.weight.copy_(cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"))
            if layer.qkv_proj.bias is not None:
                layer.qkv_proj.bias.copy_(cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"))
            layer.o_proj.weight.copy_(take(a + "o_proj.weight"))
            if layer.o_proj.bias is not None:
                layer.o_proj.bias.copy_(take(a + "o_proj.bias"))
            layer.gate_up_proj.weight.copy_(cat(m + "gate_proj.weight", m + "up_proj.weight"))
            if layer.gate_up_proj.bias is not None:
                layer.gate_up_proj.bias.copy_(cat(m + "gate_proj.bias", m + "up_proj.bias"))
            layer.down_proj.weight.copy_(take(m + "down_proj.weight"))
            if layer.down_proj.bias is not None:
                layer.down_proj.bias.copy_(take(m + "down_proj.bias"))

    def embed(self, input_ids: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
        features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids, positions: [T]; features: [T, feature_size] for models that take them. Returns
        final-norm hidden states [T, hidden]."""
        return self.run(input_ids, positions, attn, features)[0]

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
        features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-norm hidden states [T, hidden], the features a feature-conditioned draft reads for
        these tokens [T, feature_size]): the residual stream entering each of `feature_layers`,
        concatenated (an EAGLE-3 draft), or the final hidden states when there are none."""
        x = self.embed(input_ids, features)
        cos, sin = self.rope(positions, x.dtype)
        if self.layer_ops is not None and (stack := fused_stack(self)) is not None:
            return run_layers(self, self.layer_ops, stack, x, cos, sin, attn)
        taps = []
        for i, layer in enumerate(self.layers):
            if i in self.feature_layers:
                taps.append(x)
            x = layer(i, x, cos, sin, attn)
        hidden = self.norm(x)
        return hidden, (torch.cat(taps, dim=-1) if taps else hidden)

    @property
    def feature_size(self) -> int:
        """Width of the features `run` returns."""
        return self.spec.hidden_size * max(len(self.feature_layers), 1)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.rope_cos.index_select(0, positions).to(dtype)[:, None, :]
        sin = self.rope_signed_sin.index_select(0, positions).to(dtype)[:, None, :]
        return cos, sin

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        if hidden.device.type == "cpu" and hidden.dtype == torch.float32 and rows > 1 and rows % 4:
            # The CPU float32 GEMM falls off its fast path for row counts that are not a multiple of 4;
            # padding the rows is cheaper than the slow path (evidence: docs/architecture.md#the-model-runtime).
            hidden = torch.cat([hidden, hidden.new_zeros(4 - rows % 4, hidden.shape[1])])
        return self.lm_head(hidden)[:rows].float()
