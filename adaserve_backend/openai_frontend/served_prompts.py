"""The served model's prompt text: chat messages rendered with its own chat template, and how many
tokens a prompt leaves of its context (for a chat that left its length open)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..chat import encode_prompt
from .field_readers import bad
from .tools import tool_messages


def served_tokenizer(model_repository: str):
    """The served target's tokenizer (engine.json names it) and its context length: chat messages are
    rendered here once with its chat template; `adaserve` tokenizes the text as it is."""
    from ..triton.repository import load_engine_config, load_repository_tokenizer  # here: Ray loads no triton/

    model_dir = os.path.join(model_repository, "adaserve")
    return load_repository_tokenizer(model_dir), load_engine_config(model_dir).target.max_model_len


def context_room(tokenizer, max_model_len: int) -> Callable[[str], int]:
    """Tokens a prompt, as the engine will tokenize its text, leaves of a `max_model_len` context."""
    return lambda text: max_model_len - len(encode_prompt(tokenizer, text, False))


def chat_renderer(tokenizer) -> Callable[[tuple[dict, ...]], str]:
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit("the served model has no chat template: /v1/chat/completions cannot work")

    def render(messages: tuple[dict, ...], add_generation_prompt: bool = True, continue_final: bool = False) -> str:
        try:
            return tokenizer.apply_chat_template(list(messages), tokenize=False, continue_final_message=continue_final,
                                                 add_generation_prompt=add_generation_prompt)
        except Exception as e:  # a template's raise_exception (roles out of order, say): the client's to fix
            raise bad("messages", f"the model's chat template refused these messages: {e}") from None

    return render


def chat_prompt(render: Callable[..., str], gen) -> str:
    """A chat Generation's prompt text: its messages (with its tools, tools.py) in the chat template,
    its turn opened or its last message continued as it asked."""
    messages = tool_messages(gen.messages, gen.tools)
    if gen.add_generation_prompt and not gen.continue_final_message:
        return render(messages)
    return render(messages, add_generation_prompt=gen.add_generation_prompt, continue_final=gen.continue_final_message)

