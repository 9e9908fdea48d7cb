"""The soak's statistics and its verdict against issue 71's targets: no hang, no KV block left in use
once the load has drained, server memory grown by less than 2% from the end of the warm-up window to
the end, the last window's TTFT p99 within 10% of the first window's, and every hostile request
answered with a clear 4xx.

The windows are `window_s` long: five minutes by default, a fifth of the run for runs shorter than
25 minutes (so a short proof run still has a warm-up, a first and a last window that do not overlap).
The first window is also the warm-up: memory growth is measured from its end, since the first
requests fill allocator arenas, caches and the suffix index's first pages; the first TTFT window
includes it on purpose, as the baseline the end of the run must hold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from harness.metrics import percentile

from .soak_records import COMPLETE, DONE, HOSTILE, ServerSample, SoakRecord

DEFAULT_WINDOW_S = 300.0
MEMORY_GROWTH_LIMIT = 0.02
TTFT_P99_RATIO_LIMIT = 1.10


def window_s(duration_s: float, window: float | None = None) -> float:
    """The window length: `window` if given, else five minutes, at most a fifth of the run."""
    if window is not None:
        if not 0 < window <= duration_s / 2:
            raise ValueError(f"a window of {window:g} s does not fit twice in a {duration_s:g} s run")
        return window
    return min(DEFAULT_WINDOW_S, duration_s / 5)


def ttft_ms(records: Sequence[SoakRecord], start_s: float, end_s: float) -> list[float]:
    """TTFTs (ms) of the requests that arrived in [start_s, end_s) and ran to their end, not cancelled
    nor dropped (those a client leaves early are planned to, whatever their TTFT)."""
    return [r.ttft_s * 1e3 for r in records
            if r.kind == COMPLETE and r.outcome == DONE and r.ttft_s is not None and start_s <= r.arrival_s < end_s]


def memory_growth(samples: Sequence[ServerSample], warm_up_s: float) -> tuple[float | None, float | None, float | None]:
    """(RSS at the first sample at or after `warm_up_s`, RSS at the last sample, growth as a fraction);
    Nones if no sample falls after the warm-up or only one does."""
    after = [s for s in samples if s.t_s >= warm_up_s and s.triton_rss_mib > 0]
    if len(after) < 2:
        return None, None, None
    first, last = after[0].triton_rss_mib, after[-1].triton_rss_mib
    return first, last, (last - first) / first


def growth_by_process(samples: Sequence[ServerSample], warm_up_s: float) -> dict[str, dict[str, float]]:
    """Per process of tritonserver's tree, its RSS (MiB) at the first sample after the warm-up and at
    the last: which model a growth is in."""
    after = [s for s in samples if s.t_s >= warm_up_s and s.processes_mib]
    if len(after) < 2:
        return {}
    first, last = after[0].processes_mib, after[-1].processes_mib
    return {p: {"start_mib": first[p], "end_mib": last[p], "growth_mib": last[p] - first[p]}
            for p in first if p in last}


def hostile_misses(records: Sequence[SoakRecord]) -> list[SoakRecord]:
    """Hostile requests not answered with a 4xx in OpenAI's error shape (a hang is one too)."""
    return [r for r in records if r.kind == HOSTILE
            and not (r.status is not None and 400 <= r.status < 500 and r.explained)]


@dataclass(frozen=True)
class Verdict:
    target: str
    value: str
    limit: str
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SoakStats:
    """What the verdict is drawn from."""

    hangs: int
    kv_blocks_used: float | None  # after the drain; None: the metrics port did not answer
    rss_start_mib: float | None
    rss_end_mib: float | None
    memory_growth: float | None
    ttft_p99_first_ms: float | None
    ttft_p99_last_ms: float | None
    ttft_first_n: int
    ttft_last_n: int
    hostile_sent: int
    hostile_misses: int

    def to_dict(self) -> dict:
        return asdict(self)


def soak_stats(records: Sequence[SoakRecord], samples: Sequence[ServerSample], kv_blocks_used: float | None,
               duration_s: float, window: float) -> SoakStats:
    first, last = ttft_ms(records, 0.0, window), ttft_ms(records, duration_s - window, duration_s)
    rss_start, rss_end, growth = memory_growth(samples, window)
    return SoakStats(hangs=sum(r.hung for r in records), kv_blocks_used=kv_blocks_used, rss_start_mib=rss_start,
                     rss_end_mib=rss_end, memory_growth=growth, ttft_p99_first_ms=percentile(first, 99),
                     ttft_p99_last_ms=percentile(last, 99), ttft_first_n=len(first), ttft_last_n=len(last),
                     hostile_sent=sum(r.kind == HOSTILE for r in records),
                     hostile_misses=len(hostile_misses(records)))


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def judge(stats: SoakStats) -> list[Verdict]:
    """One verdict per target; a quantity that could not be measured fails its target."""
    growth, first, last = stats.memory_growth, stats.ttft_p99_first_ms, stats.ttft_p99_last_ms
    ratio = last / first if first and last is not None else None
    return [
        Verdict("hangs", str(stats.hangs), "0", stats.hangs == 0),
        Verdict("KV blocks in use after the drain", _fmt(stats.kv_blocks_used, ".0f"), "0",
                stats.kv_blocks_used == 0),
        Verdict("server memory growth after the warm-up", _fmt(None if growth is None else growth * 100, "+.2f", "%")
                + f" ({_fmt(stats.rss_start_mib, ',.0f')} -> {_fmt(stats.rss_end_mib, ',.0f')} MiB)",
                f"< {MEMORY_GROWTH_LIMIT:.0%}", growth is not None and growth < MEMORY_GROWTH_LIMIT),
        Verdict("TTFT p99, last window / first", _fmt(ratio, ".2f", "x")
                + f" ({_fmt(last, '.0f', ' ms')} of {stats.ttft_last_n} / {_fmt(first, '.0f', ' ms')} of "
                  f"{stats.ttft_first_n})",
                f"<= {TTFT_P99_RATIO_LIMIT:.2f}x", ratio is not None and ratio <= TTFT_P99_RATIO_LIMIT),
        Verdict("hostile requests without a clear 4xx", f"{stats.hostile_misses} of {stats.hostile_sent}", "0",
                stats.hostile_misses == 0),
    ]


def ttft_timeline(records: Sequence[SoakRecord], duration_s: float, bucket_s: float) -> list[dict]:
    """TTFT p99 (and count) of the completed requests arriving in each `bucket_s` stretch: the plot's line."""
    out = []
    start = 0.0
    while start < duration_s:
        values = ttft_ms(records, start, start + bucket_s)
        out.append({"start_s": start, "n": len(values), "ttft_p99_ms": percentile(values, 99)})
        start += bucket_s
    return out


def outcome_counts(records: Sequence[SoakRecord]) -> dict[str, dict[str, int]]:
    """kind -> outcome -> requests."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        kind = out.setdefault(r.kind, {})
        kind[str(r.outcome)] = kind.get(str(r.outcome), 0) + 1
    return out
