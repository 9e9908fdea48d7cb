"""Prometheus metrics through the Python backend's `pb_utils.MetricFamily` (Triton's metrics port)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..scheduler.plan import IterationStats

LATENCY_BUCKETS = [0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
ACCEPTED_BUCKETS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16]


class EngineMetrics:
    def __init__(self, pb, slo_classes: list[str]) -> None:
        F = pb.MetricFamily
        self._families = []  # a family must outlive its metrics

        def family(name, description, kind):
            self._families.append(F(name=name, description=description, kind=kind))
            return self._families[-1]

        hist = lambda name, desc, buckets: family(name, desc, F.HISTOGRAM).Metric(labels={}, buckets=buckets)  # noqa: E731
        self.ttft = hist("adaserve_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.tpot = hist("adaserve_time_per_output_token_seconds", "Mean time per output token after the first", LATENCY_BUCKETS)
        self.e2e = hist("adaserve_e2e_request_latency_seconds", "Arrival to last token", LATENCY_BUCKETS)
        self.accepted = hist("adaserve_accepted_tokens_per_verification", "Tokens produced by one tree verification (bonus included)", ACCEPTED_BUCKETS)
        counter = family("adaserve_prompt_tokens_total", "Prompt tokens of finished requests", F.COUNTER)
        self.prompt_tokens = counter.Metric(labels={})
        self.generation_tokens = family("adaserve_generation_tokens_total", "Generated tokens", F.COUNTER).Metric(labels={})
        requests = family("adaserve_requests_total", "Finished requests per SLO class", F.COUNTER)
        attained = family("adaserve_slo_attained_total", "Finished requests that met their TPOT SLO", F.COUNTER)
        self.requests = {c: requests.Metric(labels={"slo_class": c}) for c in slo_classes}
        self.attained = {c: attained.Metric(labels={"slo_class": c}) for c in slo_classes}
        gauge = lambda name, desc: family(name, desc, F.GAUGE).Metric(labels={})  # noqa: E731
        self.running = gauge("adaserve_running_requests", "Requests being prefilled or decoded")
        self.waiting = gauge("adaserve_waiting_requests", "Requests waiting for admission")
        self.blocks_used = gauge("adaserve_kv_blocks_used", "Target KV cache blocks in use")
        self.blocks_free = gauge("adaserve_kv_blocks_free", "Target KV cache blocks free")
        self.budget = gauge("adaserve_token_budget", "Tokens verified per iteration (B)")
        self.depth = gauge("adaserve_speculation_depth", "Draft beam depth d of the last iteration")
        self.width = gauge("adaserve_speculation_width", "Draft beam width w of the last iteration")

    def on_finish(self, slo_class: str, prompt_tokens: int, output_tokens: int, ttft: float, tpot: float | None, e2e: float, attained: bool) -> None:
        self.prompt_tokens.increment(prompt_tokens)
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)
        if tpot is not None:
            self.tpot.observe(tpot)
        self.requests[slo_class].increment(1)
        if attained:
            self.attained[slo_class].increment(1)

    def on_step(self, engine, new_tokens: int, iteration: IterationStats | None) -> None:
        self.generation_tokens.increment(new_tokens)
        self.running.set(len(engine.running))
        self.waiting.set(len(engine.waiting))
        blocks = engine.target.blocks
        self.blocks_used.set(blocks.num_blocks - blocks.num_free_blocks)
        self.blocks_free.set(blocks.num_free_blocks)
        self.budget.set(engine.budget)
        if iteration:
            self.accepted.observe(iteration.accepted / iteration.n)
            self.depth.set(iteration.depth)
            self.width.set(iteration.width)
