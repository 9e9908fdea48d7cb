"""The one way a prompt is wrapped in the model's chat template (preprocessing, tools, benchmarks)."""

from __future__ import annotations


def encode_chat(tokenizer, text: str) -> list[int]:
    """Ids of `text` as a single user turn, ready for the assistant's reply; ValueError without a
    chat template. The template writes its own special tokens, so the tokenizer adds none."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
