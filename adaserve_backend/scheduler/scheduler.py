"""The scheduler: owns the waiting and running queues, admits, chunks and paces prefill, keeps each
iteration within the KV caches (preempting when needed) and hands the engine an `IterationPlan`;
`update` applies what the model made of it (an `IterationResult`): outputs, stops, finished requests,
the estimator's measurements. Every request's final output comes from here, aborts included.

It owns the KV blocks of the target and draft caches (pure bookkeeping, kv_cache/block_manager.py):
`schedule` reserves each iteration's worst case (capacity.py) and the plan carries the block tables;
`update` trims what the commits left unused; a finished or preempted request's blocks are freed here,
and the next plan lists it in `released` for the model side's own per-request state. So it runs
without a model: tests drive `schedule` and `update` with a fake clock, fake estimates and hand-built
results.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

from ..config import SchedulerConfig, SpeculationConfig
from ..kv_cache import BlockManager
from ..output_processor import append_tokens, make_output
from ..request import INTERNAL_ERROR, FinishReason, RequestOutput
from ..sequence import Sequence
from .admission import best_effort_victim, keeps_slos
from .capacity import fit_iteration
from .deadlines import NO_CAPACITY, UNREACHABLE, rejection_message
from .first_tokens import FirstTokenGate, prefill_view
from .output_lengths import OutputLengthPredictor
from .plan import IterationPlan, IterationResult, IterationStats, predicted_decode_s
from .policies import Policy
from .prefill_estimator import Estimator
from .prefix import PrefixStats, reuse_prefix

log = logging.getLogger("adaserve")

NO_ROOM = "the KV cache cannot hold this request; raise the cache's memory_mb"


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        speculation: SpeculationConfig,
        policy: Policy,
        estimator: Estimator,
        target_blocks: BlockManager,
        draft_blocks: BlockManager | None,
        tokenizer=None,
    ) -> None:
        self.config, self.speculation, self.policy, self.estimator = config, speculation, policy, estimator
        self.target_blocks = target_blocks.scheduled()  # from now on only this scheduler allocates and frees
        self.draft_blocks = draft_blocks.scheduled() if draft_blocks is not None else None
        self.released: list[Sequence] = []  # freed since the last plan (IterationPlan.released)
        self.tokenizer = tokenizer  # only stop strings need one
        self.slo_admission = policy.slo_aware and config.slo_admission and estimator.cost is not None
        self.lookup = policy.lookup(speculation)  # trees may hold copied nodes beside the beams (capacity)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.overloads: dict[str, int] = {}  # first-token deadlines given up, by reason (rejected or best_effort)
        keep = config.stats_history
        self.iteration_stats: deque[IterationStats] = deque(maxlen=keep)  # recent decode iterations
        self.prefill_stats: deque[IterationStats] = deque(maxlen=keep)  # ... and prefill-only ones (n = 0)
        self.decode_iterations = 0
        self.prefix_stats = PrefixStats()
        self.gate = FirstTokenGate(config, policy, estimator, self.slo_admission, self.target_blocks,
                                   self.draft_blocks)
        q = config.output_length_quantile
        self.lengths = OutputLengthPredictor(q) if q is not None else None

    # ---- queues --------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.delivery_s = self.config.first_token_margin_ms / 1e3
        seq.tpot_margin = self.config.tpot_margin
        self.waiting.append(seq)
        self.waiting = self.policy.order(self.waiting)

    def abort(self, request_id: str, now: float) -> list[RequestOutput]:
        """End the request (unknown or already finished: nothing to do)."""
        gone = [s for s in list(self.waiting) + self.running if s.request.request_id == request_id]
        return [self._end(seq, now, FinishReason.ABORT) for seq in gone]

    def fail_all(self, message: str, now: float) -> list[RequestOutput]:
        """End every request with an error (after a failure that may have left any state behind)."""
        return [self._end(seq, now, FinishReason.ERROR, message) for seq in list(self.waiting) + self.running]

    def _end(self, seq: Sequence, now: float, reason: FinishReason, error: str | None = None) -> RequestOutput:
        self._drop(seq)
        return make_output(seq, [], now, reason, error)

    def _drop(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    def _free(self, seq: Sequence) -> None:
        for blocks in (self.target_blocks, self.draft_blocks):
            if blocks is not None:
                blocks.free(seq.seq_id)
        self.released.append(seq)

    # ---- one iteration -------------------------------------------------------------------------
    def schedule(self, now: float) -> IterationPlan:
        plan = IterationPlan(start=now)
        self._time_out(now, plan)
        for seq in self.running if self.lengths is not None else ():
            if seq.output:  # what it produced so far conditions its length
                self.lengths.plan(seq)
        self._admit(now, plan)
        decode = [s for s in self.running if s.decoding]
        prefill = [s for s in self.running if not s.decoding]
        if self.policy.prefill_first and prefill:
            decode = []
        speculates = self.draft_blocks is not None and decode
        depth, width = self.estimator.next_depth_width(len(decode)) if speculates else (0, 0)
        chunks = self.gate.chunks(prefill, decode, depth, width, now)
        plan.decode, plan.depth, plan.width, plan.copies = self._ensure_capacity(decode, chunks, depth, width, plan)
        plan.prefill = {s: n for s, n in chunks.items() if s in self.running}
        plan.block_tables = {s.seq_id: self.target_blocks.table(s.seq_id) for s in plan.scheduled}
        if self.draft_blocks is not None:
            plan.draft_block_tables = {s.seq_id: self.draft_blocks.table(s.seq_id) for s in plan.scheduled}
        plan.released, self.released = self.released, []
        committed = self.target_blocks.num_committed
        plan.context_tokens = sum(committed(s.seq_id) for s in plan.decode) + sum(committed(s.seq_id) + n
                                                                                  for s, n in plan.prefill.items())
        return plan

    def update(self, plan: IterationPlan, result: IterationResult) -> list[RequestOutput]:
        """Apply an iteration's results: each request's new tokens, stops and prefill progress, the
        requests that ended, and the iteration's measurements to the estimator."""
        now = result.now
        outputs = [make_output(seq, [], now, FinishReason.ERROR, msg) for seq, msg in plan.failed]  # already dropped
        # a rejection is decided (and timed) when the plan was made, before the iteration ran
        outputs += [make_output(seq, [], plan.start, FinishReason.REJECTED, msg) for seq, msg in plan.rejected]
        outputs += [self._end(seq, now, FinishReason.ERROR, msg) for seq, msg in result.failed]
        for v in result.decoded:
            v.seq.verifications += 1
            v.seq.draft_tokens += v.draft_tokens
            v.seq.accepted_drafts += v.accepted_drafts
            v.seq.accepted_prediction += v.accepted_prediction
            outputs.append(self._emit(v.seq, v.tokens, now, v.logprobs))
        for p in result.prefilled:
            if p.prompt_logprobs is not None:  # in place: a request preempted mid-prompt scores it again
                del p.seq.prompt_logprobs[p.seq.prefilled:]
                p.seq.prompt_logprobs += p.prompt_logprobs
            p.seq.prefilled += p.tokens
            if p.first_token is not None:
                p.seq.first_token_time = now
                first = None if p.first_logprob is None else [p.first_logprob]
                outputs.append(self._emit(p.seq, [p.first_token], now, first))
        if plan.prefill_tokens:
            self.estimator.record_prefill(len(plan.decode), plan.depth, plan.width, plan.prefill_tokens, result.latency)
        if plan.decode:
            self._record(plan, result)
        elif plan.prefill:
            self.prefill_stats.append(IterationStats.of(plan, result))
        for seq in plan.scheduled:  # what a reservation held past the committed tokens goes back
            for blocks in (self.target_blocks, self.draft_blocks):
                if blocks is not None:
                    blocks.trim(seq.seq_id)
            self.target_blocks.publish(seq.seq_id, seq.tokens, root=seq.cache_root)  # (the draft's: draft worker)
        return outputs

    def _emit(self, seq: Sequence, tokens: list[int], now: float, logprobs=None) -> RequestOutput:
        try:
            new, reason = append_tokens(seq, tokens, self.tokenizer, logprobs)
        except Exception:  # a stop-string check that fails ends this request only
            log.exception("request %s failed", seq.request.request_id)
            return self._end(seq, now, FinishReason.ERROR, INTERNAL_ERROR)
        if reason:
            self._drop(seq)
            if self.lengths is not None:
                self.lengths.observe(seq)
        return make_output(seq, new, now, reason)

    def stamp_step(self, plan: IterationPlan, seconds: float) -> None:
        """The whole step's time, known once update() is over, onto its record."""
        stats = self.iteration_stats if plan.decode else self.prefill_stats if plan.prefill else None
        if stats:
            stats[-1] = dataclasses.replace(stats[-1], step=seconds)

    def _record(self, plan: IterationPlan, result: IterationResult) -> None:
        stats = IterationStats.of(plan, result, predicted_decode_s(self.estimator, plan))
        self.estimator.record(stats)
        self.iteration_stats.append(stats)
        self.decode_iterations += 1

    def _admit(self, now: float, plan: IterationPlan) -> None:
        deferred = self._give_up_unreachable(now, plan) if self.slo_admission else set()
        reserved, i, started = 0, 0, []
        while i < len(self.waiting):
            seq = self.waiting[i]
            if seq in deferred:  # held back so that more of a burst's first tokens come in time
                i += 1
                continue
            need = self.target_blocks.blocks_for(seq.prefill_goal + 1)
            fits = reserved + need <= self.target_blocks.num_free_blocks
            victim = best_effort_victim(seq, self.running)
            if len(self.running) < self.config.max_num_seqs and fits:
                if self.slo_admission and self.running and not keeps_slos(seq, self.running,
                                                                          self.estimator, self.config, now):
                    with_slos = [s for s in self.running if not s.slo.best_effort]
                    if victim is not None and (not with_slos
                                               or keeps_slos(seq, with_slos, self.estimator, self.config, now)):
                        self._preempt(victim)  # best effort runs on what the requests with SLOs leave
                        i = self.waiting.index(seq)
                    else:
                        i += 1  # it would put someone off their SLO now; a looser request may still fit
                    continue
                del self.waiting[i]
                self.running.append(seq)
                if not self.target_blocks.has(seq.seq_id):
                    if seq.request.prompt_logprobs is None:  # a scored prompt is computed whole
                        cached = reuse_prefix(seq, self.target_blocks, self.draft_blocks, self.prefix_stats)
                        seq.cached_tokens = seq.cached_tokens or cached  # the first admission's, not a re-prefill's
                    started.append(seq)
                seq.admitted_time = seq.admitted_time if seq.admitted_time is not None else now
                reserved += need
            elif victim is not None or self.policy.preempts_for(seq, self.running):
                self._preempt(victim or self.policy.victim(self.running))  # re-ordered behind the more urgent head
                i = self.waiting.index(seq)
            else:
                break
        self.gate.predict(started, self.running, now)
        if self.slo_admission:
            self._give_up_late(now, plan)

    def _time_out(self, now: float, plan: IterationPlan) -> None:
        limit = self.config.max_request_s
        for seq in [s for s in list(self.waiting) + self.running if limit is not None and now - s.arrival > limit]:
            self._drop(seq)
            plan.failed.append((seq, f"request timed out: unfinished {limit:g} s after it arrived"))

    # ---- first-token deadlines (first_tokens.py, deadlines.py) ------------------------------------
    def prefill_view(self) -> tuple[int, list[Sequence]]:
        """Decoding requests (what prefill rides along) and the running requests still prefilling."""
        return prefill_view(self.running)

    def prefill_cap(self, num_decode: int) -> int:
        """Prefill tokens an iteration beside `num_decode` decoding requests may carry."""
        return self.gate.prefill_cap(num_decode)

    def _give_up_unreachable(self, now: float, plan: IterationPlan) -> set[Sequence]:
        """The overload answer at once for requests past saving; returns those a burst holds back."""
        self.waiting, late = self.gate.unreachable(self.waiting, self.running, now)
        for seq, at in late:
            self._overload(seq, UNREACHABLE, at, plan)
        return self.gate.deferred(self.waiting, self.running, now)

    def _give_up_late(self, now: float, plan: IterationPlan) -> None:
        """So that no request waits past its deadline unanswered (FirstTokenGate.late_after_next)."""
        for seq, at in self.gate.late_after_next(self.waiting, self.running, now):
            self._overload(seq, NO_CAPACITY, at, plan)

    def _overload(self, seq: Sequence, reason: str, first_token: float, plan: IterationPlan) -> None:
        """reject: end it now, with the prediction in the message; best_effort: serve it when capacity
        frees, marked as having missed its SLO. Never a request that has streamed (has_deadline)."""
        self.overloads[reason] = self.overloads.get(reason, 0) + 1
        seq.missed = reason
        if self.config.overload == "reject":
            self._drop(seq)
            plan.rejected.append((seq, rejection_message(seq, first_token)))

    # ---- KV capacity ---------------------------------------------------------------------------
    def _ensure_capacity(self, decode, chunks, depth, width, plan: IterationPlan):
        """Preempt the least urgent requests until this iteration's worst-case KV needs fit
        (capacity.fit_iteration); a lone request that does not fit even without speculation fails."""
        fit = fit_iteration(self.target_blocks, self.draft_blocks, self.running, decode, chunks, depth, width,
                            self.lookup.reserved, self.lookup.suffix_tokens,
                            lambda: self._preempt(self.policy.victim(self.running)))
        if fit is None:
            seq = self.running[0]
            self._drop(seq)
            plan.failed.append((seq, NO_ROOM))
            return [], 0, 0, False
        return fit.decode, fit.depth, fit.width, fit.copies

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: the request keeps its output and re-prefills it when re-admitted."""
        self.running.remove(seq)
        self._free(seq)
        self.num_preemptions += 1
        seq.preempted()
        self.waiting.appendleft(seq)
        self.waiting = self.policy.order(self.waiting)
