"""Prometheus metrics through the Python backend's `pb_utils.MetricFamily` (Triton's metrics port)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..scheduler.deadlines import NO_CAPACITY, UNREACHABLE

if TYPE_CHECKING:
    from ..scheduler.plan import IterationStats


ENGINE_UP = "adaserve_engine_up"  # read by the OpenAI frontend's /health

@dataclass(frozen=True)
class Finished:
    """One ended request, as the metrics count it. A rejected request has no first token: a violation of
    every target. `overload`: why admission gave up its first-token deadline, if it did."""

    slo_class: str
    prompt_tokens: int
    output_tokens: int
    ttft: float | None
    tpot: float | None
    e2e: float
    queue_wait: float | None
    ttft_attained: bool
    tpot_attained: bool
    rejected: bool = False
    overload: str | None = None
    predicted_ttft: float | None = None  # as admission predicted it
    predicted_length: int | None = None  # output tokens, as the scheduler first predicted them

QUEUE_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0]
LATENCY_BUCKETS = [0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
ACCEPTED_BUCKETS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16]
# measured / predicted: edges at 1 -+ 5, 10, 15, 20, 25 and 50%, so the share of predictions within each
# error reads off the buckets (benchmarks/prediction_error.py), and at 1/1.15 and 1/1.5
LENGTH_ERROR_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]  # |predicted - actual| output tokens
RATIO_BUCKETS = [0.5, 0.67, 0.75, 0.8, 0.85, 0.87, 0.9, 0.95, 1.05, 1.1, 1.15, 1.2, 1.25, 1.5, 2.0, 3.0]
FLUSH_S = 0.5  # per-step metrics are published this often (Prometheus scrapes every few seconds)


def suffix_index(engine):
    """The engine's cross-request suffix index, or None (no draft worker, or suffix speculation off)."""
    copies = getattr(engine.draft, "copies", None)
    return getattr(copies, "suffix", None)


class EngineMetrics:
    def __init__(self, pb, slo_classes: list[str]) -> None:
        F = pb.MetricFamily
        self._families = []  # a family must outlive its metrics
        self._tokens, self._accepted, self._shape, self._flushed, self._stale = 0, [], None, float("-inf"), False
        self._step_ratios: list[float] = []
        self._step_parts = [0.0, 0.0, 0]  # target forward s, rest s, steps since the last publication

        def family(name, description, kind):
            self._families.append(F(name=name, description=description, kind=kind))
            return self._families[-1]

        def hist(name, desc, buckets):
            return family(name, desc, F.HISTOGRAM).Metric(labels={}, buckets=buckets)

        self.ttft = hist("adaserve_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.tpot = hist("adaserve_time_per_output_token_seconds",
                         "Mean time per output token after the first", LATENCY_BUCKETS)
        self.e2e = hist("adaserve_e2e_request_latency_seconds", "Arrival to last token", LATENCY_BUCKETS)
        self.accepted = hist("adaserve_accepted_tokens_per_verification",
                             "Tokens produced by one tree verification (bonus included)", ACCEPTED_BUCKETS)
        counter = family("adaserve_prompt_tokens_total", "Prompt tokens of finished requests", F.COUNTER)
        self.prompt_tokens = counter.Metric(labels={})
        self.generation_tokens = family("adaserve_generation_tokens_total", "Generated tokens",
                                        F.COUNTER).Metric(labels={})
        # The target's forward is the part a slower machine slows in proportion; the rest (drafting,
        # scheduling, acceptance, bookkeeping) is where a server that slows itself would show first.
        parts = family("adaserve_step_seconds_total", "Decode steps' wall time: the target's forward and the "
                       "rest (draft, scheduling, selection, acceptance, applying results)", F.COUNTER)
        self.step_seconds = {p: parts.Metric(labels={"part": p}) for p in ("target_forward", "rest")}
        self.steps = family("adaserve_steps_total", "Decode steps timed", F.COUNTER).Metric(labels={})
        self.step_error = hist("adaserve_step_time_measured_over_predicted",
                               "A decode step's wall time over the estimator's "
                               "prediction before it ran", RATIO_BUCKETS)
        self.ttft_error = hist("adaserve_ttft_measured_over_predicted",
                               "An admitted request's time to first token over what "
                               "admission predicted", RATIO_BUCKETS)
        self.queue_wait = hist("adaserve_queue_wait_seconds",
                               "Arrival to admission (rejected: to the rejection)", QUEUE_BUCKETS)
        def per_class(name, desc):
            return {c: family(name, desc, F.COUNTER).Metric(labels={"slo_class": c}) for c in slo_classes}

        self.requests = per_class("adaserve_requests_total", "Ended requests per SLO class, rejected ones included")
        self.attained = per_class("adaserve_slo_attained_total", "Requests that met both their TTFT and TPOT targets")
        self.ttft_attained = per_class("adaserve_ttft_slo_attained_total",
                                       "Requests whose first token came within the TTFT target")
        self.tpot_attained = per_class("adaserve_tpot_slo_attained_total",
                                       "Requests that met their TPOT target (rejected: not)")
        lengths = family("adaserve_output_length_error_tokens", "How far an output's length (ended at end of "
                         "sequence) was from the scheduler's first median prediction", F.HISTOGRAM)
        self.length_error = {c: lengths.Metric(labels={"slo_class": c}, buckets=LENGTH_ERROR_BUCKETS)
                             for c in slo_classes}
        reasons = (UNREACHABLE, NO_CAPACITY)
        rejected = family("adaserve_requests_rejected_total",
                          "Requests rejected because no admissible schedule met their first-token deadline", F.COUNTER)
        late = family("adaserve_requests_best_effort_total",
                      "Requests kept past a first-token deadline admission gave up (overload best_effort)", F.COUNTER)
        self.rejected = {r: rejected.Metric(labels={"reason": r}) for r in reasons}
        self.best_effort = {r: late.Metric(labels={"reason": r}) for r in reasons}
        gauge = lambda name, desc: family(name, desc, F.GAUGE).Metric(labels={})  # noqa: E731
        counter_metric = lambda name, desc: family(name, desc, F.COUNTER).Metric(labels={})  # noqa: E731
        self.running = gauge("adaserve_running_requests", "Requests being prefilled or decoded")
        self.waiting = gauge("adaserve_waiting_requests", "Requests waiting for admission")
        self.blocks_used = gauge("adaserve_kv_blocks_used", "Target KV cache blocks in use")
        self.blocks_free = gauge("adaserve_kv_blocks_free", "Target KV cache blocks free")
        self.budget = gauge("adaserve_token_budget", "Tokens verified per iteration (B)")
        # bounded in tokens (speculation.suffix_max_tokens), not bytes: until it is full the process grows
        self.suffix_tokens = gauge("adaserve_suffix_index_tokens", "Tokens held by the cross-request suffix index")
        self.prefix_queried = counter_metric("adaserve_prefix_cache_queried_tokens_total",
                                             "Prompt tokens starting requests looked up in the prefix cache")
        self.prefix_hit = counter_metric("adaserve_prefix_cache_hit_tokens_total",
                                         "Prompt tokens served from the prefix cache (not prefilled)")
        self._prefix_seen = (0, 0)
        self.depth = gauge("adaserve_speculation_depth", "Draft beam depth d of the last iteration")
        self.width = gauge("adaserve_speculation_width", "Draft beam width w of the last iteration")
        self.engine_up = gauge(ENGINE_UP,
                               "1 while the engine loop runs; 0 once it failed for good (requests are refused)")
        self.engine_up.set(1)

    def engine_failed(self) -> None:
        self.engine_up.set(0)

    def on_finish(self, r: Finished) -> None:
        if r.queue_wait is not None:
            self.queue_wait.observe(r.queue_wait)
        self.requests[r.slo_class].increment(1)
        if r.overload is not None:
            (self.rejected if r.rejected else self.best_effort)[r.overload].increment(1)
        if r.rejected:
            return
        self.prompt_tokens.increment(r.prompt_tokens)
        self.e2e.observe(r.e2e)
        for value, hist in ((r.ttft, self.ttft), (r.tpot, self.tpot)):
            if value is not None:
                hist.observe(value)
        if r.predicted_length is not None:
            self.length_error[r.slo_class].observe(abs(r.output_tokens - r.predicted_length))
        if r.ttft is not None and r.predicted_ttft:
            self.ttft_error.observe(r.ttft / r.predicted_ttft)
        for met, counter in ((r.ttft_attained, self.ttft_attained), (r.tpot_attained, self.tpot_attained),
                             (r.ttft_attained and r.tpot_attained, self.attained)):
            if met:
                counter[r.slo_class].increment(1)

    def on_step(self, engine, new_tokens: int, iteration: IterationStats | None, now: float) -> None:
        """Counts every step, publishes at most every FLUSH_S: each metric update is a round trip to the
        server process (and a wake-up of it, on cores the engine's threads use)."""
        self._tokens += new_tokens
        if iteration:
            self._accepted.append(iteration.accepted / iteration.n)
            if iteration.predicted > 0 and iteration.step > 0:
                self._step_ratios.append(iteration.step / iteration.predicted)
            if iteration.step > 0:
                self._step_parts[0] += iteration.target_forward
                self._step_parts[1] += max(iteration.step - iteration.target_forward, 0.0)
                self._step_parts[2] += 1
            self._shape = (iteration.depth, iteration.width)
        self._stale = True
        if now - self._flushed >= FLUSH_S:
            self.publish(engine, now)

    def publish(self, engine, now: float) -> None:
        """What the steps since the last publication changed; a no-op if none ran (the engine loop calls
        it when it goes idle, so freed blocks and an empty batch show without another step)."""
        if not self._stale:
            return
        self._stale, self._flushed = False, now
        if self._tokens:
            self.generation_tokens.increment(self._tokens)
        for value in self._accepted:
            self.accepted.observe(value)
        for value in self._step_ratios:
            self.step_error.observe(value)
        forward, rest, steps = self._step_parts
        if steps:
            self.step_seconds["target_forward"].increment(forward)
            self.step_seconds["rest"].increment(rest)
            self.steps.increment(steps)
        self._tokens, self._accepted, self._step_ratios, self._step_parts = 0, [], [], [0.0, 0.0, 0]
        self.running.set(len(engine.running))
        self.waiting.set(len(engine.waiting))
        blocks = engine.target.blocks
        self.blocks_used.set(blocks.num_blocks - blocks.num_free_blocks)
        self.blocks_free.set(blocks.num_free_blocks)
        self.budget.set(engine.budget)
        if (suffix := suffix_index(engine)) is not None:
            self.suffix_tokens.set(suffix.num_tokens)
        stats = engine.scheduler.prefix_stats
        queried, hit = stats.queried - self._prefix_seen[0], stats.hit - self._prefix_seen[1]
        if queried or hit:
            self.prefix_queried.increment(queried)
            self.prefix_hit.increment(hit)
            self._prefix_seen = (stats.queried, stats.hit)
        if self._shape is not None:
            self.depth.set(self._shape[0])
            self.width.set(self._shape[1])
