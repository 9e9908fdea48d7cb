"""A GGUF's quantized weights served as they are shipped: the decoder layers' projections read Q4_1
blocks (5 bits a weight with their scales) and the LM head the embedding's Q8_0 blocks (8.5 bits)
instead of the dequantized bfloat16 copy (16 bits); csrc/block_gemm.h turns them into bfloat16 in
registers, exactly as the loader's dequantization rounds them, so `dtype: q4_1` computes what
`bfloat16` computes, a decode step from fewer bytes. `dtype: q8_0` quantizes every projection and the
LM head at load as llama.cpp's converter does (gguf-py's Q8_0) and swaps the bfloat16 copy for the
dequantized values, so there too every row count computes the same.

ggml's blocks hold 32 weights along a row. Q4_1: d, m (float16) and 16 bytes of nibbles, weight
i = d * q_i + m, byte i holding q_i (low nibble) and q_{i+16} (high nibble). Q8_0: d (float16) and 32
signed bytes, weight i = d * q_i. The kernel's layouts take 16 output columns and one block at a time:
their 16 d (and 16 m), then each of the 16 k pairs p in two halves of 16 lanes, lane i of the low half
holding column i / 2's weight k = 2p + i % 2, the high half's column 8 + i / 2's: widened, each half
is already in the lane order VDPBF16PS wants. Q4_1 keeps a lane's two halves in one byte's two
nibbles (320 bytes per 512 weights), Q8_0 stores them one after the other (544 bytes).
"""

from __future__ import annotations

import numpy as np
import torch

Q4_1_BYTES = 20  # per 32 weights: d, m (float16) and 16 bytes of nibbles
Q8_0_BYTES = 34  # per 32 weights: d (float16) and 32 signed bytes
PROJECTIONS = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
               "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo the row order llama.cpp's converter gives attn_q / attn_k (rotary halves interleaved), as
    transformers undoes it for the dequantized tensors; rows stay whole, so it applies to blocks too."""
    dim = rows.shape[0] // heads // 2
    return rows.reshape(heads, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def q4_1_rows(tensors: dict, spec, gguf_path: str) -> list[dict[str, np.ndarray]]:
    """Per layer, each projection's Q4_1 rows as stored ([out, in / 32 * 20] bytes), q/k/v and
    gate/up concatenated as the model fuses them. Raises ValueError if any projection is not Q4_1."""
    from gguf import GGMLQuantizationType

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
                    raise ValueError(f"dtype q4_1 needs Q4_1 projections; blk.{i}.{name}.weight is {kind} in "
                                     f"{gguf_path}")
                rows = np.asarray(t.data, dtype=np.uint8)
                parts.append(unpermute_rows(rows, heads[name]) if name in heads else rows)
            layer[proj] = np.concatenate(parts)
        layers.append(layer)
    return layers


def head_blocks(tensors: dict, spec, integer: bool = False) -> torch.Tensor | None:
    """The LM head's blocks in the kernel's layout (the embedding's where the head is tied to it; the
    integer-dot kernel's where `integer`), or None where the GGUF stores it in a format the kernel does
    not read."""
    from gguf import GGMLQuantizationType

    t = tensors.get("token_embd.weight" if spec.tie_word_embeddings else "output.weight")
    packers = {GGMLQuantizationType.Q4_1: pack_q4_1_int8 if integer else pack_q4_1,
               GGMLQuantizationType.Q8_0: pack_q8_0_int8 if integer else pack_q8_0}
    if t is None or t.tensor_type not in packers or spec.vocab_size % 16:
        return None
    return packers[t.tensor_type](np.asarray(t.data, dtype=np.uint8))


def column_blocks(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    """GGUF rows [out, in / 32 * block_bytes] -> [out, in / 32, block_bytes]; out must be whole 16s."""
    if rows.shape[0] % 16:
        raise ValueError(f"GGUF block packing needs output columns in whole blocks of 16, got {rows.shape[0]}")
    return rows.reshape(rows.shape[0], -1, block_bytes)


def lane_halves(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-weight values [out, nb, 32] -> the low and high halves [out / 16, nb, 16 pairs, 16 lanes]."""
    out, nb = q.shape[:2]
    q = q.reshape(out // 16, 16, nb, 16, 2).transpose(0, 2, 3, 1, 4)  # [out / 16, nb, p, column, k - 2p]
    return tuple(np.ascontiguousarray(h).reshape(out // 16, nb, 16, 16) for h in (q[:, :, :, :8], q[:, :, :, 8:]))


def block_scales(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block -> [out / 16, nb, 32] bytes, 16 columns a block."""
    out, nb = blocks.shape[:2]
    halves = blocks[..., at:at + 2].copy().view(np.uint16).reshape(out // 16, 16, nb)
    return np.ascontiguousarray(halves.transpose(0, 2, 1)).view(np.uint8)


def q4_1_values(blocks: np.ndarray) -> np.ndarray:
    """Q4_1 blocks [out, nb, 20] -> each weight's 4-bit value q [out, nb, 32], in k order (byte i holds
    q_i in its low nibble, q_{i+16} in its high one)."""
    qs = blocks[..., 4:]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def pack_q4_1(rows: np.ndarray) -> torch.Tensor:
    """Q4_1 rows [out, in / 32 * 20] -> the kernel's layout [out / 16, in / 32, 320] (uint8)."""
    blocks = column_blocks(rows, Q4_1_BYTES)
    low, high = lane_halves(q4_1_values(blocks))
    nibbles = (low | (high << 4)).reshape(*low.shape[:2], 256)
    return torch.from_numpy(np.concatenate([block_scales(blocks, 0), block_scales(blocks, 2), nibbles], axis=-1))


def pack_q4_1_int8(rows: np.ndarray) -> torch.Tensor:
    """Q4_1 rows [out, in / 32 * 20] -> the integer-dot kernel's layout [out / 16, in / 32, 320] (int8:
    the dtype tells the kernels it apart): 16 d, 16 m, then four 64-byte chunks, chunk c's byte 4 i + t
    holding column i's weights k = 4 c + t (low nibble) and 16 + 4 c + t (high nibble)."""
    blocks = column_blocks(rows, Q4_1_BYTES)
    out, nb = blocks.shape[:2]
    q = q4_1_values(blocks).reshape(out // 16, 16, nb, 2, 4, 4)
    q = q.transpose(0, 2, 3, 4, 1, 5)  # [out / 16, nb, half, c, column, t]
    nibbles = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(out // 16, nb, 256)
    packed = np.concatenate([block_scales(blocks, 0), block_scales(blocks, 2), nibbles], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(packed).view(np.int8))


def pack_q8_0_int8(rows: np.ndarray) -> torch.Tensor:
    """Q8_0 rows [out, in / 32 * 34] -> the integer-dot kernel's layout [out / 16, in / 32, 608] (int8):
    16 d, 16 int32 128 sum(q) (the activations' offset to take back), then eight 64-byte chunks, chunk
    j's byte 4 i + t holding column i's weight k = 4 j + t."""
    blocks = column_blocks(rows, Q8_0_BYTES)
    out, nb = blocks.shape[:2]
    q = blocks[..., 2:].view(np.int8).reshape(out // 16, 16, nb, 8, 4).transpose(0, 2, 3, 1, 4)  # [., nb, j, column, t]
    offset = np.ascontiguousarray(128 * q.astype(np.int32).sum(axis=(2, 4)), dtype="<i4")  # [out / 16, nb, column]
    packed = np.concatenate([block_scales(blocks, 0), offset.view(np.uint8),
                             q.reshape(out // 16, nb, 512).view(np.uint8)], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(packed).view(np.int8))


def pack_q8_0(rows: np.ndarray) -> torch.Tensor:
    """Q8_0 rows [out, in / 32 * 34] -> the kernel's layout [out / 16, in / 32, 544] (uint8)."""
    blocks = column_blocks(rows, Q8_0_BYTES)
    low, high = lane_halves(blocks[..., 2:])
    pairs = np.concatenate([low, high], axis=-1).reshape(*low.shape[:2], 512)
    return torch.from_numpy(np.concatenate([block_scales(blocks, 0), pairs], axis=-1))


def serve_q4_1(model, gguf_path: str, integer: bool = False) -> None:
    """Give every decoder projection of a placed bfloat16 `model` its Q4_1 blocks (Linear._blocks), and
    the LM head its blocks where the GGUF's are Q8_0 or Q4_1, read from the GGUF it was loaded from,
    for the products of few rows (decode). The bfloat16 packings stay for more rows (trees, prefill),
    where dequantizing costs more than the bytes it saves: they hold the same values, so every row
    count computes what `bfloat16` computes. `integer` (dtype q4_1_int8): the projections' and the
    head's blocks in the integer-dot layouts instead, which serve every row count (csrc/int8_gemm.h).
    Where the head's format is neither, it stays bfloat16 at every row count."""
    from gguf import GGUFReader

    from . import linear

    ops = linear.kernels()
    if ops is None or not ops.block_gemm or (integer and not ops.int8_gemm):
        needs = "AVX512-VNNI and AVX512-BF16" if integer else "AVX512-BF16"
        raise ValueError(f"dtype {'q4_1_int8' if integer else 'q4_1'} needs the C++ kernels on a CPU with {needs}")
    pack = pack_q4_1_int8 if integer else pack_q4_1
    tensors = {t.name: t for t in GGUFReader(gguf_path).tensors}
    for layer, rows in zip(model.layers, q4_1_rows(tensors, model.spec, gguf_path)):
        for proj, data in rows.items():
            getattr(layer, proj)._blocks = pack(data)
    if model.lm_head.weight.shape[0] == model.spec.vocab_size:  # the whole vocabulary, in the GGUF's order
        model.lm_head._blocks = head_blocks(tensors, model.spec, integer)
    linear.pack_generation += 1  # caches over the packings (fused_layer.fused_stack) gather them anew


def quantize_q8_0(weight: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """A [out, in] weight as ggml's Q8_0 rows and as their dequantized float32 values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rows = quantize(weight.detach().float().numpy(), GGMLQuantizationType.Q8_0)
    return rows, torch.from_numpy(dequantize(rows, GGMLQuantizationType.Q8_0))


def quantize_to_q8_0(model) -> dict:
    """Before `model` is placed (its weights as the checkpoint holds them): every decoder projection and
    the LM head quantized to Q8_0 from those weights, as llama.cpp's converter quantizes the same
    checkpoint, each weight replaced by its dequantized values. Returns {module: Q8_0 rows} for
    `serve_q8_0`. The head is a copy even where tied, so the embedding lookup keeps the loaded values."""
    from . import linear

    ops = linear.kernels()
    if ops is None or not ops.block_gemm:
        raise ValueError("dtype q8_0 needs the C++ kernels on a CPU with AVX512-BF16")
    heads = [model.lm_head] if model.lm_head.weight.shape[0] % 16 == 0 else []
    out = {}
    for m in [getattr(layer, proj) for layer in model.layers for proj in PROJECTIONS] + heads:
        out[m], values = quantize_q8_0(m.weight)
        with torch.no_grad():
            m.weight.copy_(values)
    return out


def serve_q8_0(rows: dict) -> None:
    """After placing: each quantized module's blocks (Linear._blocks) for the products of few rows; its
    bfloat16 packings hold the same values for more rows."""
    from . import linear

    for m, data in rows.items():
        m._blocks = pack_q8_0(data)
    linear.pack_generation += 1
