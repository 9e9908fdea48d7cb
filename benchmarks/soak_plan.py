"""The soak's requests, drawn before any server starts: Poisson arrivals at one rate for the whole run,
each arrival a streamed request of one SLO class (the benchmark's 60/20/20 mix) or, now and then, a
hostile one; a share of the streams is planned to be cancelled or dropped after a random number of
streamed events.

Prompts are never sent twice. The benchmark's families hold a few hundred prompts per class, fewer than
half an hour near capacity needs, so each prompt also comes under a few neutral framings (a line before
it: `# Implementation below.` before code, `Someone asks:` before a question), and a class's deck is
the whole product of prompts and framings shuffled once: every stretch of the run draws the same mix
(the first and last windows are compared), and no text reaches the server twice. A question does come
back under another framing, so the suffix index may find part of an earlier answer again, evenly over
the run; the JSON reports how many framings each class needed.

The last window mirrors the first (`mirror_s`): the same arrival times shifted to the end, the same
classes, caps, client behaviours and hostile cases, each prompt the same question under a framing not
sent before. Near capacity a window's TTFT p99 is set by its few largest bursts, which differ more
between two Poisson draws than any drift the comparison looks for; with the same arrivals at both
ends, what differs is the server (and the machine, which soak_speed watches).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from harness.workload import DEFAULT_MIX, OUTPUT_TOKENS, PromptsExhausted, builtin_prompts

from .soak_hostile import HOSTILE_CASES
from .soak_records import CANCEL, COMPLETE, DISCONNECT, HOSTILE

# First framing: none. Each is a line a real client could put there, neutral about the answer's length.
CODE_FRAMINGS = ("", "# Implementation below.\n", "# Complete the function.\n", "# Fill in the body.\n",
                 "# Part of a utility module.\n", "# Write the code for this.\n", "# Helper function.\n",
                 "# From the project's library code.\n", "# The function to implement:\n",
                 "# Needed by the tests.\n", "# Library code.\n", "# Finish this function.\n",
                 "# Next function.\n", "# Used elsewhere in the package.\n", "# Implement it.\n",
                 "# Continue the code.\n")
TEXT_FRAMINGS = ("", "Someone asks:\n", "A question for you.\n", "Please help with this.\n",
                 "Here is my request.\n", "From a colleague:\n", "Could you help me?\n", "Next task.\n",
                 "I have a request.\n", "A user writes:\n", "New message:\n", "Task:\n", "Request:\n",
                 "Hello.\n", "Hi there.\n", "One more thing.\n")
assert len(CODE_FRAMINGS) == len(TEXT_FRAMINGS)


class FramedDeck:
    """Per class, every (framing, prompt) pair in one seeded shuffle, dealt in order without
    replacement. `framings_used` says how far into the framings a class went."""

    def __init__(self, prompts: dict[str, list[tuple[str, bool]]], seed: int = 0) -> None:
        rng = random.Random(seed)
        self.prompts = prompts
        self._order = {}
        for cat, pool in prompts.items():
            pairs = [(f, p) for f in range(len(TEXT_FRAMINGS)) for p in range(len(pool))]
            rng.shuffle(pairs)
            self._order[cat] = pairs
        self._dealt = dict.fromkeys(prompts, 0)
        self._max_framing = dict.fromkeys(prompts, -1)
        self._next = dict.fromkeys(prompts, 0)  # per class, the next place in its order
        self._used: set[tuple[str, int, int]] = set()  # (class, framing, prompt) dealt
        self._source: dict[str, int] = {}  # a dealt text -> its prompt's index

    def _take(self, category: str, framing: int, index: int) -> tuple[str, bool]:
        self._used.add((category, framing, index))
        self._dealt[category] += 1
        self._max_framing[category] = max(self._max_framing[category], framing)
        text, chat = self.prompts[category][index]
        framed = (TEXT_FRAMINGS if chat else CODE_FRAMINGS)[framing] + text
        self._source[framed] = index
        return framed, chat

    def _exhausted(self, category: str) -> PromptsExhausted:
        return PromptsExhausted(f"the soak needs more than the {len(self._order[category])} distinct {category} "
                                "prompts its deck holds (prompts x framings): a lower --rps or a shorter "
                                "--duration-min")

    def deal(self, category: str) -> tuple[str, bool]:
        order = self._order[category]
        while self._next[category] < len(order):
            framing, index = order[self._next[category]]
            self._next[category] += 1
            if (category, framing, index) not in self._used:
                return self._take(category, framing, index)
        raise self._exhausted(category)

    def reframe(self, category: str, text: str) -> tuple[str, bool]:
        """The prompt behind a dealt `text` again, under its first framing not yet dealt."""
        index = self._source[text]
        for framing in range(len(TEXT_FRAMINGS)):
            if (category, framing, index) not in self._used:
                return self._take(category, framing, index)
        raise self._exhausted(category)

    def dealt(self) -> dict[str, int]:
        return dict(self._dealt)

    def framings_used(self) -> dict[str, int]:
        """How many framings each class's dealt prompts span (1: the plain prompts only)."""
        return {c: f + 1 for c, f in self._max_framing.items()}


@dataclass(frozen=True)
class PlannedRequest:
    request_id: str
    kind: str  # soak_records.KINDS
    arrival_s: float
    category: str  # the SLO class; for a hostile request, its case's name
    prompt: str = ""
    chat: bool = False  # sent to /v1/chat/completions as one user message
    max_tokens: int = 0
    leave_after: int = 0  # CANCEL / DISCONNECT: streamed events with text before the client leaves


@dataclass(frozen=True)
class Shares:
    """Of the streamed requests, the share cancelled and dropped; of all arrivals, the hostile share."""

    cancel: float = 0.3
    disconnect: float = 0.1
    hostile: float = 0.02

    def __post_init__(self) -> None:
        for name in ("cancel", "disconnect", "hostile"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"the {name} share must be in [0, 1], got {getattr(self, name)}")
        if self.cancel + self.disconnect > 1.0:
            raise ValueError(f"cancel ({self.cancel}) + disconnect ({self.disconnect}) shares exceed 1")


def build_plan(rps: float, duration_s: float, shares: Shares = Shares(), seed: int = 0, output_scale: float = 1.0,
               deck: FramedDeck | None = None, mirror_s: float = 0.0) -> list[PlannedRequest]:
    """Every request of a run of `duration_s` at `rps` (Poisson), in arrival order; with `mirror_s`,
    the last `mirror_s` seconds replay the first (module docstring). Hostile cases come round-robin
    over a shuffled order, so a long run sends every case."""
    if not rps > 0 or not duration_s > 0:
        raise ValueError(f"rps and duration must be positive, got {rps} and {duration_s}")
    if not 0 <= mirror_s <= duration_s / 2:
        raise ValueError(f"a mirrored window of {mirror_s:g} s does not fit twice in {duration_s:g} s")
    rng = random.Random(seed)
    deck = deck or FramedDeck(builtin_prompts(), seed)
    names, weights = list(DEFAULT_MIX), list(DEFAULT_MIX.values())
    cases = rng.sample(range(len(HOSTILE_CASES)), len(HOSTILE_CASES))
    plan, t, hostile, drawn_until = [], rng.expovariate(rps), 0, duration_s - mirror_s
    while t < drawn_until:
        rid = f"s{len(plan)}"
        if rng.random() < shares.hostile:
            plan.append(PlannedRequest(rid, HOSTILE, t, HOSTILE_CASES[cases[hostile % len(cases)]].name))
            hostile += 1
        else:
            cat = rng.choices(names, weights)[0]
            text, chat = deck.deal(cat)
            lo, hi = (max(2, round(x * output_scale)) for x in OUTPUT_TOKENS[cat])
            max_tokens = rng.randint(lo, hi)
            u = rng.random()
            kind = CANCEL if u < shares.cancel else DISCONNECT if u < shares.cancel + shares.disconnect else COMPLETE
            leave = rng.randint(1, max_tokens - 1) if kind != COMPLETE else 0
            plan.append(PlannedRequest(rid, kind, t, cat, text, chat, max_tokens, leave))
        t += rng.expovariate(rps)
    return plan + mirrored(plan, mirror_s, drawn_until, deck) if mirror_s else plan


def mirrored(plan: list[PlannedRequest], window_s: float, offset_s: float, deck: FramedDeck) -> list[PlannedRequest]:
    """The requests of `plan` arriving in its first `window_s`, again `offset_s` later, each prompt reframed."""
    out = []
    for p in (p for p in plan if p.arrival_s < window_s):
        text, _ = deck.reframe(p.category, p.prompt) if p.kind != HOSTILE else ("", False)
        out.append(replace(p, request_id=f"s{len(plan) + len(out)}", arrival_s=p.arrival_s + offset_s, prompt=text))
    return out
