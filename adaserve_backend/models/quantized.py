"""A GGUF's Q4_1 weights served as they are shipped: the decoder layers' projections read 4-bit blocks
(5 bits a weight with their scales) instead of the dequantized bfloat16 copy (16 bits), and
csrc/q4_gemm.h turns them into bfloat16 in registers, exactly as the loader's dequantization rounds
them, so `dtype: q4_1` computes what `bfloat16` computes, a decode step from fewer bytes.

Q4_1 (ggml): blocks of 32 weights along a row, each d (float16), m (float16) and 16 bytes of nibbles,
weight i = d * q_i + m, byte i holding q_i (low nibble) and q_{i+16} (high nibble). The kernel's layout
(pack_q4_1) takes 16 output columns and one 32-weight block at a time: their 16 d and 16 m (float16),
then for each of the 16 k pairs one byte per column holding q_{2p} (low) and q_{2p+1} (high): 320 bytes
per 512 weights, one 16-byte load per VDPBF16PS operand.
"""

from __future__ import annotations

import numpy as np
import torch

Q4_1_BYTES = 20  # per 32 weights: d, m (float16) and 16 bytes of nibbles
PROJECTIONS = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
               "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives attn_q / attn_k (rotary halves interleaved), as
    transformers undoes it for the dequantized tensors; rows stay whole, so it applies to blocks too."""
    dim = rows.shape[0] // heads // 2
    return rows.reshape(heads, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def q4_1_rows(gguf_path: str, spec) -> list[dict[str, np.ndarray]]:
    """Per layer, each projection's Q4_1 rows as stored ([out, in / 32 * 20] bytes), q/k/v and
    gate/up concatenated as the model fuses them. Raises ValueError if any projection is not Q4_1."""
    from gguf import GGMLQuantizationType, GGUFReader

    tensors = {t.name: t for t in GGUFReader(gguf_path).tensors}
    heads = {"attn_q": spec.num_heads, "attn_k": spec.num_kv_heads}
    layers = []
    for i in range(spec.num_layers):
        layer = {}
        for proj, names in PROJECTIONS.items():
            parts = []
            for name in names:
                t = tensors.get(f"blk.{i}.{name}.weight")
                if t is None or t.tensor_type != GGMLQuantizationType.Q4_1:
                    kind = "missing" if t is None else t.tensor_type.name
                    raise ValueError(f"dtype q4_1 needs Q4_1 projections; blk.{i}.{name}.weight is {kind} in {gguf_path}")
                rows = np.asarray(t.data, dtype=np.uint8)
                parts.append(unpermute_rows(rows, heads[name]) if name in heads else rows)
            layer[proj] = np.concatenate(parts)
        layers.append(layer)
    return layers


def pack_q4_1(rows: np.ndarray) -> torch.Tensor:
    """Q4_1 rows [out, in / 32 * 20] -> the kernel's layout [out / 16, in / 32, 320] (uint8)."""
    out = rows.shape[0]
    if out % 16:
        raise ValueError(f"q4_1 packing needs output columns in whole blocks of 16, got {out}")
    blocks = rows.reshape(out, -1, Q4_1_BYTES)
    nb = blocks.shape[1]
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [out, nb, 32], q_0 .. q_31
    pairs = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # [out, nb, 16]: pair p of each column

    def by_block(a: np.ndarray) -> np.ndarray:  # [out, nb, c] -> [out / 16, nb, c, 16] (columns last)
        return a.reshape(out // 16, 16, nb, a.shape[-1]).transpose(0, 2, 3, 1)

    d = by_block(blocks[..., 0:2].copy().view(np.uint16)).reshape(out // 16, nb, 16).copy().view(np.uint8)
    m = by_block(blocks[..., 2:4].copy().view(np.uint16)).reshape(out // 16, nb, 16).copy().view(np.uint8)
    nibbles = by_block(pairs).reshape(out // 16, nb, 256)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate([d, m, nibbles], axis=-1)))


def serve_q4_1(model, gguf_path: str) -> None:
    """Give every decoder projection of a placed bfloat16 `model` its Q4_1 blocks (Linear._q4), read from
    the GGUF it was loaded from, for the products of few rows (decode). The bfloat16 packings stay for
    more rows (trees, prefill), where dequantizing costs more than the bytes it saves: they hold the
    same values, so every row count computes what `bfloat16` computes."""
    from . import linear

    ops = linear.kernels()
    if ops is None or not ops.pair_gemm:
        raise ValueError("dtype q4_1 needs the C++ kernels on a CPU with AVX512-BF16")
    for layer, rows in zip(model.layers, q4_1_rows(gguf_path, model.spec)):
        for proj, data in rows.items():
            getattr(layer, proj)._q4 = pack_q4_1(data)
    linear.pack_generation += 1  # caches over the packings (fused_layer.fused_stack) gather them anew
