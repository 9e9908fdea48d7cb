"""The requests of a side-by-side run (benchmarks/vs_peers.py): per load level K windows of arrivals
(K Poisson or gamma draws, or K stretches of a real trace), each window its own requests dealt from the
run's one prompt deck, chat prompts rendered to text, each window with its burst (the most arrivals in
5 s) and, once the machine's peak prefill rate is known, its prefill-only bound; once a system has run
it, the decode-aware bound of that run (its own output lengths: the bound's decode work).

Every window's requests are new to every server: the deck deals without replacement across all levels
and windows, so several windows cost prompts, not repeats.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from harness.decode_bound import TwoPhaseJob, decode_aware_bound
from harness.decode_ceiling import decode_aware_ceiling
from harness.metrics import RequestRecord
from harness.prefill_bound import BoundResult, Job, prefill_only_bound
from harness.slo_targets import SloTargets
from harness.trace_windows import NAMED_TRACES, is_trace, load_trace, peak_arrivals, trace_window
from harness.workload import PromptDeck, WorkItem, build_workload, gamma_arrivals, poisson_arrivals, with_schemas

ARRIVALS = ("poisson", "gamma", *NAMED_TRACES, "azure:PATH")


@dataclass(frozen=True)
class Level:
    """One window of one load level: what every system is sent, in the same order."""
    rps: float
    window: int  # 0..K-1
    seed: int
    items: tuple[WorkItem, ...]
    prompt_tokens: tuple[int, ...]  # per item, as our server tokenizes its prompt
    peak_5s: int
    bound: BoundResult | None = None


def arrivals_for(kind: str, rps: float, n: int, seed: int) -> list[float]:
    """n arrivals at mean rate `rps`: Poisson, bursty gamma, or a window of a real trace (start drawn
    with `seed`; harness/trace_windows.py)."""
    if kind == "poisson":
        return poisson_arrivals(rps, n, random.Random(seed))
    if kind == "gamma":
        return gamma_arrivals(rps, n, random.Random(seed))
    if is_trace(kind):
        return trace_window(load_trace(kind), rps, n, seed)
    raise ValueError(f"unknown arrivals {kind!r}: {', '.join(ARRIVALS)}")


def embedded_tokenizer():
    """The served model's tokenizer (the embedded default's)."""
    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate

    return load_tokenizer(locate(EMBEDDED_DEFAULT))


def render_chat(items: Sequence[WorkItem], tokenizer=None) -> list[WorkItem]:
    """Chat items as the plain text of the model's chat template, so every server gets the same ids."""
    from adaserve_backend.chat import chat_text

    tok = tokenizer or embedded_tokenizer()
    return [dataclasses.replace(i, prompt=chat_text(tok, i.prompt), chat=False) if i.chat else i for i in items]


def prompt_tokens(items: Sequence[WorkItem], tokenizer) -> tuple[int, ...]:
    """Each prompt's token count as our server counts it (the preprocessing model's encode_prompt)."""
    from adaserve_backend.chat import encode_prompt

    return tuple(len(encode_prompt(tokenizer, it.prompt, it.chat)) for it in items)


def build_levels(kind: str, rates: Sequence[float], duration_s: float, windows: int, slos: SloTargets,
                 deck: PromptDeck, seed: int, output_scale: float, tokenizer, schema_share: float = 0.0) -> list[Level]:
    """Per rate, `windows` windows of round(rate * duration) requests, in run order (each level's windows
    in turn). Window k of level i draws with seed + i*windows + k: with one window, each level's seed is
    what it was before windows existed (seed + i). `schema_share`: of each window's requests, this
    share asks for JSON valid against a schema (workload.with_schemas)."""
    if windows < 1:
        raise ValueError(f"--windows must be at least 1, got {windows}")
    levels = []
    for i, rps in enumerate(rates):
        n = max(1, round(rps * duration_s))
        for k in range(windows):
            s = seed + i * windows + k
            arrivals = arrivals_for(kind, rps, n, s)
            items = render_chat(with_schemas(build_workload(arrivals, slos, deck=deck, seed=s,
                                                            output_scale=output_scale), schema_share), tokenizer)
            levels.append(Level(rps, k, s, tuple(items), prompt_tokens(items, tokenizer), peak_arrivals(arrivals)))
    return levels


def bound_jobs(level: Level) -> list[Job]:
    """A window's requests as prefill jobs: due at arrival + TTFT target."""
    return [Job(it.arrival_s, it.arrival_s + it.ttft_slo_ms / 1e3, n)
            for it, n in zip(level.items, level.prompt_tokens, strict=True)]


def with_bounds(levels: Sequence[Level], rate_tok_s: float) -> list[Level]:
    return [dataclasses.replace(lv, bound=prefill_only_bound(bound_jobs(lv), rate_tok_s)) for lv in levels]


def level_fields(level: Level, attainment: float) -> dict:
    """A result row's window fields: which window, its burst, its bound and attainment over it."""
    bound = level.bound.share if level.bound else None
    return {"window": level.window, "window_seed": level.seed, "peak_5s": level.peak_5s, "bound": bound,
            "over_bound": attainment / bound if bound else None}


def decode_jobs(level: Level, records: Sequence[RequestRecord]) -> list[TwoPhaseJob]:
    """A window's requests as the decode-aware bound sees them, with the output lengths one system's run
    produced: each system's bound is over its own outputs, since a longer output also moves its last
    token's deadline later (a shorter one is not always easier, so no other system's length would do). A
    request the run did not finish has no known length and is charged its prefill alone: less work, and
    one deadline fewer, so the bound can only rise."""
    by_id = {r.request_id: r for r in records}
    jobs = []
    for it, n in zip(level.items, level.prompt_tokens, strict=True):
        r = by_id.get(it.request_id)
        outputs = r.output_tokens if r is not None and r.finished else 1
        jobs.append(TwoPhaseJob(it.arrival_s, it.arrival_s + it.ttft_slo_ms / 1e3, n, max(0, outputs - 1),
                                it.tpot_slo_ms / 1e3))
    return jobs


def decode_bound_fields(level: Level, records: Sequence[RequestRecord], prefill_tok_s: float,
                        decode_tok_s: float, attainment: float) -> dict:
    """A result row's decode-aware bound over its own run: the model's optimum (or an upper bound on it
    where the solver stopped early: `bound_decode_exact` false), attainment over it, what the dropping
    heuristic reaches (`bound_decode_policy`), and the requests a best set gives up (the optimum's, or
    the heuristic's where the optimum is not known)."""
    jobs = decode_jobs(level, records)
    ceiling = decode_aware_ceiling(jobs, prefill_tok_s, decode_tok_s)
    policy = decode_aware_bound(jobs, prefill_tok_s, decode_tok_s)
    dropped = sorted(set(range(len(jobs))) - set(ceiling.served)) if ceiling.exact else policy.dropped
    return {"bound_decode": ceiling.share, "over_bound_decode": attainment / ceiling.share if ceiling.share else None,
            "bound_decode_exact": ceiling.exact, "bound_decode_policy": policy.share,
            "bound_decode_dropped": [level.items[i].request_id for i in dropped]}


def level_meta(level: Level) -> dict:
    """A window as the run's JSON records it, whatever became of the systems run on it."""
    b = level.bound
    return {"rps": level.rps, "window": level.window, "seed": level.seed, "requests": len(level.items),
            "prompt_tokens": sum(level.prompt_tokens), "peak_5s": level.peak_5s,
            "bound": b.share if b else None,
            "bound_dropped": [level.items[i].request_id for i in b.dropped] if b else None}


def describe_levels(levels: Sequence[Level]) -> list[str]:
    """One line per level: requests, and each window's peak arrivals in 5 s (and its bound, once known)."""
    lines = []
    for rps in dict.fromkeys(lv.rps for lv in levels):
        ws = [lv for lv in levels if lv.rps == rps]
        peaks = ", ".join(str(lv.peak_5s) for lv in ws)
        line = (f"{rps:g} rps: {len(ws[0].items)} requests per window, peak arrivals in 5 s per window {peaks} "
                f"(mean {rps * 5:g})")
        if all(lv.bound for lv in ws):
            line += "; prefill-only bound " + ", ".join(f"{lv.bound.share:.2f}" for lv in ws)
        lines.append(line)
    return lines
