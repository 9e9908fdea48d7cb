"""Multi-SLO workloads: which prompts, which SLO targets, when they arrive.

Categories follow the paper: coding, chat and summarisation, in its 60/20/20 mix, with prompts from
families the draft never trained on (`harness/prompts.py`).
Each item carries its category's TTFT and TPOT targets (`harness/slo_targets.py`).
Arrivals: Poisson, bursty gamma, a replayed Azure LLM inference trace rescaled to a target RPS, or a
synthetic fluctuating trace where each category peaks at a different time.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .slo_targets import SloTargets

DEFAULT_MIX = {"coding": 0.6, "chat": 0.2, "summary": 0.2}
OUTPUT_TOKENS = {"coding": (64, 160), "chat": (32, 128), "summary": (32, 96)}  # uniform ranges
@dataclass(frozen=True)
class WorkItem:
    request_id: str
    category: str
    prompt: str
    chat: bool
    max_tokens: int
    tpot_slo_ms: float
    arrival_s: float  # offset from the start of the run
    ttft_slo_ms: float = math.inf


# ---- prompts -------------------------------------------------------------------------------------
def builtin_prompts(kind: str = "default") -> dict[str, list[tuple[str, bool]]]:
    """The benchmark's offline prompt families (see harness/prompts.py), disjoint from the draft's:
    `default`, `prompt-heavy` (the same families, prompts several times longer than outputs) or
    `repetitive` (shapes that repeat across requests: code to edit, questions asked again, JSON)."""
    from .prompts import PROMPT_SETS

    return PROMPT_SETS[kind]()


# ---- arrivals ------------------------------------------------------------------------------------
def poisson_arrivals(rps: float, n: int, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rps)
        out.append(t)
    return out


def gamma_arrivals(rps: float, n: int, rng: random.Random, cv: float = 3.0) -> list[float]:
    """Bursty: gamma inter-arrival times with mean 1/rps and coefficient of variation `cv`."""
    shape = 1.0 / cv**2
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, 1.0 / (rps * shape))
        out.append(t)
    return out


@dataclass(frozen=True)
class TraceRow:
    time_s: float
    context_tokens: int
    generated_tokens: int


def read_azure_trace(path: str) -> list[TraceRow]:
    """Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens."""
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            stamp = r["TIMESTAMP"].strip()
            head, _, frac = stamp.partition(".")
            t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp() + (float("0." + frac) if frac else 0.0)
            rows.append(TraceRow(t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    rows.sort(key=lambda r: r.time_s)
    return rows


def rescale_trace(rows: Sequence[TraceRow], rps: float, n: int) -> list[float]:
    """The first `n` arrivals of a trace, time-scaled so their mean rate is `rps`; starts at 0."""
    rows = list(rows)[:n]
    if len(rows) < 2:
        return [0.0] * len(rows)
    t0, span = rows[0].time_s, rows[-1].time_s - rows[0].time_s
    scale = ((len(rows) - 1) / rps) / span if span > 0 else 0.0
    return [(r.time_s - t0) * scale for r in rows]


def fluctuating_arrivals(rps: float, duration_s: float, categories: Sequence[str],
                         rng: random.Random) -> list[tuple[float, str]]:
    """Each category's rate is a raised cosine peaking at its own time; the total averages `rps`."""
    k = len(categories)
    out = []
    for i, cat in enumerate(categories):
        peak = duration_s * (i + 0.5) / k

        def rate(t: float) -> float:
            return (rps / k) * (1 + math.cos(2 * math.pi * (t - peak) / duration_s))

        t, bound = 0.0, 2 * rps / k
        while True:  # thinning of a homogeneous Poisson process
            t += rng.expovariate(bound)
            if t >= duration_s:
                break
            if rng.random() < rate(t) / bound:
                out.append((t, cat))
    return sorted(out)


# ---- the workload --------------------------------------------------------------------------------
def build_workload(
    arrivals: Sequence[float],
    slos: SloTargets | None = None,
    mix: dict[str, float] | None = None,
    prompts: dict[str, list[tuple[str, bool]]] | None = None,
    categories: Sequence[str] | None = None,
    seed: int = 0,
    output_scale: float = 1.0,
) -> list[WorkItem]:
    """One item per arrival. Categories are drawn from `mix` unless given per arrival; output lengths
    are uniform in the category's range times `output_scale`."""
    rng = random.Random(seed)
    slos = slos or SloTargets()
    mix = mix or DEFAULT_MIX
    prompts = prompts or builtin_prompts()
    names, weights = list(mix), [mix[c] for c in mix]
    items = []
    for i, t in enumerate(arrivals):
        cat = categories[i] if categories else rng.choices(names, weights)[0]
        text, chat = rng.choice(prompts[cat])
        lo, hi = (max(2, round(x * output_scale)) for x in OUTPUT_TOKENS[cat])
        items.append(WorkItem(f"w{i}", cat, text, chat, rng.randint(lo, hi), slos.tpot(cat), t, slos.ttft(cat)))
    return items
