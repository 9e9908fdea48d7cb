"""The one way a prompt is wrapped in the model's chat template (preprocessing, tools, benchmarks)."""

from __future__ import annotations


def chat_text(tokenizer, text: str) -> str:
    """`text` as a single user turn, ready for the assistant's reply; ValueError without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def encode_chat(tokenizer, text: str) -> list[int]:
    """Ids of `chat_text`. The template writes its own special tokens, so the tokenizer adds none."""
    return tokenizer(chat_text(tokenizer, text), add_special_tokens=False)["input_ids"]


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Ids of a prompt as served: in the chat template if `chat`, else plain text; ValueError if empty."""
    if not text:
        raise ValueError("the prompt is empty")
    return encode_chat(tokenizer, text) if chat else tokenizer(text)["input_ids"]
