"""OpenAI request bodies (and SLO headers) -> one `Generation` for the ensemble. Every parameter is
either mapped or refused with an OpenAI-style 400: a client is never left believing a setting it sent
took effect when it did not. Pure: tested without a server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..grammar.spec import GrammarSpec
from ..request import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_TOKEN_IDS, MAX_TENANT_CHARS
from ..request import MAX_STOP_WORDS as MAX_STOP
from ..slo import SLO
from .field_readers import bad, flag, integer, number, shown, utf8
from .messages import assistant_prefill, chat_message, text_of
from .structured import FIELDS as STRUCTURED
from .structured import grammar_of
from .tools import FIELDS as TOOL_FIELDS
from .tools import ToolUse, tool_use, with_tools

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
NEUTRAL = {"best_of": (1,), "suffix": ("",),
           "parallel_tool_calls": (False, True), "tools": ([],),  # completions: no tools to call
           "repetition_penalty": (1, 1.0),  # a vLLM extension; `vllm bench serve` always sends 1.0
           "store": (False,), "metadata": ({},)}  # what agent frameworks send by default
# What OpenAI's own API answers a model without these capabilities (beyond the neutral values above).
NOT_OFFERED = {
    "store": "'store' is not supported: this server does not store completions (leave it out or false)",
    "metadata": "'metadata' is kept only with stored completions, which this server does not store",
    "reasoning_effort": "'reasoning_effort' is not supported with this model (it does not reason before answering)",
}
COMMON = {"model", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "min_tokens", "ignore_eos",
          "stream", "stream_options", "user", "frequency_penalty", "presence_penalty", "logit_bias", "prediction",
          "stop_token_ids",
          "service_tier", *SLO_HEADERS}
COMMON |= set(STRUCTURED)  # response_format and the other servers' ways of asking for structured output
KNOWN = {"completions": COMMON | {"prompt", "logprobs", "echo", "best_of"},
         "chat": COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", *TOOL_FIELDS,
                           "add_generation_prompt", "continue_final_message"}}  # vLLM's, for assistant prefill


Prompt = str | tuple[int, ...]  # a completion's prompt: text, or token ids sent as they are


@dataclass(frozen=True)
class Generation:
    # text or token ids, one or a batch (completions; chat: none, its messages are rendered)
    prompts: tuple[Prompt, ...]
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
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: tokens that end the output (kept in it)
    min_tokens: int = 0
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage so far on every chunk
    slo: SLO = SLO()
    tenant: str | None = None  # whose suffix index it shares (suffix_scope "tenant"): OpenAI's `user`, or the key's
    cache_scope: str | None = None  # an isolated tenant's (tenancy.py): its own prefix cache and suffix index
    logprobs: int | None = None  # each token's logprob with this many alternatives (None: not asked)
    echo: bool = False  # completions: the prompt ahead of the text (and its tokens' logprobs, with logprobs)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), as SamplingParams takes it
    prediction: str | None = None  # Predicted Outputs' text (speculation/prediction.py)
    best_of: int = 1  # completions: candidates made of each prompt, the n likeliest returned (>= n)
    service_tier: str | None = None  # OpenAI's, served as an SLO class (service_tiers.py)
    grammar: GrammarSpec | None = None  # structured output (structured.py): every token one it allows
    tools: ToolUse | None = None  # chat: the tools the model may (or must) call (tools.py)
    # chat, as vLLM: the assistant's turn opened after the messages; or the last (assistant) message continued
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @property
    def runs(self) -> int:
        """Generations made of each prompt: best_of candidates, or the n choices."""
        return max(self.n, self.best_of)

    @property
    def generations(self) -> int:
        """What the engine runs for this request: `runs` of each prompt."""
        return self.runs * max(len(self.prompts), 1)


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
        out[name] = (utf8(v, name) if isinstance(v, str) else v) if name == "slo_class" else _number_of_ms(name, v)
    try:
        return SLO(out["tpot_slo_ms"], out["ttft_slo_ms"], out["slo_class"])
    except ValueError as e:
        raise bad(str(e).split()[0], str(e)) from None  # SLO's message starts with the field's name


def _check_fields(body: Mapping, endpoint: str) -> None:
    for name, value in body.items():
        if value is None or name in KNOWN[endpoint]:
            continue
        if name == "best_of" and value == body.get("n"):
            continue  # as many candidates as choices: every candidate is returned, nothing is ranked
        if name in NOT_OFFERED and value not in NEUTRAL.get(name, ()):
            raise bad(name, NOT_OFFERED[name])
        if name in NEUTRAL:
            if value not in NEUTRAL[name]:
                raise bad(name, f"'{name}'={value!r} is not supported by this server (only {NEUTRAL[name][0]!r})")
            continue
        raise bad(name, f"unsupported parameter '{name}'")


def parse(body, endpoint: str, headers: Mapping[str, str] | None = None) -> Generation:
    """`endpoint` is "completions" or "chat"."""
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    _check_fields(body, endpoint)
    messages = None
    if endpoint == "completions":
        prompts = _prompts(body.get("prompt"))
        echo = flag(body, "echo")  # with echo, max_tokens 0 scores the prompt alone (evaluation harnesses)
        max_tokens = integer(body, "max_tokens", 0 if echo else 1, COMPLETIONS_DEFAULT_MAX_TOKENS, INT32_MAX)
        max_tokens_given = True  # OpenAI's completions default (16) is a length of its own, not "what is left"
    else:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("messages", "'messages' must be a non-empty list")
        messages, prompts, echo = tuple(chat_message(i, m) for i, m in enumerate(raw)), [], False
        # OpenAI deprecated max_tokens for chat: with both, max_completion_tokens wins (as vLLM and Triton's
        # frontend take it); the other is still checked, so a malformed one is never passed over silently
        a = body.get("max_completion_tokens")
        legacy = integer(body, "max_tokens", 1, CHAT_DEFAULT_MAX_TOKENS, INT32_MAX)
        max_tokens = legacy if a is None else integer(body, "max_completion_tokens", 1, None, INT32_MAX)
        max_tokens_given = a is not None or body.get("max_tokens") is not None
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if (not isinstance(stop, list) or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)):
        raise bad("stop",
                  f"'stop' must be a string of 1-{MAX_STOP_CHARS} characters or a list of at most {MAX_STOP} of them")
    for s in stop:
        utf8(s, "stop")
    min_tokens = integer(body, "min_tokens", 0, 0, INT32_MAX)
    if min_tokens > max_tokens:
        raise bad("min_tokens", f"'min_tokens' ({min_tokens}) exceeds the maximum ({max_tokens})")
    if flag(body, "ignore_eos"):
        min_tokens = max_tokens  # the engine stops neither at EOS nor at a stop string before min_tokens
    stream = flag(body, "stream")
    options = body.get("stream_options") or {}
    if (not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}
            or not all(isinstance(v, bool) for v in options.values())):
        raise bad("stream_options", "'stream_options' takes include_usage and continuous_usage_stats, booleans")
    if options and not stream:
        raise bad("stream_options", "'stream_options' is only allowed with stream=true")
    top_k = integer(body, "top_k", -1, 0, INT32_MAX)
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or not 0 < len(user) <= MAX_TENANT_CHARS):
        raise bad("user", f"'user' must be a string of 1-{MAX_TENANT_CHARS} characters")
    n = integer(body, "n", 1, 1, MAX_GENERATIONS)
    best_of = integer(body, "best_of", 1, n, MAX_GENERATIONS) if endpoint == "completions" else n
    if best_of < n or (best_of > n and stream):
        raise bad("best_of", f"'best_of' must be at least n ({n})" if best_of < n else
                  "'best_of' above n cannot be streamed (the best candidates are known only at the end)")
    if max(n, best_of) * len(prompts) > MAX_GENERATIONS:
        raise bad("n", f"n={n} choices (best_of {best_of}) of {len(prompts)} prompts are "
                  f"{max(n, best_of) * len(prompts)} generations; at most {MAX_GENERATIONS} per request")
    prefill = assistant_prefill(body, messages) if endpoint == "chat" else {}
    grammar, tools = grammar_of(body), tool_use(body) if endpoint == "chat" else None
    if tools is not None:
        grammar = with_tools(tools, grammar)
    if grammar is not None and min_tokens:
        raise bad("min_tokens" if body.get("min_tokens") else "ignore_eos",
                  "min_tokens and ignore_eos cannot be combined with structured output: the grammar ends the output")
    return Generation(
        **prefill, grammar=grammar, tools=tools, prompts=tuple(prompts), messages=messages,
        max_tokens=max_tokens, max_tokens_given=max_tokens_given, n=n,
        temperature=number(body, "temperature", 0.0, 2.0, DEFAULT_TEMPERATURE),
        top_p=number(body, "top_p", 1e-9, 1.0, 1.0), top_k=max(0, top_k),
        seed=_seed(body),
        stop=tuple(stop), stop_token_ids=_stop_token_ids(body), min_tokens=min_tokens, stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        slo=_slo(body, headers or {}), tenant=utf8(user, "user") if user is not None else None,
        logprobs=_logprobs(body, endpoint), echo=echo,
        frequency_penalty=number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        presence_penalty=number(body, "presence_penalty", -2.0, 2.0, 0.0), logit_bias=_logit_bias(body),
        prediction=_prediction(body), best_of=best_of, service_tier=_service_tier(body),
    )


def _stop_token_ids(body: Mapping) -> tuple[int, ...]:
    raw = body.get("stop_token_ids") or []
    if not (isinstance(raw, list) and len(raw) <= MAX_STOP_TOKEN_IDS and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in raw)):
        raise bad("stop_token_ids", f"'stop_token_ids' must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
    return tuple(raw)


def _seed(body: Mapping) -> int | None:
    """OpenAI takes any 64-bit integer, negative ones too (vLLM's clients send -1); it travels to the
    engine as a uint64, so a negative seed is taken modulo 2**64: the same seed, the same draws."""
    seed = integer(body, "seed", -(2**63), None, 2**64 - 1)
    return None if seed is None else seed % 2**64


SERVICE_TIERS = ("auto", "default", "flex", "priority")  # OpenAI's, served as SLO classes (service_tiers.py)


def _service_tier(body: Mapping) -> str | None:
    value = body.get("service_tier")
    if value is not None and value not in SERVICE_TIERS:
        raise bad("service_tier", f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}, got {shown(value)}")
    return value


def _prediction(body: Mapping) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}."""
    raw = body.get("prediction")
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type") != "content" or set(raw) - {"type", "content"}:
        raise bad("prediction", "'prediction' must be {\"type\": \"content\", \"content\": ...}")
    return text_of(raw.get("content"), "prediction") or None


def _logit_bias(body: Mapping) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token ids (as strings) to biases in [-100, 100]."""
    raw = body.get("logit_bias") or {}
    if not isinstance(raw, dict) or len(raw) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} token ids to biases")
    out = []
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) <= INT32_MAX):
            raise bad("logit_bias", f"'logit_bias' keys are token ids, got {shown(key)}")
        out.append((int(key), number({"logit_bias": value}, "logit_bias", -100.0, 100.0, 0.0)))
    return tuple(out)


def _is_ids(p) -> bool:
    return (isinstance(p, list) and bool(p)
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in p))


def _prompts(prompt) -> list[Prompt]:
    """OpenAI's four forms: a string, a list of strings, a list of token ids, a list of such lists. Ids
    reach the model as they are (the engine checks them against the vocabulary)."""
    if isinstance(prompt, str) or _is_ids(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all((isinstance(p, str) and p) or _is_ids(p)
                                                             for p in prompt):
        raise bad("prompt", "'prompt' must be a non-empty string, a list of them, a list of token ids (integers "
                  f"in [0, {INT32_MAX}]) or a list of such lists")
    return [utf8(p, "prompt") if isinstance(p, str) else tuple(p) for p in prompt]


def _logprobs(body: Mapping, endpoint: str) -> int | None:
    """Completions: `logprobs` N (0: the chosen tokens' only). Chat: `logprobs` true, `top_logprobs` N."""
    if endpoint == "completions":
        return integer(body, "logprobs", 0, None, MAX_LOGPROBS)
    top = integer(body, "top_logprobs", 0, None, MAX_LOGPROBS)
    if not flag(body, "logprobs"):
        if top:
            raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        return None
    return top or 0
