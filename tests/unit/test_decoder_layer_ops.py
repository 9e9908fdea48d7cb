"""The C++ decoder-layer ops (models/csrc/decoder_layer.cpp) against the Python layer they replace for
CPU bfloat16: every elementwise op rounds where torch rounds (SiLU over all 65536 bfloat16 inputs,
rotary embedding, residual adds bit for bit; the norm up to the order of its sum of squares), and whole
forwards of tiny Llama and Qwen2 (biases) checkpoints agree, their EAGLE-3 taps included."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from adaserve_backend.config import CacheConfig, ModelConfig
from adaserve_backend.model_runner import ModelRunner, SeqInput
from adaserve_backend.models import linear, load_model
from adaserve_backend.models.fused_layer import fused_stack
from adaserve_backend.models.llama import RMSNorm, apply_rope
from tests.model_fixtures import our_model, tiny_checkpoint

ops = linear.kernels()
pytestmark = pytest.mark.skipif(ops is None, reason="the C++ decoder-layer ops do not build here")
# The fused layers read packed weights: oneDNN's (AVX512-BF16 or AMX) or the pair kernel's alone (AVX2);
# on a CPU with neither every model takes the Python layers and there is nothing to compare.
needs_packing = pytest.mark.skipif(
    ops is None or not (linear.prepacking_available(w := torch.zeros(16, 2, dtype=torch.bfloat16))
                        or linear.pairs_serve_alone(w)),
    reason="no packing of bfloat16 weights on this CPU (neither AVX512-BF16 nor AVX2 with FMA)")


def test_silu_mul_rounds_like_torch_for_every_bfloat16_input():
    gate = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(64, 1024)
    up = torch.randn(64, 1024).bfloat16()
    ours, ref = ops.silu_mul(torch.cat([gate, up], dim=-1)), F.silu(gate) * up
    both_nan = ours.isnan() & ref.isnan()
    assert torch.equal(ours[~both_nan], ref[~both_nan])


@pytest.mark.parametrize("head_dim", [12, 16, 64])  # halves of 6 (scalar), 8 (AVX2 lanes) and 32
def test_rope_in_place_matches_apply_rope(head_dim):
    torch.manual_seed(0)
    tokens, heads = 23, 7
    x = torch.randn(tokens, (heads + 2) * head_dim).bfloat16()
    angles = torch.rand(tokens, head_dim // 2) * 20
    cos = torch.cat([angles.cos()] * 2, dim=-1).bfloat16()
    signed_sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).bfloat16()
    ref = x.clone()
    ref[:, : heads * head_dim] = apply_rope(x[:, : heads * head_dim].view(tokens, heads, head_dim), cos[:, None],
                                            signed_sin[:, None]).reshape(tokens, -1)
    ops.rope_in_place(x, cos, signed_sin, heads, head_dim)
    assert torch.equal(x, ref)  # the two unrotated heads (values) untouched


@pytest.mark.parametrize("dim", [64, 576, 100])
def test_add_rms_norm_matches_the_python_norm(dim):
    torch.manual_seed(0)
    x, residual = (torch.randn(19, dim) * 3).bfloat16(), (torch.randn(19, dim) * 5).bfloat16()
    norm = RMSNorm(dim, 1e-5).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(dim) * 2)
    expected_residual = residual + x
    expected = norm(expected_residual)
    out = ops.add_rms_norm(x, residual, norm.weight.detach(), 1e-5)
    assert torch.equal(residual, expected_residual)
    # Only the order of the float32 sum of squares differs: at most a rare one-ulp bfloat16 change.
    assert (out != expected).float().mean() < 1e-3
    torch.testing.assert_close(out.float(), expected.float(), rtol=8e-3, atol=1e-6)
    assert torch.equal(ops.add_rms_norm(None, expected_residual.clone(), norm.weight.detach(), 1e-5), out)


def forward_both_ways(model, feature_layers=()):
    """Logits and features of a prefill plus a token tree, through the fused ops and the Python layers."""
    rng = random.Random(0)
    prompt = [rng.randrange(model.spec.vocab_size) for _ in range(37)]
    tree = [rng.randrange(model.spec.vocab_size) for _ in range(6)]
    results, ops_ = [], model.layer_ops
    model.feature_layers = tuple(feature_layers)
    try:
        for layer_ops in (ops_, None):
            model.layer_ops = layer_ops
            runner = ModelRunner(model, CacheConfig(block_size=4, memory_mb=8))
            with torch.inference_mode():
                first = runner.forward([SeqInput(0, prompt, num_logits=len(prompt))])
                runner.commit_all(0)
                second = runner.forward([SeqInput(0, tree, [-1, 0, 0, 1, 2, 2], len(tree))])
            results.append((torch.cat([first.logits, second.logits]), torch.cat([first.features, second.features])))
    finally:
        model.layer_ops, model.feature_layers = ops_, ()
    return results


@needs_packing
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fused_forward_matches_the_python_layers(kind):
    model = our_model(tiny_checkpoint(kind), "bfloat16")
    assert model.layer_ops is not None  # bf16 on CPU, prepacked: the fused path applies
    (fused, fused_taps), (python, python_taps) = forward_both_ways(model, feature_layers=(0, 2))
    torch.testing.assert_close(fused, python, rtol=2e-2, atol=2e-2)
    assert (fused.argmax(-1) == python.argmax(-1)).float().mean() > 0.95
    torch.testing.assert_close(fused_taps.float(), python_taps.float(), rtol=2e-2, atol=2e-2)


@needs_packing
def test_eagle3_draft_fused_forward_matches_its_python_layers():
    """The draft's layer after attention through post_attention, against its Python layer: a chain read
    with the target's taps, then a tree fed its own output states (as beam search feeds it)."""
    from adaserve_backend.models.feature_draft import DraftLayout, base_draft

    path = tiny_checkpoint("llama")
    draft = base_draft(DraftLayout(path, layers=[1], head_vocab=list(range(100)),
                                   feature_layers=[0, 1, 2]), max_len=256)
    with torch.no_grad():
        for p in draft.parameters():  # an untrained fusion is zero: make every input matter
            p.add_(torch.randn_like(p) * 0.02)
    draft = draft.place("cpu", torch.bfloat16).eval()
    with torch.inference_mode():
        assert draft.layer_ops is not None and fused_stack(draft) is not None
    rng, h = random.Random(0), draft.spec.hidden_size
    chain, tree = [rng.randrange(100) for _ in range(9)], [rng.randrange(100) for _ in range(4)]
    taps = torch.randn(len(chain), 3 * h)
    results, ops_ = [], draft.layer_ops
    try:
        for layer_ops in (ops_, None):
            draft.layer_ops = layer_ops
            runner = ModelRunner(draft, CacheConfig(block_size=4, memory_mb=8))
            with torch.inference_mode():
                first = runner.forward([SeqInput(0, chain, num_logits=1, features=taps)])
                own = first.features[-1:].repeat(len(tree), 1)
                second = runner.forward([SeqInput(0, tree, [-1, -1, 0, 1], len(tree), own)])
            results.append((torch.cat([first.logits, second.logits]), torch.cat([first.features, second.features])))
    finally:
        draft.layer_ops = ops_
    (fused, fused_states), (python, python_states) = results
    torch.testing.assert_close(fused, python, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fused_states.float(), python_states.float(), rtol=2e-2, atol=2e-2)


@needs_packing
def test_float32_and_training_keep_the_python_layers():
    assert our_model(tiny_checkpoint("llama"), "float32").layer_ops is None  # the exact oracle
    # its own copy: our_model's are shared by every test, and this one changes a weight
    model = load_model(ModelConfig(path=tiny_checkpoint("llama"), dtype="bfloat16", max_model_len=512))
    with torch.enable_grad():
        assert fused_stack(model) is None
    with torch.inference_mode():
        assert fused_stack(model) is not None
    with torch.no_grad():  # an optimizer step after packing: the packed copy is stale
        model.layers[0].down_proj.weight.mul_(2)
    with torch.inference_mode():
        assert fused_stack(model) is None
        linear.prepack_all(model)  # packed again: the stack is gathered anew
        assert fused_stack(model) is not None


@pytest.mark.skipif(ops is None or not ops.pair_gemm, reason="the pair kernel needs AVX512-BF16 or AVX2 with FMA")
@pytest.mark.parametrize("bias", [False, True])
def test_pair_kernel_matches_a_float32_product_for_every_row_count(bias):
    """pair_linear against x W^T in float32 then rounded once: row counts across its 4-row tiles and
    column counts across its 4-block groups, with and without bias; Linear takes it up to the chosen pair_rows, then
    oneDNN."""
    torch.manual_seed(0)
    for k, n in ((64, 16), (96, 80), (576, 960)):
        w, b = torch.randn(n, k).bfloat16(), (torch.randn(n).bfloat16() if bias else None)
        pairs = ops.pack_pairs(w)
        for m in (1, 2, 3, 4, 5, 7, 9, 16, 33):
            x = torch.randn(m, k).bfloat16()
            ref = x.float() @ w.float().T + (b.float() if bias else 0)
            torch.testing.assert_close(ops.pair_linear(x, pairs, b).float(),
                                       ref.bfloat16().float(), rtol=1e-2, atol=1e-2)
    layer = linear.Linear(96, 80, bias=bias).bfloat16()
    layer.prepack()
    assert layer._pairs is not None
    with torch.inference_mode():
        for m in (1, 16, min(ops.kernel_choice()[0] + 1, 64)):
            x = torch.randn(m, 96).bfloat16()
            torch.testing.assert_close(layer(x).float(), F.linear(x.float(), layer.weight.float(), None
                                                                  if layer.bias is None else layer.bias.float()),
                                       rtol=2e-2, atol=2e-2)
    odd = linear.Linear(96, 72).bfloat16()  # 72 columns: not whole blocks of 16, oneDNN alone
    odd.prepack()
    assert odd._pairs is None
