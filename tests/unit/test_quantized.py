"""GGUF weights served as shipped (models/quantized.py, csrc/block_gemm.h): the kernel computes from Q4_1
and Q8_0 blocks exactly what the bfloat16 path computes from their dequantized copy (gguf-py's, as the
loader's), and the embedded model in `dtype: q4_1` gives the bfloat16 model's logits bit for bit. The
integer-dot kernel (`dtype: q4_1_int8`, csrc/int8_gemm.h) computes its own formula, the same for a row
whatever the rows beside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaserve_backend.models import linear
from adaserve_backend.models.quantized import (
    Q4_1_BYTES,
    Q8_0_BYTES,
    pack_q4_1,
    pack_q4_1_int8,
    pack_q8_0,
    pack_q8_0_int8,
)

ops = linear.kernels()
pytestmark = pytest.mark.skipif(ops is None or not ops.block_gemm, reason="the Q4_1 kernel needs AVX512-BF16")


def random_blocks(kind: str, out: int, inp: int, seed: int = 0) -> np.ndarray:
    """Q4_1 or Q8_0 rows [out, inp / 32 * block bytes], float16 scales (and minima) of a real model's range."""
    rng = np.random.default_rng(seed)
    size = Q4_1_BYTES if kind == "q4_1" else Q8_0_BYTES
    blocks = rng.integers(0, 256, size=(out, inp // 32, size), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.05, size=(out, inp // 32)).astype(np.float16)[..., None].view(np.uint8)
    if kind == "q4_1":
        blocks[..., 2:4] = rng.uniform(-0.4, 0.0, size=(out, inp // 32)).astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(out, -1)


def dequantize(kind: str, rows: np.ndarray) -> np.ndarray:
    """float32 [out, in]: gguf-py's dequantization, the one the loader's bfloat16 weights come from."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(rows, GGMLQuantizationType.Q4_1 if kind == "q4_1" else GGMLQuantizationType.Q8_0)


@pytest.mark.parametrize("kind,pack", [("q4_1", pack_q4_1), ("q8_0", pack_q8_0)])
@pytest.mark.parametrize("out,inp", [(16, 32), (80, 96), (960, 576), (576, 1536)])
def test_block_kernel_equals_the_bfloat16_pair_kernel_on_the_dequantized_weight(kind, pack, out, inp):
    rows = random_blocks(kind, out, inp, seed=out)
    packed = pack(rows)
    pairs = ops.pack_pairs(torch.from_numpy(dequantize(kind, rows)).bfloat16())
    bias = torch.randn(out).bfloat16()
    for m in (0, 1, 2, 5, 9, 16, 37):  # 0: an LM head asked for no logits
        x = torch.randn(m, inp).bfloat16()
        assert torch.equal(ops.block_linear(x, packed, None), ops.pair_linear(x, pairs, None))
        assert torch.equal(ops.block_linear(x, packed, bias), ops.pair_linear(x, pairs, bias))


def int8_formula(kind: str, rows: np.ndarray, x: torch.Tensor) -> np.ndarray:
    """float64: per 32-weight block, d_w d_x sum(q_w q_x) (+ m_w sum(x) for Q4_1), x's 32 values quantized
    to int8 on one scale (max |x| / 127, nearest even), as csrc/int8_gemm.h defines the product."""
    out, nb = rows.shape[0], x.shape[1] // 32
    blocks = rows.reshape(out, nb, -1)
    d_w = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if kind == "q4_1":
        m_w = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        q_w = np.concatenate([blocks[..., 4:] & 0x0F, blocks[..., 4:] >> 4], axis=-1).astype(np.float64)
    else:
        m_w, q_w = np.zeros_like(d_w), blocks[..., 2:].view(np.int8).astype(np.float64)
    xf = x.float().reshape(x.shape[0], nb, 32)
    amax = xf.abs().amax(-1, keepdim=True)
    q_x = torch.round(xf * torch.where(amax > 0, 127 / amax, 0)).double().numpy()
    d_x = (amax / 127).double().numpy()[..., 0]
    return np.einsum("rbk,nbk,nb,rb->rn", q_x, q_w, d_w, d_x) + np.einsum("nb,rb->rn", m_w, xf.double().sum(-1).numpy())


@pytest.mark.skipif(ops is None or not ops.int8_gemm, reason="the integer-dot kernel needs AVX512-VNNI")
@pytest.mark.parametrize("kind,pack", [("q4_1", pack_q4_1_int8), ("q8_0", pack_q8_0_int8)])
@pytest.mark.parametrize("out,inp", [(16, 32), (80, 96), (960, 576), (576, 1536)])
def test_int8_kernel_computes_its_formula_and_a_row_alike_in_any_batch(kind, pack, out, inp):
    rows = random_blocks(kind, out, inp, seed=out)
    packed = pack(rows)
    bias = torch.randn(out).bfloat16()
    x = torch.randn(37, inp).bfloat16()
    x[3] = 0  # a block of zeros has no scale
    whole = ops.int8_linear(x, packed, bias)
    expect = int8_formula(kind, rows, x) + bias.double().numpy()
    assert np.abs(whole.double().numpy() - expect).max() <= 2**-8 * np.abs(expect).max()  # bfloat16's rounding
    for m in (0, 1, 2, 5, 8, 9, 16, 17):  # the tile sizes and their remainders
        assert torch.equal(ops.int8_linear(x[:m], packed, bias), whole[:m])
    assert torch.equal(torch.cat([ops.int8_linear(x[r : r + 1], packed, bias) for r in range(37)]), whole)


def test_packing_refuses_partial_column_blocks():
    for kind, pack in (("q4_1", pack_q4_1), ("q4_1", pack_q4_1_int8), ("q8_0", pack_q8_0), ("q8_0", pack_q8_0_int8)):
        with pytest.raises(ValueError, match="blocks of 16"):
            pack(random_blocks(kind, 24, 32))


def embedded(dtype: str):
    from adaserve_backend.config import EMBEDDED_DEFAULT, ModelConfig
    from adaserve_backend.models import load_model

    return load_model(ModelConfig(path=EMBEDDED_DEFAULT, dtype=dtype, max_model_len=256))


@pytest.fixture(scope="module")
def bfloat16_model():
    return embedded("bfloat16")


@pytest.mark.slow
def test_the_embedded_model_in_q4_1_gives_the_bfloat16_logits(bfloat16_model):
    """Prefill, a decode step and a token tree, through the fused layers, q4_1 against bfloat16."""
    from adaserve_backend.config import CacheConfig
    from adaserve_backend.model_runner import ModelRunner, SeqInput

    outputs = []
    for dtype in ("bfloat16", "q4_1"):
        model = bfloat16_model if dtype == "bfloat16" else embedded(dtype)
        if dtype == "q4_1":
            assert all(layer.down_proj._blocks is not None for layer in model.layers)
            assert model.lm_head._blocks is not None  # the tied embedding's Q8_0 blocks
        runner = ModelRunner(model, CacheConfig(block_size=16, memory_mb=16))
        runner.blocks.reserve(0, 64)
        prompt = list(range(100, 140))
        first = runner.forward([SeqInput(0, prompt, num_logits=3)]).logits
        runner.commit_all(0)
        step = runner.forward([SeqInput(0, [int(first[-1].argmax())])]).logits
        runner.commit_all(0)
        tree = runner.forward([SeqInput(0, [5, 6, 7, 8, 9], [-1, 0, 0, 1, -1], 5)]).logits
        outputs.append(torch.cat([first, step, tree]))
    assert torch.equal(outputs[0], outputs[1])


def test_q4_1_is_for_gguf_targets_only():
    from adaserve_backend.config import EMBEDDED_DRAFT, ModelConfig
    from adaserve_backend.models import load_model

    for dtype in ("q4_1", "q4_1_int8", "q8_0"):
        with pytest.raises(ValueError, match="draft runs in bfloat16"):
            load_model(ModelConfig(path=EMBEDDED_DRAFT, dtype=dtype))
    with pytest.raises(ValueError, match="dtype must be"):
        ModelConfig(dtype="q3_k")


@pytest.mark.slow
def test_the_embedded_model_in_q8_0_computes_its_quantized_values_at_every_row_count():
    """dtype q8_0: the projections and the head become ggml's Q8_0 values (gguf-py's quantizer, as
    llama.cpp's converter writes them); prefill and decode through the blocks equal the bfloat16
    kernels on those values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as deq
    from gguf.quants import quantize

    from adaserve_backend.config import EMBEDDED_DEFAULT, CacheConfig
    from adaserve_backend.model_runner import ModelRunner, SeqInput
    from adaserve_backend.models.loader import read_checkpoint

    model = embedded("q8_0")
    layer = model.layers[3].down_proj
    checkpoint = read_checkpoint(EMBEDDED_DEFAULT)[2]["model.layers.3.mlp.down_proj.weight"]  # float32, as converted
    expect = deq(quantize(checkpoint.float().numpy(), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    assert torch.equal(layer.weight, torch.from_numpy(expect).bfloat16()) and layer._blocks.shape[-1] == 544
    assert model.lm_head._blocks is not None

    def logits(m):
        runner = ModelRunner(m, CacheConfig(block_size=16, memory_mb=16))
        runner.blocks.reserve(0, 64)
        first = runner.forward([SeqInput(0, list(range(100, 140)), num_logits=3)]).logits
        runner.commit_all(0)
        step = runner.forward([SeqInput(0, [int(first[-1].argmax())])]).logits
        return torch.cat([first, step])

    blocked = logits(model)
    for m in [getattr(lyr, p) for lyr in model.layers
              for p in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")] + [model.lm_head]:
        m._blocks = None  # the bfloat16 pair kernel on the same values
    from adaserve_backend.models import linear

    linear.pack_generation += 1
    assert torch.equal(blocked, logits(model))
