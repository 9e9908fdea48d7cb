"""The wire protocol of the `adaserve` model: request tensors in, response tensors out.

The fields, their types and defaults are request_fields.py's table (names after Triton's vLLM and
TensorRT-LLM backends; `tpot_slo_ms`, `ttft_slo_ms` and `slo_class` are our additions). Pure numpy:
parsing and validation are tested without a server.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass

import numpy as np

from ..chat import encode_prompt
from ..grammar.spec import GrammarSpec
from ..request import Request, RequestOutput, SamplingParams, TokenLogprob
from ..request_fields import Role, default, names
from ..serving.detokenize import Rendered
from ..serving.errors import ErrorKind
from ..slo import SLO

# The `adaserve` model's inputs (the front model forwards those the client sent, input_ids first).
INPUT_NAMES = names(Role.PROMPT, Role.CLIENT)
# Inputs the front model (or a gateway) sets itself rather than forwarding a client's: its own request id,
# a cancellation by that id, when the request reached the server (protocol._arrival), and whether to be
# answered at once with an empty response on acceptance (why: the adaserve model's config.pbtxt).
ACK_INPUT = "accept_ack"
FRONT_INPUTS = names(Role.FRONT)
# A prompt as text, tokenized by the `adaserve` model itself (as Triton's vLLM backend takes it), for
# clients that call it directly rather than through the ensemble; never both these and input_ids.
TEXT_INPUTS = names(Role.TEXT)
# With `logprobs`: each token's log-probability, and the likeliest alternatives (flattened, per token).
LOGPROB_OUTPUTS = ("output_log_probs", "top_log_probs", "top_log_prob_ids")
# With `prompt_logprobs`, on the first response: the prompt's ids and its tokens' (all but the first).
PROMPT_LOGPROB_OUTPUTS = ("prompt_token_ids", "prompt_log_probs", "prompt_top_log_probs", "prompt_top_log_prob_ids")
# Optional outputs that travel from the scheduler through the detokenizer to the client unchanged.
PASS_THROUGH_OUTPUTS = (
    "num_input_tokens", "num_cached_tokens", "num_output_tokens", "finish_reason", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens", "accepted_prediction_tokens", "rejected_prediction_tokens",
    "arrival_time_ns", "first_token_time_ns", "emit_time_ns",
    *LOGPROB_OUTPUTS, *PROMPT_LOGPROB_OUTPUTS,
)


# The Python backend drops an error's code on its way back through a BLS call (Triton 2.51: the
# pipeline's `response.error().code()` reads INTERNAL for the scheduler model's UNAVAILABLE), so the
# scheduler model also names the code in its message; the pipeline restores the code and strips the tag.
CODE_TAG = re.compile(r"^\[(" + "|".join(k.triton for k in ErrorKind) + r")\] ")


def tag_error(message: str, kind: ErrorKind) -> str:
    return f"[{kind.triton}] {message}"


def untag_error(message: str) -> tuple[ErrorKind, str]:
    """(the tagged kind, INTERNAL without a tag; the message without its tag)."""
    m = CODE_TAG.match(message)
    return (ErrorKind.from_triton(m.group(1)), message[m.end():]) if m else (ErrorKind.INTERNAL, message)


# The scheduler model ends a request with an error as a response holding this output (the tagged
# message) and the FINAL flag, not as a Triton error response. Why: the 2.51 Python backend drops an
# error response's stream id on its way to a BLS caller (InferResponse::SaveToSharedMemory stores the
# id only for a response without an error; fixed upstream later), so the caller's stub files it under
# whatever id that shared memory held: the pipeline never saw the final response of a request ended
# by an error (it waited on the stream until finalize gave up), and the stub later cleaned up a
# stream under that stray id.
ERROR_OUTPUT = "error"
# The scheduler model renders each response's text itself (it decodes the ids anyway, to hold back half
# characters), so the front pipeline need not call the detokenizer model once per response.
TEXT_OUTPUT = "text_output"


def error_tensor(message: str, kind: ErrorKind) -> np.ndarray:
    return np.asarray([tag_error(message, kind).encode()], dtype=object)


def response_error(response) -> tuple[ErrorKind, str] | None:
    """A scheduler model response's error as (its kind, message), None without one."""
    if response.has_error():
        return untag_error(response.error().message())
    for t in response.output_tensors():
        if t.name() == ERROR_OUTPUT:
            raw = t.as_numpy().reshape(-1)[0]
            return untag_error(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
    return None


@dataclass(frozen=True)
class ResponseOptions:
    """How the request is answered: the boolean fields of the same names (request_fields.py)."""

    stream: bool = False
    exclude_input_in_output: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    return_finish_reason: bool = False
    return_perf_metrics: bool = False
    accept_ack: bool = False  # an empty response on acceptance (ACK_INPUT, set by the front model)


RESPONSE_OPTIONS = tuple(f.name for f in dataclasses.fields(ResponseOptions))


class _Inputs:
    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.t = tensors

    def scalar(self, name: str, default, cast):
        if name not in self.t:
            return default
        arr = np.asarray(self.t[name])
        if arr.size != 1:
            raise ValueError(f"input '{name}' must hold exactly one value, got shape {list(arr.shape)}")
        value = arr.reshape(-1)[0]
        if isinstance(value, bytes):
            value = _utf8(name, value)
        return cast(value)

    def strings(self, name: str) -> list[str]:
        if name not in self.t:
            return []
        return [_utf8(name, v) if isinstance(v, bytes) else str(v) for v in np.asarray(self.t[name]).reshape(-1)]


def _arrival(x: _Inputs) -> float | None:
    """`arrival_time_ns` (wall clock: when the request reached the server, stamped by the ensemble
    pipeline or a gateway in front) on the engine's monotonic clock, never later than now; None: the
    engine takes its own receipt. Why: the first-token deadline runs from the client's arrival, and
    under overload the pipeline's own queueing before this model can take seconds that a scheduler
    counting from its receipt never sees (docs/triton.md#decoupled-streaming)."""
    ns = x.scalar("arrival_time_ns", None, int)
    if ns is None:
        return None
    if ns <= 0:
        raise ValueError(f"arrival_time_ns must be a positive wall-clock time in ns, got {ns}")
    return time.monotonic() - max(0.0, (time.time_ns() - ns) / 1e9)


def _utf8(name: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"input '{name}' is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _finite(name: str):
    def cast(v) -> float:
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"input '{name}' must be a finite number, got {f}")
        return f

    return cast


def prompt_ids(tensors: dict[str, np.ndarray], tokenizer) -> np.ndarray:
    """The prompt: `input_ids`, or `text_input` tokenized here (optionally through the chat template)."""
    if ("input_ids" in tensors) == ("text_input" in tensors):
        raise ValueError("send exactly one of 'input_ids' and 'text_input'")
    if "input_ids" in tensors:
        if "apply_chat_template" in tensors:
            raise ValueError("apply_chat_template applies to text_input, not input_ids")
        return np.asarray(tensors["input_ids"]).reshape(-1)
    text = np.asarray(tensors["text_input"]).reshape(-1)
    if text.size != 1:
        raise ValueError(f"text_input must hold exactly one string, got {text.size}")
    prompt = _utf8("text_input", text[0]) if isinstance(text[0], bytes) else str(text[0])
    chat = _Inputs(tensors).scalar("apply_chat_template", default("apply_chat_template"), bool)
    return np.asarray(encode_prompt(tokenizer, prompt, chat), dtype=np.int64)


def _logit_bias(tensors: dict[str, np.ndarray]) -> tuple[tuple[int, float], ...]:
    ids = np.asarray(tensors.get("logit_bias_token_ids", [])).reshape(-1)
    values = np.asarray(tensors.get("logit_bias_values", [])).reshape(-1)
    if len(ids) != len(values):
        raise ValueError(f"logit_bias_token_ids ({len(ids)}) and logit_bias_values ({len(values)}) must pair up")
    return tuple(zip((int(i) for i in ids), (float(v) for v in values)))


def _grammar(x: _Inputs) -> GrammarSpec | None:
    kind = x.scalar("guided_decoding_guide_type", None, str) or None
    guide = x.scalar("guided_decoding_guide", None, str) or ""
    if kind is None:
        if guide:
            raise ValueError("guided_decoding_guide needs guided_decoding_guide_type")
        return None
    return GrammarSpec(kind, guide)


def _prediction(x: _Inputs, tokenizer) -> tuple[int, ...]:
    """Predicted Outputs' text as token ids (the output's own tokenization: no special tokens)."""
    text = x.scalar("prediction", None, str)
    if not text:
        return ()
    if tokenizer is None:
        raise ValueError("a prediction needs the model's tokenizer")
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def parse_request(request_id: str, tensors: dict[str, np.ndarray], tokenizer=None) -> tuple[Request, ResponseOptions]:
    """Build an engine Request from the `adaserve` model's input tensors; ValueError on bad input.
    `tokenizer`: needed only for a prompt sent as text_input."""
    x = _Inputs(tensors)
    ids = prompt_ids(tensors, tokenizer)
    if ids.size == 0:
        raise ValueError("the prompt is empty")
    seed = x.scalar("seed", None, int)
    temperature = x.scalar("temperature", default("temperature"), _finite("temperature"))
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    sampling = SamplingParams(
        temperature=temperature,
        top_p=x.scalar("top_p", default("top_p"), _finite("top_p")),
        top_k=x.scalar("top_k", default("top_k"), int),
        seed=seed,
        frequency_penalty=x.scalar("frequency_penalty", default("frequency_penalty"), _finite("frequency_penalty")),
        presence_penalty=x.scalar("presence_penalty", default("presence_penalty"), _finite("presence_penalty")),
        logit_bias=_logit_bias(tensors),
    )
    stop_words = [w for w in x.strings("stop_words") if w]  # their limits: Request.validate
    slo = SLO(*(x.scalar(name, None, _finite(name)) for name in ("tpot_slo_ms", "ttft_slo_ms")),
              x.scalar("slo_class", None, str) or None)
    # parsed even when min_tokens wins: a bad value is an error
    min_length = x.scalar("min_length", default("min_length"), int)
    min_tokens = x.scalar("min_tokens", min_length, int)
    request = Request(
        request_id=request_id,
        prompt_ids=[int(i) for i in ids],
        max_tokens=x.scalar("max_tokens", default("max_tokens"), int),
        min_tokens=min_tokens,
        sampling=sampling,
        stop_strings=tuple(stop_words),
        stop_token_ids=tuple(int(t) for t in np.asarray(tensors.get("stop_token_ids", [])).reshape(-1)),
        ignore_eos=x.scalar("ignore_eos", default("ignore_eos"), bool),
        slo=slo,
        arrival_time=_arrival(x),
        tenant=x.scalar("tenant", None, str) or None,
        cache_scope=x.scalar("cache_scope", None, str) or None,
        logprobs=x.scalar("logprobs", None, int),
        prompt_logprobs=x.scalar("prompt_logprobs", None, int),
        prediction=_prediction(x, tokenizer),
        grammar=_grammar(x),
    )
    options = ResponseOptions(**{name: x.scalar(name, default(name), bool) for name in RESPONSE_OPTIONS})
    return request, options


def response_tensors(out: RequestOutput, options: ResponseOptions, rendered: Rendered, clock_offset_ns: int,
                     logprobs: list[TokenLogprob] | None = None,
                     prompt_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    """Tensors of one response. Only what the client asked for is included; `logprobs`: one per output
    token the response carries, where the request asked for them; `prompt_ids`: the prompt, for the
    response that carries its logprobs (out.prompt_logprobs)."""
    t: dict[str, np.ndarray] = {
        "output_ids": np.asarray(rendered.ids, dtype=np.int32),
        "context_ids": np.asarray(rendered.context_ids, dtype=np.int32),
        TEXT_OUTPUT: np.asarray([rendered.text.encode("utf-8")], dtype=object),
        "is_final": np.asarray([out.finished]),  # lets a BLS caller flag its last data response FINAL
    }
    if options.return_num_input_tokens:
        t["num_input_tokens"] = np.asarray([out.num_prompt_tokens], dtype=np.int32)
        t["num_cached_tokens"] = np.asarray([out.num_cached_tokens], dtype=np.int32)
    if options.return_num_output_tokens:
        t["num_output_tokens"] = np.asarray([out.num_output_tokens], dtype=np.int32)
    if options.return_finish_reason and out.finished:
        t["finish_reason"] = np.asarray([out.finish_reason.value if out.finish_reason else ""], dtype=object)
    if options.return_perf_metrics:
        t["acceptance_rate"] = np.asarray([out.stats.acceptance_rate], dtype=np.float32)
        t["total_accepted_draft_tokens"] = np.asarray([out.stats.accepted_drafts], dtype=np.int32)
        t["total_draft_tokens"] = np.asarray([out.stats.draft_tokens], dtype=np.int32)
        t["accepted_prediction_tokens"] = np.asarray([out.stats.accepted_prediction_tokens], dtype=np.int32)
        t["rejected_prediction_tokens"] = np.asarray([out.stats.rejected_prediction_tokens], dtype=np.int32)
        ns = lambda s: int(s * 1e9) + clock_offset_ns  # noqa: E731  monotonic -> wall clock
        t["arrival_time_ns"] = np.asarray([ns(out.arrival_time)], dtype=np.int64)
        t["first_token_time_ns"] = np.asarray([ns(out.first_token_time or out.emit_time)], dtype=np.int64)
        t["emit_time_ns"] = np.asarray([ns(out.emit_time)], dtype=np.int64)
    if logprobs is not None:
        t |= logprob_tensors(logprobs)
    if out.prompt_logprobs is not None and prompt_ids is not None:
        scored = logprob_tensors(out.prompt_logprobs[1:])
        t |= {"prompt_token_ids": np.asarray(prompt_ids, dtype=np.int32),
              "prompt_log_probs": scored["output_log_probs"], "prompt_top_log_probs": scored["top_log_probs"],
              "prompt_top_log_prob_ids": scored["top_log_prob_ids"]}
    return t


def logprob_tensors(logprobs: list[TokenLogprob]) -> dict[str, np.ndarray]:
    return {"output_log_probs": np.asarray([lp.logprob for lp in logprobs], dtype=np.float32),
            "top_log_probs": np.asarray([v for lp in logprobs for _, v in lp.top], dtype=np.float32),
            "top_log_prob_ids": np.asarray([i for lp in logprobs for i, _ in lp.top], dtype=np.int32)}
