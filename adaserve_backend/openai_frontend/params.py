"""OpenAI request bodies (and SLO headers) -> one `Generation` for the ensemble. Every parameter is
either mapped or refused with an OpenAI-style 400: a client is never left believing a setting it sent
took effect when it did not. Pure: tested without a server."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..request import MAX_STOP_CHARS, MAX_TENANT_CHARS
from ..request import MAX_STOP_WORDS as MAX_STOP
from ..slo import SLO

INT32_MAX = 2**31 - 1  # token counts travel to Triton as INT32: a larger one would wrap, not fail
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's own default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 512  # chat has no OpenAI default short of the context; a bounded one here
DEFAULT_TEMPERATURE = 1.0  # OpenAI's (and vLLM's) default: sampling unless the client asks for 0
# OpenAI's `n` times the prompts of a batched completion: each is a generation of its own in the engine
# (choices.py), competing for the same batch and draft budget as every other request's; one request
# past this many would be a batch job crowding out the rest of the load.
MAX_GENERATIONS = 64
SLO_HEADERS = {"tpot_slo_ms": "x-slo-tpot-ms", "ttft_slo_ms": "x-slo-ttft-ms", "slo_class": "x-slo-class"}

# Accepted only at the value that changes nothing (what the client would get by leaving them out).
NEUTRAL = {"best_of": (1,), "echo": (False,), "logprobs": (False,), "top_logprobs": (0,),
           "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},), "suffix": ("",),
           "parallel_tool_calls": (False,), "tools": ([],),
           "repetition_penalty": (1, 1.0),  # a vLLM extension; `vllm bench serve` always sends 1.0
           "store": (False,), "metadata": ({},)}  # what agent frameworks send by default
# What OpenAI's own API answers a model without these capabilities (beyond the neutral values above).
NOT_OFFERED = {
    "store": "'store' is not supported: this server does not store completions (leave it out or false)",
    "metadata": "'metadata' is kept only with stored completions, which this server does not store",
    "reasoning_effort": "'reasoning_effort' is not supported with this model (it does not reason before answering)",
}
COMMON = {"model", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "min_tokens", "ignore_eos",
          "stream", "stream_options", "user", *SLO_HEADERS}
KNOWN = {"completions": COMMON | {"prompt"}, "chat": COMMON | {"messages", "max_completion_tokens"}}


class OpenAIError(Exception):
    """An error response in OpenAI's shape; `retry_after_s` becomes a Retry-After header."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind, self.retry_after_s = kind, retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param)


@dataclass(frozen=True)
class Generation:
    prompts: tuple[str, ...]  # plain text, one or a batch (completions; chat: none, its messages are rendered)
    messages: tuple[dict, ...] | None  # the chat messages, for rendering (None for completions)
    max_tokens: int
    n: int = 1  # choices: each its own generation (choices.py)
    # False: chat left the length open; its default then shrinks to what the context leaves (http_app.py)
    max_tokens_given: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    stream: bool = False
    include_usage: bool = False
    slo: SLO = SLO()
    tenant: str | None = None  # whose suffix index it shares (suffix_scope "tenant"): OpenAI's `user`, or the key's
    cache_scope: str | None = None  # an isolated tenant's (tenancy.py): its own prefix cache and suffix index

    @property
    def generations(self) -> int:
        """What the engine runs for this request: `n` choices of each prompt."""
        return self.n * max(len(self.prompts), 1)


def _number(body: Mapping, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    try:
        f = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:  # an integer literal of hundreds of digits
        f = math.nan
    if not math.isfinite(f) or not lo <= f <= hi:
        raise bad(name, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {shown(v)}")
    return f


def _integer(body: Mapping, name: str, lo: int, default: int | None, hi: int = 2**63 - 1) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(name, f"'{name}' must be an integer in [{lo}, {hi}], got {shown(v)}")
    return v


def shown(v, limit: int = 60) -> str:
    """A client's value in an error message, cut short (a 4,000-digit number stays out of the log)."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):  # deeply nested, or an integer too long to print
        return f"a {type(v).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def _utf8(text: str, where: str) -> str:
    """JSON can carry lone UTF-16 surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(where, f"'{where}' is not valid Unicode text (a lone surrogate)") from None
    return text


def _flag(body: Mapping, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(name, f"'{name}' must be a boolean, got {v!r}")
    return v


def _number_of_ms(name: str, v) -> float | None:
    """A header's text or a JSON number as a float (slo.SLO checks that it is a positive finite one)."""
    if v is None or isinstance(v, bool):
        return v
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise bad(name, f"'{name}' must be a positive number of milliseconds, got {shown(v)}") from None


def _slo(body: Mapping, headers: Mapping[str, str]) -> SLO:
    """SLO fields from the body or llm-d style headers; both given and different is an error."""
    out = {}
    lower = {k.lower(): v for k, v in headers.items()}
    for name, header in SLO_HEADERS.items():
        from_body, from_header = body.get(name), lower.get(header)
        if from_body is not None and from_header is not None and str(from_body) != from_header:
            raise bad(name, f"'{name}' is {from_body!r} in the body but {from_header!r} in header {header}")
        v = from_body if from_body is not None else from_header
        out[name] = (_utf8(v, name) if isinstance(v, str) else v) if name == "slo_class" else _number_of_ms(name, v)
    try:
        return SLO(out["tpot_slo_ms"], out["ttft_slo_ms"], out["slo_class"])
    except ValueError as e:
        raise bad(str(e).split()[0], str(e)) from None  # SLO's message starts with the field's name


def _check_fields(body: Mapping, endpoint: str) -> None:
    for name, value in body.items():
        if value is None or name in KNOWN[endpoint]:
            continue
        if name == "logprobs" and endpoint == "completions":  # an integer there: 0 still asks for each token's
            raise bad(name, "'logprobs' is not supported by this server (leave it out or null)")
        if name == "best_of" and value == body.get("n"):
            continue  # as many candidates as choices: every candidate is returned, nothing is ranked
        if name in NOT_OFFERED and value not in NEUTRAL.get(name, ()):
            raise bad(name, NOT_OFFERED[name])
        if name in NEUTRAL:
            if value not in NEUTRAL[name]:
                raise bad(name, f"'{name}'={value!r} is not supported by this server (only {NEUTRAL[name][0]!r})")
            continue
        raise bad(name, f"unsupported parameter '{name}'")


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return _utf8(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return _utf8("".join(p["text"] for p in content), where)
    raise bad(where, f"'{where}' must be a string or a list of text parts (images and audio are not supported)")


def parse(body, endpoint: str, headers: Mapping[str, str] | None = None) -> Generation:
    """`endpoint` is "completions" or "chat"."""
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    _check_fields(body, endpoint)
    messages = None
    if endpoint == "completions":
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise bad("prompt", "'prompt' must be a non-empty string or a list of them (token-id prompts are "
                      "not supported)")
        for p in prompts:
            _utf8(p, "prompt")
        max_tokens = _integer(body, "max_tokens", 1, COMPLETIONS_DEFAULT_MAX_TOKENS, INT32_MAX)
        max_tokens_given = True  # OpenAI's completions default (16) is a length of its own, not "what is left"
    else:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("messages", "'messages' must be a non-empty list")
        parsed = []
        for i, m in enumerate(raw):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
                raise bad(f"messages[{i}]", f"messages[{i}] needs a role of system, developer, user or assistant")
            role = "system" if m["role"] == "developer" else m["role"]
            parsed.append({"role": role, "content": _text(m.get("content"), f"messages[{i}].content")})
        messages, prompts = tuple(parsed), []
        # OpenAI deprecated max_tokens for chat: with both, max_completion_tokens wins (as vLLM and Triton's
        # frontend take it); the other is still checked, so a malformed one is never passed over silently
        a = body.get("max_completion_tokens")
        legacy = _integer(body, "max_tokens", 1, CHAT_DEFAULT_MAX_TOKENS, INT32_MAX)
        max_tokens = legacy if a is None else _integer(body, "max_completion_tokens", 1, None, INT32_MAX)
        max_tokens_given = a is not None or body.get("max_tokens") is not None
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if (not isinstance(stop, list) or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)):
        raise bad("stop",
                  f"'stop' must be a string of 1-{MAX_STOP_CHARS} characters or a list of at most {MAX_STOP} of them")
    for s in stop:
        _utf8(s, "stop")
    min_tokens = _integer(body, "min_tokens", 0, 0, INT32_MAX)
    if min_tokens > max_tokens:
        raise bad("min_tokens", f"'min_tokens' ({min_tokens}) exceeds the maximum ({max_tokens})")
    if _flag(body, "ignore_eos"):
        min_tokens = max_tokens  # the engine stops neither at EOS nor at a stop string before min_tokens
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if (not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}
            or options.get("continuous_usage_stats")):
        raise bad("stream_options", "'stream_options' supports only include_usage")
    if options and not stream:
        raise bad("stream_options", "'stream_options' is only allowed with stream=true")
    top_k = _integer(body, "top_k", -1, 0, INT32_MAX)
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or not 0 < len(user) <= MAX_TENANT_CHARS):
        raise bad("user", f"'user' must be a string of 1-{MAX_TENANT_CHARS} characters")
    n = _integer(body, "n", 1, 1, MAX_GENERATIONS)
    if n * len(prompts) > MAX_GENERATIONS:
        raise bad("n", f"n={n} choices of {len(prompts)} prompts are {n * len(prompts)} generations; at most "
                  f"{MAX_GENERATIONS} per request")
    return Generation(
        prompts=tuple(prompts), messages=messages, max_tokens=max_tokens, max_tokens_given=max_tokens_given, n=n,
        temperature=_number(body, "temperature", 0.0, 2.0, DEFAULT_TEMPERATURE),
        top_p=_number(body, "top_p", 1e-9, 1.0, 1.0), top_k=max(0, top_k),
        seed=_integer(body, "seed", 0, None, 2**64 - 1),
        stop=tuple(stop), min_tokens=min_tokens, stream=stream, include_usage=bool(options.get("include_usage")),
        slo=_slo(body, headers or {}), tenant=_utf8(user, "user") if user is not None else None,
    )
