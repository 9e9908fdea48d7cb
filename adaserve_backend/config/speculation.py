"""How speculation is configured: the budget B, the draft's beam, selection, prompt lookup."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Prompt lookup's longest match (speculation/lookup.py keeps a measured acceptance prior for each match
# length up to it, and checks that it does).
LOOKUP_MAX_NGRAM = 5
SUFFIX_SCOPES = ("shared", "tenant", "off")

class Lookup(NamedTuple):
    """What prompt lookup adds to a request's tree (Policy.lookup); all zero: none."""

    ngram: int = 0  # longest suffix matched
    tokens: int = 0  # longest copy
    suffix_tokens: int = 0  # nodes from the suffix index across requests (speculation/suffix_index.py)
    suffix_scope: str = "shared"
    suffix_max_tokens: int = 0

    @property
    def reserved(self) -> int:
        """Tree nodes the copies may add (KV capacity)."""
        return self.tokens + self.suffix_tokens


@dataclass(frozen=True)
class SpeculationConfig:
    """AdaServe's knobs (paper section 5, adaptive control):
      d = clip(floor(B1 / (n + c1)) - 1, d_min, d_max)   with B1 = budget
      w = clip(floor(B2 / n) + c2, 1, w_max)            with B2 = draft_budget
    budget: B, tokens verified per iteration (roots included); `profile_path`, when the file exists,
      overrides it with the knee of the profiled roofline.
    calibrate: measure this machine when the engine starts (profiler.calibrate, a few seconds) and
      plan with that instead of `profile_path`'s profile, then warm the serving path up with one
      request: a profile taken on another machine misprices every step here (a prefill chunk cost
      twice what an AMX profile said on a CPU without AMX), and the first requests paid for first
      uses. The served engine.json sets it; in-process use keeps the profile (tests, reproducible runs).
    calibration_pool: with calibrate, fit the rooflines to the per-size medians of this start's
      calibration and this machine's previous ones, up to this many (calibration_pool.py): one
      calibration's B moves by several tokens between starts on a CPU, and a lone request's depth with
      it (docs/scheduling.md#the-cost-model-and-its-calibration). 1: this start's alone.
    n_max: largest tree the SLO-customized phase builds for one request (root included).
    goodput_selection: with a profile, the throughput phase verifies only as much of the remaining
      budget as raises expected tokens per second (acceptance probabilities: draft scores times the
      measured accepted/score ratio). Where tokens below the knee are free (GPUs) that is all of B, as
      in the paper; on a CPU, where every verified token costs time, often less.
    lookup_ngram, lookup_tokens: prompt lookup (speculation/lookup.py; 0 turns it off): up to
      lookup_tokens that followed the latest earlier occurrence of the context's last 1..lookup_ngram
      tokens join the tree as candidates (no draft forward), deeper than d if selected (a longer copied
      chain beat a d=4 one; docs/draft-training.md#what-we-learned).
    suffix_tokens: nodes a request's tree may take from the suffix index (speculation/suffix_index.py;
      0 turns it off): continuations of the longest matches of its context among the tokens of earlier
      and concurrent requests. suffix_scope: which requests match each other: "shared" (all), "tenant"
      (requests with the same `tenant`; requests without one neither read nor feed the index), "off".
      Outputs never change, but the time a request takes can show that its continuation was seen
      before (as with prefix caching): servers shared by parties who must not learn of each other's
      requests use "tenant" or "off", or give each such party a cache scope (Request.cache_scope, an
      isolated tenant's: docs/tenants.md), which matches only its own scope's requests short of "off".
      suffix_max_tokens: the index's bound over all requests.

    Defaults come from a float32 profile of the embedded model on a 2-core CPU: B is where a
    verification forward stays within 1.3x its flat latency
    (docs/scheduling.md#the-cost-model-and-its-calibration); the served config's profile_path replaces
    B with its own profile's knee. With c1 = 2 a
    lone request gets depth 5, four requests depth 2 and sixteen depth 1; the draft budget of 16 tokens
    per step keeps width 4 up to four requests and 1 beyond sixteen. A GPU profile raises all of these.
    """

    budget: int = 19
    draft_budget: int = 16
    d_min: int = 1
    d_max: int = 6
    w_max: int = 4
    c1: int = 2
    c2: int = 0
    n_max: int = 8
    goodput_selection: bool = True
    profile_path: str | None = None
    calibrate: bool = False
    calibration_pool: int = 1
    lookup_ngram: int = LOOKUP_MAX_NGRAM
    lookup_tokens: int = 8
    suffix_tokens: int = 16
    suffix_scope: str = "shared"
    suffix_max_tokens: int = 262_144

    def __post_init__(self) -> None:
        if min(self.budget, self.draft_budget, self.d_max, self.w_max, self.n_max) < 1 or self.d_min < 1:
            raise ValueError("budgets, depths, widths and n_max must be >= 1")
        if self.calibration_pool < 1:
            raise ValueError(f"calibration_pool must be >= 1 (1: this start's calibration alone), got "
                             f"{self.calibration_pool}")
        if self.d_min > self.d_max:
            raise ValueError("d_min must not exceed d_max")
        if not 0 <= self.lookup_ngram <= LOOKUP_MAX_NGRAM:
            raise ValueError(f"lookup_ngram must be 0 (off) to {LOOKUP_MAX_NGRAM}, got {self.lookup_ngram}")
        if self.lookup_tokens < 1:
            raise ValueError(f"lookup_tokens must be >= 1, got {self.lookup_tokens}")
        if self.suffix_tokens < 0 or self.suffix_max_tokens < 1:
            raise ValueError("suffix_tokens must be >= 0 (0: off) and suffix_max_tokens >= 1")
        if self.suffix_scope not in SUFFIX_SCOPES:
            raise ValueError(f"suffix_scope must be one of {', '.join(SUFFIX_SCOPES)}, got {self.suffix_scope!r}")
