"""The request contract: every field a generation request can carry on the wire, in one table.

Each row is one field: its name (the Triton input's, after Triton's vLLM and TensorRT-LLM backends, so
their clients, genai-perf and Triton's OpenAI frontend work unchanged), its Triton type and shape, its
default, and what it means. Who takes the fields from here: the `adaserve` model's parser
(triton/protocol.py), the tensors every gRPC caller sends (triton/grpc_client.py, the OpenAI
frontend's Triton backend among them), and the ensemble pipeline's forwarding (triton/pipeline.py).
Every `config.pbtxt` input list is checked against this table (tests/unit/test_request_fields.py), and
so is docs/triton.md's interface table. The values themselves are checked where the engine takes them
(request.py: Request.validate, SamplingParams; slo.SLO), so every front door refuses the same things.

Adding a field: a row here, the field on `Request` (or `ResponseOptions`) and its line in
`protocol.parse_request`; the table test then names every `config.pbtxt` and doc that lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np


class Role(str, Enum):
    PROMPT = "prompt"  # the prompt as ids: what `preprocessing` makes of the text, the scheduler's input
    TEXT = "text"  # the prompt as text: the ensemble's and `preprocessing`'s, or `adaserve` called directly
    CLIENT = "client"  # sampling, lengths, SLO targets, optional outputs: what any client may send
    FRONT = "front"  # set by the model or gateway in front of `adaserve`, never forwarded from a client


# Triton's data types and the numpy dtype each travels as.
NUMPY = {"INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_,
         "STRING": np.object_}


@dataclass(frozen=True)
class RequestField:
    name: str
    dtype: str  # Triton's name without TYPE_ (NUMPY's keys)
    meaning: str
    default: object = None  # what the server takes when the field is left out (None: nothing)
    role: Role = Role.CLIENT
    many: bool = False  # dims [-1] (a list), else [1]
    required_in_preprocessing: bool = False  # the tokenizer model's config.pbtxt marks it required

    @property
    def dims(self) -> list[int]:
        return [-1] if self.many else [1]

    def tensor(self, value) -> np.ndarray:
        """The value as the numpy array this field travels as (a string as UTF-8 bytes)."""
        values = list(value) if self.many else [value]
        if self.dtype == "STRING":
            values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        return np.array(values, dtype=NUMPY[self.dtype])


FIELDS: tuple[RequestField, ...] = (
    RequestField("input_ids", "INT32", "the prompt's token ids", role=Role.PROMPT, many=True),
    RequestField("text_input", "STRING", "the prompt as text", role=Role.TEXT, required_in_preprocessing=True),
    RequestField("apply_chat_template", "BOOL", "wrap the prompt in the model's chat template", False, Role.TEXT),
    RequestField("max_tokens", "INT32", "output tokens at most", 16),
    RequestField("stream", "BOOL", "deltas as they come (else one aggregated response)", False),
    RequestField("temperature", "FP32", "sampling temperature; 0 is greedy", 0.0),
    RequestField("top_p", "FP32", "nucleus sampling: the smallest set of tokens of this total probability", 1.0),
    RequestField("top_k", "INT32", "sample among the k likeliest tokens (0: all)", 0),
    RequestField("frequency_penalty", "FP32", "a token's logit less this times its count in the output so far", 0.0),
    RequestField("presence_penalty", "FP32", "a token's logit less this once it occurs in the output", 0.0),
    RequestField("logit_bias_token_ids", "INT32", "tokens whose logits are biased (with logit_bias_values)", (),
                 many=True),
    RequestField("logit_bias_values", "FP32", "each biased token's bias, -100 to 100", (), many=True),
    RequestField("min_tokens", "INT32", "output tokens at least before an end of sequence or a stop string", 0),
    RequestField("min_length", "INT32", "min_tokens under TensorRT-LLM's name (min_tokens wins)", 0),
    RequestField("ignore_eos", "BOOL", "generate on past end-of-sequence tokens, to max_tokens", False),
    RequestField("seed", "UINT64", "reproducible sampling"),
    RequestField("stop_words", "STRING", "stop strings (the output ends before the first one)", (), many=True),
    RequestField("stop_token_ids", "INT32", "tokens that end the output (kept in it, as an end-of-sequence token)", (),
                 many=True),
    RequestField("exclude_input_in_output", "BOOL", "non-streaming: leave the prompt out of text_output", False),
    RequestField("return_num_input_tokens", "BOOL", "output num_input_tokens", False),
    RequestField("return_num_output_tokens", "BOOL", "output num_output_tokens", False),
    RequestField("return_finish_reason", "BOOL", "output finish_reason (stop/length) on the last response", False),
    RequestField("return_perf_metrics", "BOOL", "output the speculation counters and the request's times", False),
    RequestField("logprobs", "INT32", "output each token's log-probability and this many likeliest alternatives "
                 "(0-20; outputs output_log_probs, top_log_probs, top_log_prob_ids)"),
    RequestField("prompt_logprobs", "INT32", "output each prompt token's log-probability and this many likeliest "
                 "alternatives, on the first response (0-20; prompt_token_ids, prompt_log_probs, "
                 "prompt_top_log_probs, prompt_top_log_prob_ids)"),
    RequestField("prediction", "STRING", "Predicted Outputs: text most of the output is expected to repeat, copied "
                 "into the speculation trees (the output is the same without it)"),
    RequestField("guided_decoding_guide_type", "STRING", "structured output: json (a JSON object), json_schema, "
                 "regex or ebnf_grammar (TensorRT-LLM's names); every output token is one the grammar allows"),
    RequestField("guided_decoding_guide", "STRING", "the JSON schema, regex or EBNF grammar (rule root) of "
                 "guided_decoding_guide_type"),
    RequestField("tpot_slo_ms", "FP32", "this request's time-per-output-token target"),
    RequestField("ttft_slo_ms", "FP32", "this request's time-to-first-token target"),
    RequestField("slo_class", "STRING", "a named SLO class (both targets; scheduler.slo_classes)"),
    RequestField("tenant", "STRING", "whose suffix index the request reads and feeds (suffix_scope tenant)"),
    RequestField("cache_scope", "STRING", "an isolated tenant's scope: its own prefix cache and suffix index"),
    RequestField("request_id", "STRING", "the caller's id for this request (for abort_request_id)", role=Role.FRONT),
    RequestField("abort_request_id", "STRING", "cancel the request of this id", role=Role.FRONT),
    RequestField("arrival_time_ns", "INT64", "when the request reached the server (wall clock)", role=Role.FRONT),
    RequestField("accept_ack", "BOOL", "an empty response on acceptance (for a BLS caller)", False, Role.FRONT),
)

BY_NAME = {f.name: f for f in FIELDS}


def names(*roles: Role) -> tuple[str, ...]:
    return tuple(f.name for f in FIELDS if f.role in roles)


def default(name: str):
    return BY_NAME[name].default


def tensors(values: dict[str, object]) -> dict[str, np.ndarray]:
    """Named values (None: left out) as the tensors a caller sends; an unknown name is a bug here."""
    return {name: BY_NAME[name].tensor(v) for name, v in values.items() if v is not None}
