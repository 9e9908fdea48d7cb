"""What crosses the scheduler's boundary: the plan of one iteration, what the model made of it (built
by the verification, or by hand in tests) and the record of how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request import TokenLogprob
from ..sequence import Sequence


@dataclass
class IterationPlan:
    """decode: requests verifying a token tree (or decoding one token); prefill: prompt tokens to
    prefill per request; depth/width: the draft's beam search (0: no speculation); failed: requests
    the scheduler ended (message per request) and the engine must report; rejected: the same for
    requests whose first-token deadline no admissible schedule meets (overload "reject")."""

    start: float
    decode: list[Sequence] = field(default_factory=list)
    prefill: dict[Sequence, int] = field(default_factory=dict)
    depth: int = 0
    width: int = 0
    copies: bool = False  # trees may take model-free proposals (KV reserved for them), drafting or not
    failed: list[tuple[Sequence, str]] = field(default_factory=list)
    # first-token deadline unmeetable (overload: reject)
    rejected: list[tuple[Sequence, str]] = field(default_factory=list)
    # Cached tokens the target's forward reads: each decoding request's committed context, each prefilling
    # request's committed context plus its chunk. Set by the scheduler; what the cost models call context.
    context_tokens: int = 0
    # seq_id -> its blocks in the target (draft) cache, reserved for this iteration's worst case: the
    # runners write only there. released: requests whose blocks were freed since the last plan (the
    # draft worker drops its own state for them).
    block_tables: dict[int, tuple[int, ...]] = field(default_factory=dict)
    draft_block_tables: dict[int, tuple[int, ...]] = field(default_factory=dict)
    released: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def scheduled(self) -> list[Sequence]:
        return self.decode + list(self.prefill)

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefill.values())

    @property
    def runs_draft(self) -> bool:
        """Whether a draft has anything to do: it speculates, or nothing decodes (its chunks are read at
        once); a step that decodes without speculating runs no draft and selects nothing (the draft
        reads lazily, draft_reads.py; skipping the worker spares a plain step its Python, and the
        draft's calibration its decay on steps that verify no draft)."""
        return self.depth > 0 or not self.decode


@dataclass(frozen=True)
class Verified:
    """One decoding request's verification: the accepted drafts, then the bonus token."""

    seq: Sequence
    tokens: list[int]
    draft_tokens: int  # draft tokens verified (the tree without its root)
    accepted_drafts: int
    draft_depth: int  # the verified tree's deepest draft (0: its root alone)
    logprobs: list[TokenLogprob] | None = None  # one per token, where the request asked for them
    accepted_prediction: int = 0  # accepted drafts copied from the client's prediction


@dataclass(frozen=True)
class Prefilled:
    """One prefill chunk now in the target cache; the first output token if it ended the prompt."""

    seq: Sequence
    tokens: int
    first_token: int | None = None
    first_logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # the chunk's prompt tokens', where the request asked


@dataclass
class IterationResult:
    """What the model made of a plan. `now` is the emit time; the durations (s) feed the estimator."""

    now: float
    decoded: list[Verified] = field(default_factory=list)
    prefilled: list[Prefilled] = field(default_factory=list)
    failed: list[tuple[Sequence, str]] = field(default_factory=list)  # per-request failures, message each
    speculation: float = 0.0
    selection: float = 0.0
    verification: float = 0.0  # the target's forward, acceptance and commits
    target_forward: float = 0.0  # of verification, the target's forward alone
    draft_chain_tokens: int = 0  # what the draft's first step read: drafting chains, catching up, prefill chunks

    @property
    def latency(self) -> float:
        return self.speculation + self.selection + self.verification


@dataclass(frozen=True)
class IterationStats:
    """One decode iteration, as measured (times in seconds)."""

    n: int  # decoding requests
    depth: int
    width: int
    verified_tokens: int  # tree tokens verified, roots included
    prefill_tokens: int  # prefill chunk tokens riding along
    accepted: int  # tokens produced by the verifications, bonus tokens included
    latency: float
    speculation: float
    selection: float
    verification: float  # with acceptance and commit
    accepted_drafts: tuple[int, ...] = ()  # per decoding request: draft tokens accepted (bonus excluded)
    draft_depths: tuple[int, ...] = ()  # per decoding request: its verified tree's deepest draft (): all at `depth`
    context_tokens: int = 0  # IterationPlan.context_tokens
    draft_chain_tokens: int = 0  # IterationResult.draft_chain_tokens
    prefills: int = 0  # requests with a prefill chunk in the iteration
    # The whole engine step, as tools.profile's step fit times it: scheduling, the forwards, applying the
    # results (Engine.step stamps it once the step is over; 0 where nothing did).
    step: float = 0.0
    target_forward: float = 0.0  # IterationResult.target_forward
    predicted: float = 0.0  # the iteration's time as the estimator predicted it before it ran (0: no prediction)

    @classmethod
    def of(cls, plan: IterationPlan, result: IterationResult, predicted: float = 0.0) -> IterationStats:
        """A decode iteration's record, from its plan and what the model made of it."""
        return cls(
            n=len(plan.decode), depth=plan.depth, width=plan.width,
            verified_tokens=sum(v.draft_tokens + 1 for v in result.decoded), prefill_tokens=plan.prefill_tokens,
            accepted=sum(len(v.tokens) for v in result.decoded), latency=result.latency,
            speculation=result.speculation, selection=result.selection, verification=result.verification,
            accepted_drafts=tuple(v.accepted_drafts for v in result.decoded),
            draft_depths=tuple(v.draft_depth for v in result.decoded),
            context_tokens=plan.context_tokens, prefills=len(plan.prefill),
            draft_chain_tokens=result.draft_chain_tokens, target_forward=result.target_forward,
            predicted=predicted,
        )


def predicted_decode_s(est, plan: IterationPlan) -> float:
    """A decode iteration's time as the estimator predicts it before that iteration's measurement
    updates it (the prediction's error is recorded beside the measurement)."""
    n = len(plan.decode)
    if est.cost is None:
        return 0.0
    chunk = est.chunk_extra_ms(n, plan.depth, plan.prefill_tokens) / 1e3 if plan.prefill_tokens else 0.0
    return est.iteration_s(n, plan.depth, plan.width) + chunk
