"""Our EAGLE-3 draft as a standard EAGLE-3 Hugging Face checkpoint, so that peers can run it too.

    python -m tools.draft.export_eagle3 OUT_DIR [--draft FILE] [--dtype bfloat16|float32]

writes OUT_DIR/config.json and OUT_DIR/model.safetensors in the layout EAGLE-3 drafts are published in
(architectures LlamaForCausalLMEagle3; `midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight`, `d2t`,
`t2d`), which llama.cpp's converter (conversion/llama.py, with --target-model-dir) and vLLM's
`llama_eagle3.py` both read. Why the mapping is exact:

- taps: ours are the residual stream entering target layers `feature_layers`; llama.cpp extracts the
  input of layer i (`t_layer_inp[il]`) and vLLM records the stream after i layers (`idx + 1`), so the
  same numbers carry over as `eagle_aux_hidden_state_layer_ids`. They are written ascending: our
  target concatenates its taps in layer order whatever order the layout lists them in, vLLM sorts
  them, and llama.cpp concatenates them in the order written;
- the layer: both read [input_layernorm(embedding), hidden_norm(feature)] into q/k/v, keep the raw
  feature as the residual (`norm_before_residual` false), and feed the pre-norm output back as the
  next feature; the final `norm` precedes the head in both. Our fused qkv / gate_up matrices split
  into the separate projections they were made from (loader.py concatenates q, k, v and gate, up);
- vocabulary: the head covers `head_vocab`; the published convention is draft ids in ascending
  target-id order with d2t[i] = target_id - i (consumers add the index back) and t2d a boolean mask
  over the target vocabulary, so the head's rows are reordered to ascending ids. Only the order of
  equal logits could differ, which greedy drafting never meets in practice;
- embeddings are not written: both consumers share the target's when the draft has none, as ours does.

Not carried over, as neither consumer has a setting for it: our draft also reads token 0 (with a zero
feature), while both pair token i+1 with the feature at i from the start, so token 0 never enters their
draft's attention; their drafts see one key fewer at the start of a sequence. RoPE positions are one
lower in theirs, which attention does not see (it depends on distances only).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from adaserve_backend.models.feature_draft import SHIPPED, DraftLayout, FeatureDraft, trained_draft

ARCHITECTURE = "LlamaForCausalLMEagle3"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def vocab_maps(head_vocab: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, d2t, t2d): the head's rows in ascending target id (`order` indexes head_vocab), the
    offsets d2t[i] = target id of draft id i, minus i, and the mask of target ids the head covers."""
    ids = torch.tensor(head_vocab, dtype=torch.long)
    if len(set(head_vocab)) != len(head_vocab) or ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError("head_vocab must hold distinct ids of the target vocabulary")
    order = torch.argsort(ids)
    d2t = ids[order] - torch.arange(len(ids))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return order, d2t, t2d


def eagle3_tensors(model: FeatureDraft, layout: DraftLayout, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The exported tensors: matrices in `dtype`, norms in float32, d2t int64, t2d bool."""
    if not layout.feature_layers or len(model.layers) != 1:
        raise ValueError("only a one-layer EAGLE-3 draft (feature_layers set) has the published layout")
    spec, layer = model.spec, model.layers[0]
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    wq, wk, wv = layer.qkv_proj.weight.detach().split([q, kv, kv], dim=0)
    gate, up = layer.gate_up_proj.weight.detach().chunk(2, dim=0)
    order, d2t, t2d = vocab_maps(layout.head_vocab, spec.vocab_size)
    matrices = {
        "fc.weight": model.fc.weight,
        "midlayer.self_attn.q_proj.weight": wq, "midlayer.self_attn.k_proj.weight": wk,
        "midlayer.self_attn.v_proj.weight": wv, "midlayer.self_attn.o_proj.weight": layer.o_proj.weight,
        "midlayer.mlp.gate_proj.weight": gate, "midlayer.mlp.up_proj.weight": up,
        "midlayer.mlp.down_proj.weight": layer.down_proj.weight,
        "lm_head.weight": model.lm_head.weight.detach()[order],
    }
    norms = {
        "midlayer.input_layernorm.weight": layer.input_layernorm.weight,
        "midlayer.hidden_norm.weight": layer.hidden_norm.weight,
        "midlayer.post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        "norm.weight": model.norm.weight,
    }
    if any(p is not None for p in (layer.qkv_proj.bias, layer.o_proj.bias, layer.down_proj.bias, model.fc.bias)):
        raise ValueError("the published EAGLE-3 layout has no biases")
    out = {k: v.detach().to(dtype) for k, v in matrices.items()}
    out.update({k: v.detach().float() for k, v in norms.items()})
    out.update(d2t=d2t, t2d=t2d)
    return {k: v.contiguous() for k, v in out.items()}


# What the draft shares with its target: shapes, RoPE, norm eps, vocabulary and special tokens.
SHARED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
               "rope_scaling", "rope_theta", "bos_token_id", "eos_token_id", "pad_token_id")


def eagle3_config(target_config: dict, layout: DraftLayout, dtype: str) -> dict:
    """The target's shapes as a one-layer Llama draft, plus the keys that mark it EAGLE-3 and name its
    taps, in both spellings (top level and `eagle_config`): consumers read one or the other."""
    cfg = {k: target_config[k] for k in SHARED_KEYS if target_config.get(k) is not None}
    taps = sorted(layout.feature_layers)  # the order the fused input is concatenated in (above)
    cfg.update(
        architectures=[ARCHITECTURE], model_type="llama", num_hidden_layers=1, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, dtype=dtype, torch_dtype=dtype,
        draft_vocab_size=len(layout.head_vocab), target_hidden_size=target_config["hidden_size"],
        eagle_aux_hidden_state_layer_ids=taps, norm_before_residual=False,
        eagle_config={"eagle_aux_hidden_state_layer_ids": taps, "use_aux_hidden_state": True},
    )
    return cfg


def export(out_dir: str, draft_path: str = SHIPPED, dtype: str = "bfloat16") -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from adaserve_backend.models.loader import read_checkpoint

    if not os.path.isfile(draft_path):
        raise FileNotFoundError(f"draft weights not found: {draft_path}")
    with safe_open(draft_path, "pt") as f:  # the target first: its config becomes the draft's
        parts = read_checkpoint(DraftLayout.from_json(f.metadata()["layout"]).target_path)
    model, layout = trained_draft(draft_path, max_len=16, target_parts=parts)
    tensors = eagle3_tensors(model, layout, DTYPES[dtype])
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(eagle3_config(parts[0].to_dict(), layout, dtype), f, indent=2)
    print(f"wrote {out_dir}: taps {layout.feature_layers}, draft vocabulary {len(layout.head_vocab)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--draft", default=SHIPPED, help="a draft saved by tools.draft.train (default: shipped)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="the matrices' dtype")
    args = parser.parse_args()
    export(args.out_dir, args.draft, args.dtype)


if __name__ == "__main__":
    main()
