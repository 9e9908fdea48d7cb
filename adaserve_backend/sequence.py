"""One request's state inside the engine: its tokens, prefill progress, output and counters."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .grammar.state import GrammarState
from .kv_cache.block_pool import scope_root
from .request import Request
from .slo import SLO
from .stop_strings import StopScan


@dataclass(eq=False)  # identity semantics: sequences key per-iteration dicts
class Sequence:
    request: Request
    seq_id: int
    slo: SLO  # resolved (SchedulerConfig.resolve_slo): both targets set; slo.ttft_s inf: no first-token deadline
    arrival: float
    eos_ids: frozenset[int]
    generator: torch.Generator | None
    prefill_goal: int  # tokens to prefill: the prompt, or after a preemption all but the last token
    output: list[int] = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)  # request.TokenLogprob per output token, if it asked
    prompt_logprobs: list = field(default_factory=list)  # ... per prompt token after the first, as prefilled
    first_token_time: float | None = None
    prefilled: int = 0  # of those, already in the target cache
    cached_prefix: int = 0  # while waiting: of those, what the prefix cache holds now (it will not prefill)
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache when it was admitted (usage's cached_tokens)
    # prefix-cache keys of its tokens' blocks, by block size
    block_keys: dict[int, list[bytes]] = field(default_factory=dict)
    emitted: int = 0  # output tokens reported; those after it are held back by a possible stop string
    stop_scan: StopScan = field(default_factory=StopScan)
    verifications: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0
    accepted_prediction: int = 0  # of those, copied from the client's prediction (Predicted Outputs)
    delivery_s: float = 0.0  # planned for the first token to reach the client (first_token_margin_ms)
    tpot_margin: float = 0.0  # share of its TPOT target planned as margin (SchedulerConfig.tpot_margin)
    admitted_time: float | None = None  # first left the waiting queue
    missed: str | None = None  # why admission gave up its first-token deadline (overload: best_effort)
    predicted_first_token: float | None = None  # when admission predicted it (with a cost model)
    prefill_s: float = 0.0  # its prompt's prefill alone as last predicted while waiting (deadlines.edf_key)
    by_arrival: bool = False  # keyed by its arrival while first tokens go in arrival order (deadlines.edf_key)
    # remaining tokens after the next one, short and long end, as the scheduler plans them
    # (scheduler/output_lengths.py); None: plan with the cap (`remaining`)
    remaining_range: tuple[int, int] | None = None
    predicted_length: int | None = None  # its whole output's median, first predicted (the error measured)
    grammar: GrammarState | None = None  # its grammar's parse state, having consumed the output (request.grammar)

    @classmethod
    def start(cls, req: Request, seq_id: int, slo: SLO, received: float, eos_ids: frozenset[int]) -> Sequence:
        """A new request's state; a sampled request gets its own generator, seeded if it asked."""
        gen = None
        if not req.sampling.greedy:
            gen = torch.Generator().manual_seed(req.sampling.seed if req.sampling.seed is not None else torch.seed())
        eos = frozenset() if req.ignore_eos else eos_ids
        return cls(req, seq_id, slo, req.arrival_time or received, eos, gen, len(req.prompt_ids))

    @property
    def deadline(self) -> float:
        """When the scheduler must have made its first token: arrival + TTFT target, less the time
        planned for it to reach the client."""
        return self.arrival + self.slo.ttft_s - self.delivery_s

    @property
    def planned_tpot_s(self) -> float:
        """The time per token the scheduler plans this request for: its target less the margin."""
        return self.slo.tpot_s * (1.0 - self.tpot_margin)

    @property
    def slo_missed(self) -> bool:
        return self.missed is not None

    @property
    def started_stream(self) -> bool:
        """It has produced output (a preempted request too): from now on it is served to the end."""
        return bool(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.request.prompt_ids + self.output

    @property
    def cache_root(self) -> bytes:
        """What its prefix-cache keys chain from: its cache scope's own root (block_pool.scope_root)."""
        return scope_root(self.request.cache_scope)

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prefill_goal and bool(self.output)

    @property
    def remaining(self) -> int:
        """Output tokens still to come after the next one."""
        return self.request.max_tokens - len(self.output) - 1

    def preempted(self) -> None:
        """Recompute later: the output stays and is prefilled again with the prompt."""
        self.prefilled, self.prefill_goal = 0, len(self.tokens) - (1 if self.output else 0)
