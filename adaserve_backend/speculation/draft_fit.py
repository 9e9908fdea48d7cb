"""Whether a draft can serve a target, checked when the engine loads rather than at the first decode
(where a mismatch would fail every request)."""

from __future__ import annotations


def check_draft_fits(target, draft) -> None:
    """Raise ValueError naming what does not match: the device, the vocabulary (the draft reads the target's
    tokens and proposes tokens the target reads), or the hidden size of a feature-conditioned draft
    (it reads the target's hidden states)."""
    t, d = target.spec, draft.spec
    where, draft_where = target.embed_tokens.weight.device, draft.embed_tokens.weight.device
    if draft_where != where:
        raise ValueError(f"the draft is on {draft_where} and the target on {where}: both must run on one device")
    if d.vocab_size != t.vocab_size:
        raise ValueError(f"the draft's vocabulary ({d.vocab_size} tokens) differs from the target's ({t.vocab_size})")
    if draft.takes_features and d.hidden_size != t.hidden_size:
        raise ValueError(
            f"the draft reads the target's features of size {d.hidden_size}, the target's hidden size is "
            f"{t.hidden_size}"
        )
    taps = getattr(draft, "target_layers", ())
    if taps and not all(0 <= i < t.num_layers for i in taps):
        raise ValueError(f"the draft reads the target's layers {list(taps)}, the target has {t.num_layers}")


def check_tokenizers_match(target_tokenizer, draft_tokenizer) -> None:
    """Same ids must mean the same text (a draft checkpoint of its own ships its own tokenizer)."""
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError("the draft's tokenizer differs from the target's: the same token ids would mean different "
                         "text")


def check_draft_tokenizer(config, target_tokenizer) -> None:
    """A speculative engine's draft checkpoint against the target's tokenizer (a trained draft has no
    tokenizer of its own: it reads the target's tokens)."""
    from ..models import is_trained_draft, load_tokenizer, locate

    if config.scheduler.speculative and config.draft is not None and not is_trained_draft(config.draft.path):
        check_tokenizers_match(target_tokenizer, load_tokenizer(locate(config.draft.path)))
