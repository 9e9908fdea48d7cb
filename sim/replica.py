"""One simulated engine: the project's real Scheduler, Estimator, policy and token-tree selection, with a
simulated model runner in place of `ModelRunner`/`DraftWorker`/`verify`.

It mirrors `Engine.step`: take the inbox, `plan = scheduler.schedule(now)`, draft proposals (drafts.py,
with the draft cache's bookkeeping the DraftWorker does), `choose_trees` (the engine's function, called
the same way), the target's verification (acceptance drawn from the acceptance model, the accepted
path committed in the target's block table as ModelRunner.commit does), and `scheduler.update(plan,
IterationResult)` at the iteration's simulated end. The KV block managers are the real ones, so
admission, preemption and capacity behave as in the engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from adaserve_backend.config import SchedulerConfig, SpeculationConfig
from adaserve_backend.kv_cache import BlockManager, chain_parents
from adaserve_backend.replica_routing import ReplicaLoad, measure_load
from adaserve_backend.request import RequestOutput
from adaserve_backend.scheduler.draft_reads import draft_chain_span, draft_reads, drafts_now
from adaserve_backend.scheduler.plan import IterationPlan, IterationResult, Prefilled, Verified
from adaserve_backend.scheduler.policies import make_policy
from adaserve_backend.scheduler.prefill_estimator import Estimator
from adaserve_backend.scheduler.scheduler import Scheduler
from adaserve_backend.sequence import Sequence
from adaserve_backend.speculation import tree_choice
from adaserve_backend.speculation.copies import Copies
from adaserve_backend.speculation.token_tree import truncate_depth
from adaserve_backend.speculation.verify import ends_prompt

from . import drafts
from .acceptance import AcceptanceModel
from .cost import IterationCost, IterationShape


@dataclass(frozen=True)
class ReplicaConfig:
    scheduler: SchedulerConfig
    speculation: SpeculationConfig
    kv_blocks: int  # target cache blocks; the draft cache gets `draft_blocks`
    draft_blocks: int
    block_size: int = 16
    max_model_len: int = 32768
    prefix_caching: bool = False  # both caches share full committed blocks by their token prefix, as the engine's
    # Graft prompt lookup's and the suffix index's copies as the engine does (speculation/copies.py): only
    # where every request's true output tokens are known (SimRequest.continuation), which they match
    copies: bool = False


@dataclass
class InFlight:
    """An iteration that started and ends at `end` (the scheduler learns its result then)."""

    plan: IterationPlan
    result: IterationResult
    end: float


@dataclass
class Replica:
    index: int
    config: ReplicaConfig
    cost: IterationCost
    acceptance: AcceptanceModel
    rng: random.Random
    inbox: list[Sequence] = field(default_factory=list)
    in_flight: InFlight | None = None
    # seq_id -> its end-of-sequence output token (1-based); kept past release, which preemption calls too
    stops: dict[int, int] = field(default_factory=dict)
    truths: dict[int, tuple[int, ...]] = field(default_factory=dict)  # seq_id -> its true output tokens

    def __post_init__(self) -> None:
        cfg = self.config
        self.policy = make_policy(cfg.scheduler.policy)
        profile = self.cost.profile()
        self.budget = profile.budget
        spec = cfg.speculation
        self.estimator = Estimator.for_policy(profile, self.budget, self.policy, spec)  # as Engine.__init__ does
        self.target_blocks = BlockManager(cfg.kv_blocks, cfg.block_size, cfg.prefix_caching)
        self.draft_blocks = BlockManager(cfg.draft_blocks, cfg.block_size,
                                         cfg.prefix_caching) if self.policy.speculative else None
        self.scheduler = Scheduler(cfg.scheduler, spec, self.policy, self.estimator,
                                   self.target_blocks, self.draft_blocks)
        self.copies = Copies(self.scheduler.lookup) if cfg.copies and self.scheduler.lookup.reserved else None
        self.iterations = 0

    # ---- what routers read -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def load_at(self, now: float) -> ReplicaLoad:
        """What it would publish as a Ray Serve replica at `now` (replica_routing.measure_load); the inbox
        counts as waiting, and an iteration under way delays every first token."""
        busy = max(self.in_flight.end - now, 0.0) if self.in_flight else 0.0
        return measure_load(self.scheduler, len(self.scheduler.waiting) + len(self.inbox), self.inbox, busy, now)

    def has_work(self) -> bool:
        return bool(self.inbox) or self.scheduler.has_work()

    # ---- the loop ----------------------------------------------------------------------------------
    def add(self, seq: Sequence, stop_after: int | None = None, truth: tuple[int, ...] | None = None) -> None:
        self.inbox.append(seq)  # the engine's inbox: taken at the next step's start
        if stop_after is not None:
            self.stops[seq.seq_id] = stop_after
        if truth is not None:
            self.truths[seq.seq_id] = truth

    def begin(self, now: float) -> list[RequestOutput]:
        """Start an iteration at `now`. Returns outputs that need no model (rejections, failures);
        sets `in_flight` when the plan has work."""
        for seq in self.inbox:
            self.scheduler.add(seq)
        self.inbox.clear()
        plan = self.scheduler.schedule(now)
        if self.copies is not None:
            self.copies.forget(plan.released)
        if plan.empty:
            return self.scheduler.update(plan, IterationResult(now))
        self.in_flight = self._run(plan)
        return []

    def finish(self) -> list[RequestOutput]:
        fl, self.in_flight = self.in_flight, None
        self.iterations += 1
        return self.scheduler.update(fl.plan, fl.result)

    # ---- the simulated model runner ----------------------------------------------------------------
    def _run(self, plan: IterationPlan) -> InFlight:
        spec = self.config.speculation
        drafting = self.draft_blocks is not None and plan.runs_draft
        props, chain_tokens, draft_ctx = self._propose(plan) if drafting else ([], 0, 0)
        cands = [p.tree for p in props]
        if self.copies is not None and plan.copies:  # as DraftWorker.propose / copies.alone
            if drafting:
                for seq, p in zip(plan.decode, props):
                    self.copies.graft(seq, p.tree, self.config.max_model_len, p.drafted)
            else:
                cands = self.copies.alone(plan, self.config.max_model_len)
        trees = tree_choice.choose_trees(plan, cands, self.policy, self.estimator, spec)
        decoded, attended = [], 0
        for i, (seq, tree) in enumerate(zip(plan.decode, trees)):
            ctx = self.target_blocks.num_committed(seq.seq_id)
            attended += len(tree.tokens) * (ctx + len(tree.tokens))
            cand = cands[i] if cands else None
            path = drafts.accepted_path(tree, cand, props[i] if props else None, self._truth(seq, max(tree.depths())))
            self.target_blocks.append(seq.seq_id, tree.parents)  # ModelRunner.forward, then commit
            self.target_blocks.commit(seq.seq_id, path)
            if self.copies is not None and cand is not None:
                self.copies.learn(cand, tree, path)
            accepted = len(path) - 1
            decoded.append(Verified(seq, self._tokens(seq, accepted + 1), len(tree.tokens) - 1, accepted,
                                    max(tree.depths())))
        prefilled = []
        for seq, n in plan.prefill.items():
            ctx = self.target_blocks.num_committed(seq.seq_id)
            attended += n * (ctx + (n + 1) // 2)
            self.target_blocks.append(seq.seq_id, chain_parents(0, n))
            self.target_blocks.commit_all(seq.seq_id)
            prefilled.append(Prefilled(seq, n, self._tokens(seq, 1)[0] if ends_prompt(seq, n) else None))
        shape = IterationShape(len(plan.decode), plan.depth, plan.width, chain_tokens, len(plan.decode) * plan.width,
                               sum(len(t.tokens) for t in trees), plan.prefill_tokens,
                               plan.context_tokens, draft_ctx, attended,
                               len(plan.prefill))
        t_spec, t_verify = self.cost.durations(shape)
        end = plan.start + t_spec + t_verify
        result = IterationResult(end, decoded, prefilled, speculation=t_spec, verification=t_verify,
                                 draft_chain_tokens=chain_tokens)
        return InFlight(plan, result, end)

    def _propose(self, plan: IterationPlan) -> tuple[list[drafts.Proposal], int, int]:
        """DraftWorker.propose's effect on the draft cache, and synthetic candidate trees."""
        blocks, chain_tokens, ctx = self.draft_blocks, 0, 0
        chains = {s.seq_id: self._chain_len(s) for s in list(plan.prefill) + plan.decode}  # before anything is read
        for seq, decoding in [(s, False) for s in plan.prefill] + [(s, True) for s in plan.decode]:
            n = chains[seq.seq_id]  # what the draft reads in its first step: draft_reads.draft_reads
            if not drafts_now(n, decoding,
                              plan.depth) and (read := draft_reads(n, decoding, plan.depth, bool(plan.decode))):
                ctx += blocks.num_committed(seq.seq_id)
                blocks.append(seq.seq_id, chain_parents(0, read))
                blocks.commit_all(seq.seq_id)
                chain_tokens += read
        for seq in list(plan.prefill) + plan.decode:  # DraftWorker._publish: the blocks the chains just filled
            blocks.publish(seq.seq_id, seq.tokens)
        props = []
        for seq in plan.decode:
            n = chains[seq.seq_id]
            drafting = drafts_now(n, True, plan.depth)
            p = drafts.propose(self.rng, self.acceptance, plan.depth if drafting else 0, plan.width, seq.slo.slo_class,
                               self._truth(seq, plan.depth) if self.copies is not None else ())
            if drafting:  # beam_search: the chain, then d-1 levels of w beams, then only the chain stays
                ctx += blocks.num_committed(seq.seq_id) + n
                blocks.append(seq.seq_id, chain_parents(0, n) + [n - 1] * (plan.depth - 1) * plan.width)
                blocks.commit(seq.seq_id, list(range(n)))
                blocks.publish(seq.seq_id, seq.tokens)
                chain_tokens += n
            room = min(seq.request.max_tokens - len(seq.output), self.config.max_model_len - len(seq.tokens)) - 1
            truncate_depth(p.tree, max(room, 0))  # as DraftWorker.propose: no tree outgrows max_tokens
            props.append(p)
        return props, chain_tokens, ctx

    def _truth(self, seq: Sequence, n: int) -> tuple[int, ...]:
        """The request's next `n` true output tokens (fewer past the known ones, none unknown)."""
        at = len(seq.output)  # an end of sequence before the stop is emitted as TOKEN (_tokens): so here
        return tuple(t if t != drafts.EOS else drafts.TOKEN for t in self.truths.get(seq.seq_id, ())[at : at + n])

    def _tokens(self, seq: Sequence, n: int) -> list[int]:
        """The next `n` output tokens: the true ones where known (an end of sequence among them made
        TOKEN: the request stops where its workload says), and the end of sequence where the request
        stops (the output processor then drops what follows, as it does a real verification's)."""
        truth = self._truth(seq, n)
        out = list(truth) + [drafts.TOKEN] * (n - len(truth))
        at = self.stops.get(seq.seq_id, 0) - 1 - len(seq.output)
        if 0 <= at < n:
            out[at] = drafts.EOS
        return out

    def _chain_len(self, seq: Sequence) -> int:
        start, end = draft_chain_span(seq, self.target_blocks.num_committed(seq.seq_id),
                                      self.draft_blocks.num_committed(seq.seq_id))
        return max(end - start, 0)

