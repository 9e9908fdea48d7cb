"""Scheduling policies: one small class each, behind one interface. Adding a policy touches this file.

A policy decides what differs between the systems compared: the order requests wait in, whom to
preempt, whether a more urgent request may preempt to start, how much prefill an iteration takes,
whether and how deep the draft speculates, and which draft tokens are verified.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..config import POLICY_NAMES, SPECULATIVE_POLICIES, Lookup, SchedulerConfig, SpeculationConfig, check_policy_name
from .deadlines import edf_key
from .speculation_size import adaptive_depth_width

if TYPE_CHECKING:
    from ..sequence import Sequence


class Policy:
    """The defaults are vLLM's continuous batching without its prefill priority: FIFO, the newest
    running request is preempted, prefill chunks of `prefill_chunk` tokens, no speculation."""

    name = "base"
    speculative = False  # runs a draft model
    prefill_first = False  # a prefill iteration holds back decode (vLLM's default scheduler)
    slo_aware = False  # may pace admission and prefill by the running requests' SLO slack
    verify_whole_draft = False  # verify every drafted token instead of selecting within budget B
    trims_speculation = False  # speculates only as deep as the measured acceptance pays for, down to none

    def order(self, waiting: deque[Sequence]) -> deque[Sequence]:
        return waiting

    def victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=lambda s: s.arrival)  # vLLM: the most recent arrival

    def preempts_for(self, head: Sequence, running: list[Sequence]) -> bool:
        """Whether `head`, which does not fit, may preempt a running request to start sooner."""
        return False

    def prefill_cap(self, config: SchedulerConfig, num_decode: int) -> int:
        return config.prefill_chunk

    def depth_width(self, num_decode: int, budget: int, spec: SpeculationConfig) -> tuple[int, int]:
        return 0, 0

    def lookup(self, spec: SpeculationConfig) -> Lookup:
        """Model-free proposals (prompt lookup's copies, the suffix index's), none (Lookup()) but for a
        policy that drafts and selects (Spec(n) verifies its draft's chain as drawn)."""
        if not self.speculative or self.verify_whole_draft:
            return Lookup()
        own = (spec.lookup_ngram, spec.lookup_tokens) if spec.lookup_ngram else (0, 0)
        suffix = spec.suffix_tokens if spec.suffix_scope != "off" else 0
        return Lookup(*own, suffix, spec.suffix_scope, spec.suffix_max_tokens)


class Continuous(Policy):
    name = "continuous"
    prefill_first = True


class Sarathi(Policy):
    """Chunked prefill piggybacked on decode, within one token budget per iteration."""

    name = "sarathi"

    def prefill_cap(self, config: SchedulerConfig, num_decode: int) -> int:
        return config.token_budget - num_decode


class Priority(Sarathi):
    """Sarathi-style batching; the tightest SLO first, preempting the loosest."""

    name = "priority"

    def order(self, waiting: deque[Sequence]) -> deque[Sequence]:
        return deque(sorted(waiting, key=lambda s: (s.slo.tpot_s, s.arrival)))

    def victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=lambda s: (s.slo.tpot_s, s.arrival))  # the loosest SLO; ties: the newest

    def preempts_for(self, head: Sequence, running: list[Sequence]) -> bool:
        return bool(running) and self.victim(running).slo.tpot_s > head.slo.tpot_s


class AdaServe(Policy):
    """SLO-customized tree speculation with adaptive depth and width (the paper's Algorithm 2); waiting
    requests in order of first-token deadline."""

    name = "adaserve"
    speculative = True
    slo_aware = True
    trims_speculation = True
    victim = Priority.victim

    def order(self, waiting: deque[Sequence]) -> deque[Sequence]:
        return deque(sorted(waiting, key=edf_key))  # first-token deadlines: earliest first

    def depth_width(self, num_decode: int, budget: int, spec: SpeculationConfig) -> tuple[int, int]:
        return adaptive_depth_width(num_decode, budget, spec)


class SpecChain(Policy):
    """Every decoding request drafts a chain of N tokens, all verified."""

    speculative = True
    verify_whole_draft = True

    def __init__(self, n: int) -> None:
        self.n = n
        self.name = f"spec:{n}"

    def depth_width(self, num_decode: int, budget: int, spec: SpeculationConfig) -> tuple[int, int]:
        return self.n, 1


def make_policy(name: str) -> Policy:
    if check_policy_name(name).startswith("spec:"):
        return SpecChain(int(name[5:]))
    return POLICIES[name]()


POLICIES = {p.name: p for p in (AdaServe, Continuous, Sarathi, Priority)}
if set(POLICIES) != set(POLICY_NAMES) or {n for n, p in POLICIES.items() if p.speculative} != set(SPECULATIVE_POLICIES):
    raise ImportError("config.POLICY_NAMES and SPECULATIVE_POLICIES must name exactly these policies")
