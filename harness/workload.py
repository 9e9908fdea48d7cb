"""Multi-SLO workloads: which prompts, which SLO targets, when they arrive.

Categories follow the paper: coding, chat and summarisation, in its 60/20/20 mix, with prompts from
families the draft never trained on (`harness/prompts.py`), dealt without replacement (PromptDeck): one
deck serves everything one server sees, so no server is sent a prompt twice unless the workload is
about repeats (and `repeat_share` says how many).
Each item carries its category's TTFT and TPOT targets (`harness/slo_targets.py`).
Arrivals: Poisson, bursty gamma, a replayed Azure LLM inference trace rescaled to a target RPS, or a
synthetic fluctuating trace where each category peaks at a different time.
"""

from __future__ import annotations

import csv
import dataclasses
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
    schema: dict | None = None  # structured output: the answer a JSON object valid against it (with_schemas)


def with_schemas(items: Sequence[WorkItem], share: float) -> list[WorkItem]:
    """Every 1/share-th item (the first, then evenly) asks for its answer as JSON valid against one of
    harness/schemas.py's schemas, in turn: its own prompt stays (no prompt sent twice), with the
    schema task's instruction after it."""
    from .schemas import schema_tasks

    if not share:
        return list(items)
    tasks, out, given = schema_tasks(), [], 0
    for i, it in enumerate(items):
        if math.floor(i * share + 1e-9) > math.floor((i - 1) * share + 1e-9):  # item 0, then every 1/share
            task, given = tasks[given % len(tasks)], given + 1
            it = dataclasses.replace(it, prompt=f"{it.prompt}\n\n{task.prompt}", schema=task.schema)
        out.append(it)
    return out


# ---- prompts -------------------------------------------------------------------------------------
def builtin_prompts(kind: str = "default") -> dict[str, list[tuple[str, bool]]]:
    """The benchmark's offline prompt families (see harness/prompts.py), disjoint from the draft's:
    `default`, `prompt-heavy` (the same families, prompts several times longer than outputs) or
    `repetitive` (shapes that repeat across requests: code to edit, questions asked again, JSON)."""
    from .prompts import PROMPT_SETS

    return PROMPT_SETS[kind]()


def prompt_deck(kind: str = "default", seed: int = 0) -> PromptDeck:
    """A deck of one of the benchmark's prompt sets: with replacement only for a set about repeats."""
    from .prompts import REPEATING_SETS

    return PromptDeck(builtin_prompts(kind), seed, repeats=kind in REPEATING_SETS)


class PromptsExhausted(ValueError):
    """A run asked for more distinct prompts of a category than its families hold."""


class PromptDeck:
    """Prompts dealt without replacement: each category's pool shuffled once (seeded) and dealt in
    order. Share one deck across everything one server lifetime serves (all levels, all seeds) and no
    prompt reaches it twice, so no cache or suffix index replays an answer it already gave.
    `repeats=True` draws with replacement: for a workload about repeats, which says so."""

    def __init__(self, prompts: dict[str, list[tuple[str, bool]]], seed: int = 0, repeats: bool = False):
        self.prompts, self.repeats = prompts, repeats
        self._rng = random.Random(seed)
        self._order = {c: self._rng.sample(range(len(p)), len(p)) for c, p in prompts.items()}
        self._dealt = dict.fromkeys(prompts, 0)

    def deal(self, category: str) -> tuple[str, bool]:
        pool = self.prompts[category]
        if self.repeats:
            return self._rng.choice(pool)
        i = self._dealt[category]
        if i >= len(pool):
            raise PromptsExhausted(f"this run needs more than the {len(pool)} distinct {category} prompts its "
                                   "families hold: fewer levels, a shorter --duration, or a workload about repeats")
        self._dealt[category] = i + 1
        return pool[self._order[category][i]]

    def left(self) -> dict[str, int]:
        """Distinct prompts not dealt yet, per category."""
        return {c: len(p) - self._dealt[c] for c, p in self.prompts.items()}


def repeat_share(items: Sequence[WorkItem]) -> float:
    """The share of items whose prompt an earlier item already sent (whitespace aside): what one
    server that sees all of them could replay from a cache or suffix index."""
    from .prompts import normalize

    seen: set[tuple[str, bool]] = set()
    repeats = 0
    for it in items:
        key = (normalize(it.prompt), it.chat)
        repeats += key in seen
        seen.add(key)
    return repeats / len(items) if items else 0.0


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
    deck: PromptDeck | None = None,
    categories: Sequence[str] | None = None,
    seed: int = 0,
    output_scale: float = 1.0,
) -> list[WorkItem]:
    """One item per arrival, its prompt dealt from `deck` (default: a fresh deck of the benchmark's
    prompts, seeded). Categories are drawn from `mix` unless given per arrival; output lengths are
    uniform in the category's range times `output_scale`."""
    rng = random.Random(seed)
    slos = slos or SloTargets()
    mix = mix or DEFAULT_MIX
    deck = deck or PromptDeck(builtin_prompts(), seed)
    names, weights = list(mix), [mix[c] for c in mix]
    items = []
    for i, t in enumerate(arrivals):
        cat = categories[i] if categories else rng.choices(names, weights)[0]
        text, chat = deck.deal(cat)
        lo, hi = (max(2, round(x * output_scale)) for x in OUTPUT_TOKENS[cat])
        items.append(WorkItem(f"w{i}", cat, text, chat, rng.randint(lo, hi), slos.tpot(cat), t, slos.ttft(cat)))
    return items
