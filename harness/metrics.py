"""Scoring finished requests: SLO attainment, goodput, latency percentiles (one definition, used by
every runner so in-process, Triton and OpenAI-endpoint runs are comparable)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from adaserve_backend.slo import attains, attains_both, attains_ttft, tpot_seconds


@dataclass
class RequestRecord:
    """One sent request as the client saw it. `error` set: rejected, failed or unfinished at the
    time limit; such a request is a violation under every definition."""

    request_id: str
    category: str
    tpot_slo_ms: float
    arrival: float  # seconds, any clock shared by the fields below
    first_token: float | None = None
    last_token: float | None = None
    output_tokens: int = 0
    error: str | None = None
    ttft_slo_ms: float = math.inf
    finish_reason: str | None = None  # "stop" (end of sequence), "length" (max_tokens), ...; None: unfinished
    # seconds between consecutive responses that carried text, as a streaming client sees them (what
    # `vllm bench serve` reports as inter-token latency); empty for an in-process run
    gaps: list[float] = field(default_factory=list)

    def chunk(self, now: float) -> None:
        """A response with text reached the client at `now`."""
        if self.last_token is not None:
            self.gaps.append(now - self.last_token)
        self.first_token = self.first_token or now
        self.last_token = now

    @property
    def finished(self) -> bool:
        return self.error is None and self.first_token is not None

    def take(self, out) -> bool:
        """Apply an engine's RequestOutput (emit times on its clock); True once the request ended."""
        if out.new_token_ids:
            self.first_token = self.first_token or out.emit_time
            self.last_token = out.emit_time
            self.output_tokens = out.num_output_tokens
        if out.finished and out.error:
            self.error = out.error
        if out.finished and out.finish_reason is not None:
            self.finish_reason = str(getattr(out.finish_reason, "value", out.finish_reason))
        return out.finished

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1): TTFT excluded."""
        if self.first_token is None or self.last_token is None:
            return None
        return tpot_seconds(self.first_token, self.last_token, self.output_tokens)

    @property
    def attained(self) -> bool:
        """TTFT and TPOT both within their targets (the primary measure)."""
        return self.finished and attains_both(self.ttft, self.tpot, self.ttft_slo_ms, self.tpot_slo_ms)

    @property
    def tpot_attained(self) -> bool:
        """The paper's measure: TPOT alone, however long the request waited for its first token."""
        return self.finished and attains(self.tpot, self.tpot_slo_ms)

    @property
    def ttft_attained(self) -> bool:
        return self.finished and attains_ttft(self.ttft, self.ttft_slo_ms)

    @property
    def refused(self) -> bool:
        """Turned away by admission (gRPC UNAVAILABLE, HTTP 503), not failed."""
        return self.error is not None and ("unavailable" in self.error.lower() or "503" in self.error)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def fmt_ms(ms: float | None) -> str:
    """A latency for people: ms below a second, seconds above, '-' when there is none."""
    return "-" if ms is None else f"{ms / 1e3:.1f} s" if ms >= 1e3 else f"{ms:.0f} ms"


def summarize(records: Sequence[RequestRecord], wall_s: float) -> dict:
    """Attainment = attained / sent: a request that is rejected, errs or misses the time limit is a
    violation, so an overloaded system cannot look good by finishing few requests. `slo_attainment`
    is joint (TTFT and TPOT); `tpot_slo_attainment` the paper's TPOT-only one. Goodput = output tokens
    of (jointly) attained requests / wall time."""
    finished = [r for r in records if r.finished]
    attained = [r for r in finished if r.attained]
    ttft = [r.ttft * 1e3 for r in finished]
    tpot = [r.tpot * 1e3 for r in finished if r.tpot is not None]

    def share(n: int) -> float:
        return n / len(records) if records else 0.0

    out = {
        "requests": len(records),
        "finished": len(finished),
        "errors": sum(r.error is not None for r in records),
        "slo_attainment": share(len(attained)),
        "tpot_slo_attainment": share(sum(r.tpot_attained for r in finished)),
        "ttft_slo_attainment": share(sum(r.ttft_attained for r in finished)),
        "violations": len(records) - len(attained),
        "goodput_tok_s": sum(r.output_tokens for r in attained) / wall_s if wall_s > 0 else 0.0,
        "throughput_tok_s": sum(r.output_tokens for r in finished) / wall_s if wall_s > 0 else 0.0,
        # with requests ending at end of sequence, systems may generate different lengths: say how long
        "output_tokens_mean": sum(r.output_tokens for r in finished) / len(finished) if finished else None,
        "stopped_at_eos": (sum(r.finish_reason == "stop" for r in finished) / len(finished)
                           if any(r.finish_reason for r in finished) else None),
    }
    itl = [g * 1e3 for r in finished for g in r.gaps]  # pooled over requests, as vllm bench serve does
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    out["itl_ms_mean"] = sum(itl) / len(itl) if itl else None
    # streams whose every gap kept to their own TPOT target (a reader never waited longer than asked)
    paced = [r for r in finished if r.gaps and math.isfinite(r.tpot_slo_ms)]
    out["itl_within_tpot_target"] = (sum(max(r.gaps) * 1e3 <= r.tpot_slo_ms for r in paced) / len(paced)
                                     if paced else None)
    return out


def attainment_timeline(records: Sequence[RequestRecord], window_s: float) -> list[dict]:
    """SLO attainment of the requests arriving in each `window_s` window, per category and overall
    (for a trace whose load moves between categories)."""
    if not records:
        return []
    t0 = min(r.arrival for r in records)
    windows: dict[int, list[RequestRecord]] = {}
    for r in records:
        windows.setdefault(int((r.arrival - t0) // window_s), []).append(r)
    out = []
    for w in sorted(windows):
        recs = windows[w]
        cats = {c: [r for r in recs if r.category == c] for c in sorted({r.category for r in recs})}
        out.append({"start_s": w * window_s, "requests": len(recs),
                    "slo_attainment": sum(r.attained for r in recs) / len(recs),
                    "per_category": {c: sum(r.attained for r in rs) / len(rs) for c, rs in cats.items()}})
    return out
