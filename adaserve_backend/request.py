"""What a request carries in, and what the engine reports back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from .grammar.spec import GrammarSpec
from .slo import SLO


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy. top_k 0 and top_p 1.0 disable those filters. seed makes one
    request's sampling reproducible. frequency_penalty, presence_penalty and logit_bias ((token id,
    bias) pairs) change the logits before any choice, as OpenAI defines them: a token's logit less
    frequency_penalty times its count in the output so far, less presence_penalty once it occurs, plus
    its bias (sampling.adjusted)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2 <= v <= 2):
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS or any(not (math.isfinite(b) and -100 <= b <= 100)
                                                        for _, b in self.logit_bias):
            raise ValueError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens, each biased by [-100, 100]")
        # what a torch.Generator takes: checked here, since a seed it refused failed the engine's whole step
        # when the request was taken in (the request itself then never answered)
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must be in [-2**63, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts(self) -> bool:
        """Whether the logits change before a choice (penalties or a bias)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias)


MAX_LOGIT_BIAS = 300  # tokens a request may bias (OpenAI's bound)
MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's bound)


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's distribution at its position
    (sampling.token_logprobs says which), and the `top` most likely tokens there, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class FinishReason(str, Enum):  # a str: the wire value is .value, and it compares equal to it
    STOP = "stop"  # an end-of-sequence token, a stop token or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled by the client
    ERROR = "error"
    REJECTED = "rejected"  # SLO-aware admission could not meet its first-token deadline (overload: reject)


@dataclass(frozen=True)
class RequestStats:
    """Speculation counters and scheduling record of one request so far."""

    verifications: int = 0
    draft_tokens: int = 0  # draft tokens sent to verification
    accepted_drafts: int = 0
    queue_wait_s: float | None = None  # arrival to first admission (rejected: to the rejection); None: still waiting
    overload: str | None = None  # why admission gave up its first-token deadline (rejected, or best_effort)
    predicted_ttft_s: float | None = None  # arrival to the first token as predicted when it was admitted
    predicted_length: int | None = None  # output tokens, the median first predicted (scheduler/output_lengths.py)
    accepted_prediction_tokens: int = 0  # output tokens that verification accepted from the client's prediction
    prediction_tokens: int = 0  # the prediction's length

    @property
    def rejected_prediction_tokens(self) -> int:
        """OpenAI's count: the prediction's tokens that did not become output."""
        return max(0, self.prediction_tokens - self.accepted_prediction_tokens)

    @property
    def slo_missed(self) -> bool:
        return self.overload is not None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_drafts / self.draft_tokens if self.draft_tokens else 0.0


# What a client is told when the server failed it: never the exception's own text (paths, internals),
# which goes to the server's log where the failure is caught.
INTERNAL_ERROR = "internal error (the server's log has the details)"


class Overloaded(RuntimeError):
    """A request refused at once: too many are waiting already (SchedulerConfig.max_waiting), or the
    engine is not running."""


MAX_TENANT_CHARS = 256
MAX_STOP_WORDS = 16
MAX_STOP_CHARS = 1000  # per stop string: each one is matched against the output's tail every step
MAX_STOP_TOKEN_IDS = 256  # each emitted token is looked up among them


@dataclass(frozen=True)
class Request:
    """One generation request. `slo`: its latency targets as asked (slo.SLO; the engine resolves what it
    leaves open from the configured classes). `arrival_time` (time.monotonic()) defaults to when the
    engine receives it."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int = 64
    min_tokens: int = 0
    sampling: SamplingParams = SamplingParams()
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    slo: SLO = SLO()
    arrival_time: float | None = None
    tenant: str | None = None  # whose suffix index it reads and feeds (SpeculationConfig.suffix_scope "tenant")
    # An isolated party's scope: its prefix-cache blocks and suffix index are shared only with requests
    # of the same scope (kv_cache/block_pool.scope_root, speculation/copies.py); None: as before.
    cache_scope: str | None = None
    # None: no log-probabilities; N >= 0: each emitted token's, with the N likeliest alternatives
    logprobs: int | None = None
    # None: none; N >= 0: each prompt token's (the first has none), with the N likeliest alternatives, on
    # the first output. The whole prompt is then computed: no prefix is taken from the cache for it.
    prompt_logprobs: int | None = None
    # Predicted Outputs: token ids the client expects most of the output to repeat, copied into the
    # speculation trees (speculation/prediction.py); the output is the same with or without them.
    prediction: tuple[int, ...] = ()
    # Structured output: every output token is one the grammar allows (grammar/), speculated ones too.
    grammar: GrammarSpec | None = None

    def validate(self, vocab_size: int, max_model_len: int) -> None:
        """Raise ValueError with a message a client can act on."""
        if not self.prompt_ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < vocab_size for t in self.prompt_ids):
            raise ValueError(f"prompt token ids must lie in [0, {vocab_size})")
        if any(not 0 <= t < vocab_size for t in self.prediction):
            raise ValueError(f"prediction token ids must lie in [0, {vocab_size})")
        if len(self.prediction) > max_model_len:
            raise ValueError(f"a prediction of {len(self.prediction)} tokens is longer than the context "
                             f"({max_model_len})")
        if any(not 0 <= t < vocab_size for t, _ in self.sampling.logit_bias):
            raise ValueError(f"logit_bias token ids must lie in [0, {vocab_size})")
        if any(not 0 <= t < vocab_size for t in self.stop_token_ids) or len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} token ids in [0, {vocab_size})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.grammar is not None and (self.min_tokens or self.ignore_eos):
            raise ValueError("min_tokens and ignore_eos cannot be combined with a grammar (response_format): "
                             "the grammar decides where the output ends")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {n}")
        if self.tenant is not None and not 0 < len(self.tenant) <= MAX_TENANT_CHARS:
            raise ValueError(f"a tenant is 1-{MAX_TENANT_CHARS} characters")
        if self.cache_scope is not None and not 0 < len(self.cache_scope) <= MAX_TENANT_CHARS:
            raise ValueError(f"a cache_scope is 1-{MAX_TENANT_CHARS} characters")
        if len(self.stop_strings) > MAX_STOP_WORDS or any(len(w) > MAX_STOP_CHARS for w in self.stop_strings):
            raise ValueError(f"at most {MAX_STOP_WORDS} stop_words of at most {MAX_STOP_CHARS} characters each")
        if len(self.prompt_ids) + self.max_tokens > max_model_len:
            raise ValueError(
                f"prompt ({len(self.prompt_ids)} tokens) + max_tokens ({self.max_tokens}) exceeds "
                f"the model's context of {max_model_len} tokens"
            )


@dataclass
class RequestOutput:
    """Incremental: `new_token_ids` holds only what this iteration produced. Times are monotonic."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    emit_time: float = 0.0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt's, taken from the prefix cache
    num_output_tokens: int = 0
    slo: SLO = SLO()  # the resolved targets it was served under
    stats: RequestStats = field(default_factory=RequestStats)
    new_logprobs: list[TokenLogprob] | None = None  # one per new token, where the request asked for them
    # with the first output, where the request asked: one per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
