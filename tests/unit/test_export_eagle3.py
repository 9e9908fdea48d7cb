"""tools.draft.export_eagle3: our EAGLE-3 draft as a published-layout checkpoint. A reference forward
written here from the EAGLE-3 layout alone (the way llama.cpp's and vLLM's eagle3 drafts compute it:
separate q/k/v, rotate-half RoPE from the config, [input_layernorm(embedding), hidden_norm(feature)]
into attention, the raw feature as residual, final norm, d2t back to target ids) must reproduce our
draft's logits over the target vocabulary and the state it feeds back as the next feature."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from adaserve_backend.models.feature_draft import DraftLayout, base_draft, save_draft, trained_draft
from tests.model_fixtures import tiny_checkpoint
from tests.unit.test_draft import tiny_draft
from tools.draft.export_eagle3 import export
from tools.draft.teacher import dense_run


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def reference(ckpt: dict, cfg: dict, embed: torch.Tensor, ids: torch.Tensor, taps: torch.Tensor):
    """(logits over the target vocabulary [T, V] with -inf off the draft vocabulary, pre-norm output
    [T, H]) of one sequence: ids [T], taps [T, k*H] (row i: the target's taps at position i-1)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    eps, d = cfg["rms_norm_eps"], cfg["head_dim"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {k: v.float() for k, v in ckpt.items()}
    m = lambda name: w[f"midlayer.{name}.weight"]  # noqa: E731
    t = ids.shape[0]
    g = taps @ w["fc.weight"].T
    x = torch.cat([rms(embed[ids], m("input_layernorm"), eps), rms(g, m("hidden_norm"), eps)], dim=-1)
    q = (x @ m("self_attn.q_proj").T).view(t, heads, d).transpose(0, 1)
    k = (x @ m("self_attn.k_proj").T).view(t, kv_heads, d).transpose(0, 1)
    v = (x @ m("self_attn.v_proj").T).view(t, kv_heads, d).transpose(0, 1)
    rope = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    cos, sin = rope(x[None], torch.arange(t)[None])
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, heads * d)
    h = g + att @ m("self_attn.o_proj").T
    post = rms(h, m("post_attention_layernorm"), eps)
    h = h + (F.silu(post @ m("mlp.gate_proj").T) * (post @ m("mlp.up_proj").T)) @ m("mlp.down_proj").T
    draft_logits = rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
    full = torch.full((t, cfg["vocab_size"]), float("-inf"))
    full[:, ckpt["d2t"] + torch.arange(len(ckpt["d2t"]))] = draft_logits
    return full, h


@pytest.fixture
def exported(tmp_path):
    """A trained tiny draft (head vocabulary out of id order) exported in float32, and the draft as read
    back from its file (its matrices rounded to bfloat16 there)."""
    target = tiny_checkpoint("llama")
    path, _, ids, features = tiny_draft(target, tmp_path, train_steps=3)
    draft, _ = trained_draft(path, max_len=64)
    out = tmp_path / "eagle3"
    export(str(out), path, dtype="float32")
    with open(out / "config.json") as f:
        cfg = json.load(f)
    return target, path, draft, ids, features, load_file(out / "model.safetensors"), cfg


def test_exported_layout_reproduces_our_drafts_logits_and_next_feature(exported):
    target, _, draft, ids, features, ckpt, cfg = exported
    with torch.no_grad():
        hidden, prenorm = dense_run(draft, ids, features)
        ours = draft.compute_logits(hidden.flatten(0, 1)).view(*ids.shape, -1)
        embed = load_file(f"{target}/model.safetensors")["model.embed_tokens.weight"]
        for row in range(ids.shape[0]):
            theirs, h = reference(ckpt, cfg, embed, ids[row], features[row])
            full = torch.full_like(theirs, float("-inf"))
            full[:, draft.vocab_ids] = ours[row]
            assert torch.equal(torch.isinf(theirs), torch.isinf(full))
            finite = torch.isfinite(full)
            assert (theirs[finite] - full[finite]).abs().max() < 1e-5
            assert torch.equal(theirs.argmax(-1), full.argmax(-1))
            assert (h - prenorm[row]).abs().max() < 1e-5  # the state both feed back as the next feature


def test_vocabulary_maps_and_head_rows_are_the_targets(exported):
    target, _, draft, _, _, ckpt, cfg = exported
    vocab = sorted(draft.vocab_ids.tolist())
    assert vocab != draft.vocab_ids.tolist()  # the fixture's head is out of id order: the reorder is tested
    assert (ckpt["d2t"] + torch.arange(len(vocab))).tolist() == vocab  # offsets, as published
    assert ckpt["t2d"].dtype == torch.bool and ckpt["t2d"].nonzero().flatten().tolist() == vocab
    assert torch.equal(ckpt["lm_head.weight"], load_file(f"{target}/model.safetensors")["lm_head.weight"][vocab])
    assert cfg["draft_vocab_size"] == len(vocab) and cfg["vocab_size"] == ckpt["t2d"].numel()


def test_config_names_the_taps_ascending_and_one_layer(exported):
    _, _, draft, _, _, ckpt, cfg = exported
    assert list(draft.target_layers) == [2, 1, 0]  # eagle3_taps(3): listed out of order in the layout
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # our target concatenates in layer order
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["target_hidden_size"] * 3 == ckpt["fc.weight"].shape[1]
    assert not any(k.startswith(("embed_tokens", "model.")) for k in ckpt)  # embeddings come from the target


def test_default_bfloat16_keeps_the_drafts_own_matrices_exactly(exported, tmp_path):
    _, path, *_ = exported
    export(str(tmp_path / "bf16"), path)
    ckpt, ours = load_file(tmp_path / "bf16" / "model.safetensors"), load_file(path)
    assert ckpt["fc.weight"].dtype == torch.bfloat16 and torch.equal(ckpt["fc.weight"], ours["fc.weight"])
    q = ckpt["midlayer.self_attn.q_proj.weight"]
    assert torch.equal(q, ours["layers.0.qkv_proj.weight"][: q.shape[0]])
    assert ckpt["norm.weight"].dtype == torch.float32


def test_layouts_without_the_published_form_are_refused(tmp_path):
    target = tiny_checkpoint("llama")
    eagle1, *_ = tiny_draft(target, tmp_path, kind="eagle1")
    with pytest.raises(ValueError, match="one-layer EAGLE-3"):
        export(str(tmp_path / "e1"), eagle1)
    layout = DraftLayout(target, layers=[0, 1], head_vocab=list(range(3, 200)), feature_layers=[0, 1, 2])
    two = tmp_path / "two.safetensors"
    save_draft(base_draft(layout, max_len=64), layout, str(two))
    with pytest.raises(ValueError, match="one-layer EAGLE-3"):
        export(str(tmp_path / "two"), str(two))


def test_llama_server_runs_the_exported_draft_beside_its_other_speculation(tmp_path):
    from harness.servers import llamacpp_server

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").touch()
    (tmp_path / "smollm2-bf16.gguf").touch()
    draft = tmp_path / "smollm2-draft-eagle3.gguf"
    with pytest.raises(FileNotFoundError, match="smollm2-draft-eagle3.gguf"):
        llamacpp_server(1, tmp_path / "log", "bf16", directory=tmp_path, draft=draft)
    draft.touch()
    argv = " ".join(llamacpp_server(1, tmp_path / "log", "bf16", directory=tmp_path, draft=draft).argv)
    assert f"-md {draft} --spec-type draft-eagle3" in argv
    both = llamacpp_server(1, tmp_path / "log", "bf16", spec_type="ngram-mod", directory=tmp_path, draft=draft)
    assert "--spec-type ngram-mod,draft-eagle3" in " ".join(both.argv)


@pytest.mark.slow
def test_the_shipped_draft_exports_with_its_taps_and_head(tmp_path):
    from safetensors import safe_open

    from adaserve_backend.models.feature_draft import SHIPPED

    export(str(tmp_path), SHIPPED)
    with safe_open(SHIPPED, "pt") as f:
        layout = DraftLayout.from_json(f.metadata()["layout"])
    cfg, ckpt = json.loads((tmp_path / "config.json").read_text()), load_file(tmp_path / "model.safetensors")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == sorted(layout.feature_layers) == [2, 15, 27]
    assert (ckpt["d2t"] + torch.arange(cfg["draft_vocab_size"])).tolist() == sorted(layout.head_vocab)
    assert ckpt["lm_head.weight"].shape == (len(layout.head_vocab), cfg["hidden_size"])
