"""How the scheduler is configured: the policy, admission, SLO classes, overload."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..slo import BEST_EFFORT, SLO

# Policy names; scheduler/policies.py builds the objects (and checks it knows exactly these), "spec:N" besides.
POLICY_NAMES = ("adaserve", "continuous", "sarathi", "priority")
SPECULATIVE_POLICIES = ("adaserve",)  # and every spec:N



def check_policy_name(name: str) -> str:
    if name.startswith("spec:"):
        n = name[5:]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"spec:N needs a positive integer N, got {name!r}")
    elif name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICY_NAMES + ('spec:N',))}")
    return name


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


# The served classes, and the benchmark's targets (harness/slo_targets.py reads them here): the one place
# they are set. What a user of each kind asks for, whatever the machine (docs/benchmarking.md#targets):
# summaries stream a little faster than people read (about 5 tokens/s silently), chat twice that so a
# skimming reader never waits, code completions faster still, since code is pasted, not read as it
# streams. First tokens within 2 s for the interactive classes (MLPerf's server-scenario limit), 5 s
# for summaries, a background job with prompts several times longer.
DEFAULT_SLO_CLASSES = (SLOClass("coding", 65.0, 2000.0), SLOClass("chat", 80.0, 2000.0),
                       SLOClass("summary", 150.0, 5000.0))


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
      that are just on track fall behind). 1.0 by default: on_track is about a request's mean time per
      token, over which the per-iteration noise averages out, and with 1.15 the batch stopped short of
      what the tightest class allows (docs/scheduling.md#admission).
    first_token_margin_ms: the scheduler plans each first token this long before its TTFT deadline,
      for the response to reach the client (admission runs first tokens up to their deadlines, so
      without it the client's TTFT p99 lands just over the target by the response's delivery time).
      0 (the default) for in-process use; the served engine.json sets 200: smaller margins left the
      ensemble's delivery p99 and late prefill chunks under overload over class targets
      (docs/scheduling.md#first-token-deadlines-and-overload).
    tpot_margin: the scheduler plans each request's time per token this share under its TPOT target
      (admission, prefill pacing and the SLO-customized selection all aim there). Pacing spends every
      decoding request's slack on prefill chunks, so without a margin requests end at their target
      exactly, and the client, whose clock includes delivery, sees a share of them just over it.
      0 (the default) for in-process use.
    output_length_quantile: clients give `max_tokens` as a cap and outputs end at end of sequence, so
      the scheduler plans each decoding request's remaining tokens from the lengths of requests like
      it that finished (scheduler/output_lengths.py): between the 1 - q and the q quantile of those
      longer than what it produced so far, the pessimistic end each time. None: plan with the cap.
    burst_deferral: when the waiting requests cannot all get their first tokens in time, hold back
      the longest prefills until the rest can (Moore-Hodgson, scheduler/deadlines.deferred_in_burst):
      the most requests served in time in a burst, not the first ones in deadline order.
    spare_decodes: the prefill chunk first-token deadlines need overrides pacing only as far as every
      decoding request that can still make its SLO still can (prefill_pacing.spared_prefill); False: as far as
      the deadlines need.
    eager_prefill: prefill as far as every decoding request that can still make its SLO still can
      (spared_prefill), whether or not a first-token deadline needs it: first tokens come as early as the
      decodes allow rather than just in time, so a burst's TTFTs stay short while the slack lasts.
    prefill_within_tpot: a prefill chunk beside decoding requests keeps the iteration within the tightest
      of their TPOT targets, except as far as first-token deadlines need more
      (prefill_pacing.chunk_within_tpot): no stream stalls for longer than the pace its request asked
      for while prompts are prefilled, at the price of a prompt taking more, shorter iterations.
    arrival_order_within: serve first tokens (admission and prefill chunks) in arrival order while that
      brings every one within this share of its request's time to its deadline (from arrival), predicted
      as if the waiting requests started only after the next iteration
      (deadlines.arrival_order_on_time); earliest deadline first otherwise. None (the default): always
      deadline order; the served engine.json sets 1.0 (docs/scheduling.md#first-token-deadlines-and-overload). Deadline
      order spends the loose classes' TTFT slack even when nothing needs it: a summary waits behind
      every coding request due before it, so TTFT's tail is the summaries' however light the load.
      Below 1 keeps part of each deadline for the arrivals of a burst still to come.
    slo_classes / default_slo_class: named TPOT and TTFT targets a request may pick instead of numbers
      (DEFAULT_SLO_CLASSES unless a config sets its own); the default class fills in what a request
      leaves open. With no default class (None, the default) a
      request that names no target (or names the class "best_effort") is best effort: it is never
      refused for a deadline it did not ask for, runs on the capacity the requests with SLOs leave
      (SLO-aware admission preempts it for one that would otherwise miss), and is bounded only by
      max_waiting and max_request_s.
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
    # A request whose TPOT target only a lone request meets holds every other admission while it runs;
    # it does so for at most this long (a client declaring such a target cannot starve the others).
    exclusive_hold_s: float = 10.0
    # Requests waiting for admission (queued or not yet scheduled) beyond which the served model refuses
    # new ones at once (UNAVAILABLE / 503 with Retry-After): overload is answered, not queued without bound.
    max_waiting: int = 256
    # A request still unfinished this long after it arrived is ended with an error (its blocks freed):
    # no request, however its client paces it, holds the server's memory without bound. None: no limit
    # (in-process use); the served engine.json sets one.
    max_request_s: float | None = None
    # Decode and prefill-only iteration records kept, each kind (about 600 bytes a record): what benchmarks
    # and the profiler read after an in-process run. A server reads only the last, and a longer history
    # is memory that grows for as long as the history fills (the served engine.json keeps a few hundred).
    stats_history: int = 10_000
    admission_headroom: float = 1.0
    first_token_margin_ms: float = 0.0
    tpot_margin: float = 0.0
    output_length_quantile: float | None = 0.9
    burst_deferral: bool = True
    spare_decodes: bool = False
    eager_prefill: bool = False
    prefill_within_tpot: bool = False
    arrival_order_within: float | None = None
    slo_classes: tuple[SLOClass, ...] = DEFAULT_SLO_CLASSES
    default_slo_class: str | None = None
    overload: str = "reject"
    # OpenAI's service_tier -> the SLO class it is served in ("priority", "flex", "default"); None: priority
    # the tightest class by TPOT target, flex the loosest, default the request's own (openai_frontend/service_tiers.py)
    service_tiers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        classes = tuple(c if isinstance(c, SLOClass) else SLOClass(**c) for c in self.slo_classes)
        object.__setattr__(self, "slo_classes", classes)
        check_policy_name(self.policy)
        if self.default_slo_class is not None and self.default_slo_class not in {c.name for c in classes}:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not among slo_classes")
        if self.max_num_seqs <= 0 or self.prefill_chunk <= 0 or self.token_budget <= 0:
            raise ValueError("max_num_seqs, prefill_chunk and token_budget must be positive")
        if not all(math.isfinite(v) and v > 0
                   for v in (self.exclusive_hold_s, self.max_request_s or 1.0)) or self.max_waiting < 1:
            raise ValueError("exclusive_hold_s and max_request_s must be positive numbers of seconds, max_waiting >= 1")
        if not isinstance(self.stats_history, int) or isinstance(self.stats_history, bool) or self.stats_history < 1:
            raise ValueError(f"stats_history must be an integer >= 1, got {self.stats_history!r}")
        for flag in ("spare_decodes", "burst_deferral", "eager_prefill", "prefill_within_tpot"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.admission_headroom < 1.0:
            raise ValueError("admission_headroom must be >= 1")
        if not (isinstance(self.tpot_margin, (int, float)) and 0.0 <= self.tpot_margin < 0.5):
            raise ValueError(f"tpot_margin must be a share of the TPOT target in [0, 0.5), got {self.tpot_margin!r}")
        if not (math.isfinite(self.first_token_margin_ms) and self.first_token_margin_ms >= 0):
            raise ValueError(f"first_token_margin_ms must be a number of ms >= 0, got {self.first_token_margin_ms}")
        w = self.arrival_order_within
        if w is not None and not (isinstance(w, (int, float)) and 0.0 < w <= 1.0):
            raise ValueError(f"arrival_order_within must be a share of the TTFT deadline in (0, 1] or null, got {w!r}")
        q = self.output_length_quantile
        if q is not None and not (isinstance(q, (int, float)) and 0.5 <= q < 1.0):
            raise ValueError(f"output_length_quantile must be in [0.5, 1) or null, got {q!r}")
        if BEST_EFFORT in {c.name for c in classes}:
            raise ValueError(f"{BEST_EFFORT!r} is the class of requests without targets, not a configurable one")
        tiers = self.service_tiers
        if tiers is not None and (not isinstance(tiers, dict) or set(tiers) - {"priority", "flex", "default"}
                                  or any(v not in {c.name for c in classes} for v in tiers.values())):
            raise ValueError(f"service_tiers maps priority, flex and default to slo_classes names, got {tiers!r}")
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
        """The request's targets with what it left open taken from its class (or the default class, if
        any), and the class it is counted under: its own, "custom" when it gave its own targets, else
        the default, else BEST_EFFORT (no targets). ValueError for an unknown class."""
        if slo.slo_class == BEST_EFFORT or (slo == SLO() and self.default_slo_class is None):
            return SLO(slo_class=BEST_EFFORT)
        name = slo.slo_class or self.default_slo_class
        cls = self.slo_class(name) if name is not None else None
        label = slo.slo_class or ("custom" if slo.tpot_ms is not None or cls is None else name)
        return SLO(slo.tpot_ms or (cls and cls.tpot_ms), slo.ttft_ms or (cls and cls.ttft_ms), label)
