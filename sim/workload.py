"""Simulated requests from the benchmark's own generators (harness/workload.py: category mix, output
lengths, Poisson / gamma / fluctuating / Azure-trace arrivals; harness/slo_targets.py: targets).

Arrivals: the paper replays the Azure LLM inference trace (Splitwise, Patel et al. 2024) rescaled to
each RPS. The trace is not shipped here: `azure:PATH` replays a copy (AzureLLMInferenceTrace_conv.csv,
through harness.workload.read_azure_trace / rescale_trace); `azure` stands in for it with gamma
inter-arrivals of the trace's burstiness (AZURE_CV).

Prompts are token counts, not text: uniform per category in PROMPT_TOKENS. `paper`: an assumption for
HumanEval-like code prompts, Alpaca-like chat instructions and CNN/DailyMail-like articles (the
datasets of the paper's categories). `cpu`: the range of the in-process benchmark's prompts as the
served tokenizer encodes them (harness.bench.InProcess.encode over harness/prompts.py's families:
coding 16-111 tokens, mean 37; chat 34-61, mean 42; summary 172-360, mean 231). validate.py encodes
each prompt instead.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from adaserve_backend.request import Request
from adaserve_backend.sequence import Sequence
from adaserve_backend.slo import SLO
from harness.slo_targets import DEFAULT_TTFT_SLO_MS, SloTargets
from harness.workload import (
    DEFAULT_MIX,
    PromptDeck,
    build_workload,
    fluctuating_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    read_azure_trace,
    rescale_trace,
)

from .drafts import EOS

PROMPT_TOKENS = {
    "paper": {"coding": (100, 250), "chat": (20, 150), "summary": (500, 1500)},
    "cpu": {"coding": (16, 111), "chat": (34, 61), "summary": (172, 360)},
}
PAPER_TPOT_MS = {"chat": 50.0, "summary": 150.0}  # coding: 1.2x the hardware's baseline TPOT
CODING_SCALE = 1.2
# Coefficient of variation of the inter-arrival times of the first 120 arrivals of the Azure
# conversation trace (AzureLLMInferenceTrace_conv.csv, 2023-11-16 18:15:46-18:16:32): 1.42 (1.15
# without its first, 4.3 s gap). Poisson is 1.
AZURE_CV = 1.4
SLO_MODES = ("absolute", "relative")


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    category: str
    prompt_tokens: int
    max_tokens: int
    tpot_slo_ms: float
    ttft_slo_ms: float
    arrival_s: float
    # The output token that is the model's end of sequence (1-based), where a measured run saw it stop
    # (validate.py); None: the request runs to max_tokens. The scheduler still sees max_tokens, as the
    # engine's does: neither knows in advance where a request will stop.
    stop_after: int | None = None
    # The prompt's token ids where they are known (validate.py encodes the measured run's prompts), so
    # the prefix cache hits where requests share a prefix; None: a prompt shared with no other request.
    prompt_ids: tuple[int, ...] | None = None
    # The model's greedy output for the prompt, where known (validate.py: sim/continuations.py), so
    # copies from the request's context and from other requests (speculation/copies.py) are right or
    # wrong as the engine's are; None: output tokens are placeholders and copies are not simulated.
    continuation: tuple[int, ...] | None = None

    def sequence(self, seq_id: int) -> Sequence:
        """The engine's own request state (Sequence.start, as Engine._take_inbox makes it); the category
        rides along as the SLO class so the acceptance model can read it."""
        slo = SLO(self.tpot_slo_ms, self.ttft_slo_ms, self.category)
        ids = list(self.prompt_ids) if self.prompt_ids is not None else [seq_id + 1] + [0] * (self.prompt_tokens - 1)
        req = Request(self.request_id, ids, max_tokens=self.max_tokens, ignore_eos=self.stop_after is None,
                      slo=slo, arrival_time=self.arrival_s)
        return Sequence.start(req, seq_id, slo, self.arrival_s, frozenset({EOS}))


def paper_slos(baseline_tpot_ms: float, ttft_ms: dict[str, float] | None = None, mode: str = "absolute",
               coding_scale: float = CODING_SCALE) -> SloTargets:
    """The paper's TPOT targets with the benchmark's TTFT targets. `absolute`: coding `coding_scale` x
    baseline, chat 50 ms, summary 150 ms, as the paper states them. `relative`: chat and summary keep
    the paper's proportion to its baseline instead (harness.slo_targets' relative mode: 2x and 6x), for
    hardware whose baseline is not the paper's: where one request decodes slower than 50 ms/token, the
    absolute chat target is below what any batch reaches without speculation and tighter than coding's,
    the reverse of the paper's order."""
    ttft = dict(ttft_ms or DEFAULT_TTFT_SLO_MS)
    if mode == "relative":
        return SloTargets(ttft_ms=ttft, relative_to_ms=baseline_tpot_ms, tpot_scale={"coding": coding_scale})
    if mode != "absolute":
        raise ValueError(f"unknown SLO mode {mode!r}: one of {', '.join(SLO_MODES)}")
    return SloTargets(tpot_ms={"coding": coding_scale * baseline_tpot_ms, **PAPER_TPOT_MS}, ttft_ms=ttft)


def arrivals(kind: str, rps: float, duration_s: float, rng: random.Random) -> tuple[list[float], list[str] | None]:
    """Arrival times within `duration_s` (and per-arrival categories for the fluctuating trace)."""
    n = max(1, math.ceil(rps * duration_s * 1.5) + 10)
    if kind == "poisson":
        times = poisson_arrivals(rps, n, rng)
    elif kind == "gamma":
        times = gamma_arrivals(rps, n, rng)
    elif kind == "azure":
        times = gamma_arrivals(rps, n, rng, cv=AZURE_CV)
    elif kind.startswith("azure:"):
        times = rescale_trace(read_azure_trace(kind.split(":", 1)[1]), rps, n)
    elif kind == "fluctuating":
        pairs = fluctuating_arrivals(rps, duration_s, list(DEFAULT_MIX), rng)
        return [t for t, _ in pairs], [c for _, c in pairs]
    else:
        raise ValueError(f"unknown arrival process {kind!r}: poisson, gamma, azure, azure:TRACE.csv or fluctuating")
    return [t for t in times if t < duration_s], None


def build_requests(rps: float, duration_s: float, slos: SloTargets, scale: str = "paper", seed: int = 0,
                   arrival: str = "poisson", mix: dict[str, float] | None = None,
                   output_scale: float = 1.0) -> list[SimRequest]:
    rng = random.Random(seed)
    times, cats = arrivals(arrival, rps, duration_s, rng)
    texts = PromptDeck({c: [("", True)] for c in DEFAULT_MIX}, repeats=True)  # text is not simulated
    items = build_workload(times, slos, mix, texts, cats, seed, output_scale)
    lengths = PROMPT_TOKENS[scale]
    return [SimRequest(it.request_id, it.category, rng.randint(*lengths[it.category]), it.max_tokens,
                       it.tpot_slo_ms, it.ttft_slo_ms, it.arrival_s) for it in items]
