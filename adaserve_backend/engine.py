"""The engine loop: requests in from any thread, then per iteration
  plan = scheduler.schedule(now)         admission, prefill chunks, KV capacity (scheduler/)
  cands = draft.propose(plan)            d batched draft forwards of width-w beam search
  trees = choose_trees(plan, cands)      SLO-customized and throughput-optimized selection within B
  out = target.forward(trees + chunks)   one verification forward, prefill chunks riding along
  accept, commit, emit                   per request: greedy or lossless sampling acceptance
and the measured iteration goes to the estimator. Baseline policies share everything but the decode
step (one token per request, no draft).

Thread-safety: `add_request` and `abort` may be called from any thread; everything else runs on the
thread that calls `step` (the engine loop), which owns the models.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator

import torch

from .config import EngineConfig
from .cost_model.cost_model import load_cost_model
from .draft_worker import DraftWorker
from .model_runner import ModelRunner, SeqInput
from .models import LlamaModel, load_model
from .output_processor import append_tokens, choose, make_output
from .request import FinishReason, Request, RequestOutput
from .scheduler.estimator import Estimator
from .scheduler.plan import IterationPlan, IterationStats
from .scheduler.scheduler import Scheduler
from .sequence import Sequence
from .speculation.draft_fit import check_draft_fits, check_tokenizers_match
from .speculation.tree_choice import choose_trees
from .speculation.token_tree import CandidateTree, TokenTree
from .verification.acceptance import accept

log = logging.getLogger("adaserve")


class Engine:
    def __init__(
        self, config: EngineConfig, target: LlamaModel | None = None, draft: LlamaModel | None = None,
        eos_token_ids: Iterable[int] = (), tokenizer=None,
    ) -> None:
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.policy = config.scheduler.make_policy()
        target = target or load_model(config.target)
        self.target = ModelRunner(target, config.target_cache)
        self.vocab_size, self.max_model_len = target.spec.vocab_size, self.target.max_len
        self.draft: DraftWorker | None = None
        if self.policy.speculative:
            if draft is None:  # no draft configured: the target drafts for itself
                draft = target if config.draft is None else load_model(dataclasses.replace(config.draft, max_model_len=self.max_model_len))
            check_draft_fits(target, draft)
            self.draft = DraftWorker(ModelRunner(draft, config.draft_cache), self.target)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer = tokenizer  # only needed for stop strings
        self.cost = load_cost_model(config.speculation.profile_path)
        self.budget = self.cost.budget if self.cost else config.speculation.budget
        self.estimator = Estimator(self.cost, self.budget, lambda n: self.policy.depth_width(n, self.budget, config.speculation))
        self.scheduler = Scheduler(config.scheduler, config.speculation, self.policy, self.estimator, self.target.blocks,
                                   self.draft.runner.blocks if self.draft else None, self._release)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live_ids: set[str] = set()  # accepted and not yet finished; guarded by _live_lock
        self._live_lock = threading.Lock()
        self._next_seq_id = 0
        self.iteration_stats: deque[IterationStats] = deque(maxlen=10_000)  # recent decode iterations
        self.decode_iterations = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """Load the target (and draft) checkpoints, the tokenizer and the end-of-sequence ids."""
        from .models import is_trained_draft, load_tokenizer, locate

        tokenizer = load_tokenizer(locate(config.target.path))
        if config.scheduler.speculative and config.draft is not None and not is_trained_draft(config.draft.path):
            check_tokenizers_match(tokenizer, load_tokenizer(locate(config.draft.path)))
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        return cls(config, eos_token_ids=eos, tokenizer=tokenizer)

    # ---- API for other threads ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Validate (raising ValueError for bad input) and enqueue. Safe from any thread."""
        request.validate(self.vocab_size, self.max_model_len)
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need an engine built with a tokenizer")
        if request.slo_class is not None:  # checked even when tpot_slo_ms makes it unused: a typo is an error
            self.config.scheduler.slo_ms(request.slo_class)
        with self._live_lock:
            if request.request_id in self._live_ids:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self._live_ids.add(request.request_id)
        self._inbox.put(("add", request, time.monotonic()))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id, None))

    # ---- engine loop ----------------------------------------------------------------------------
    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        self._drain_inbox(outputs)
        plan = self.scheduler.schedule(time.monotonic())
        for seq, message in plan.failed:
            outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ERROR, error=message))
        if plan.empty:
            return outputs
        cands = self.draft.propose(plan, self.max_model_len) if self.draft else []
        t_spec = time.monotonic()
        trees = choose_trees(plan, cands, self.policy, self.estimator, self.config.speculation)
        t_select = time.monotonic()
        inputs = [SeqInput(s.seq_id, t.tokens, parents=t.parents, num_logits=len(t.tokens)) for s, t in zip(plan.decode, trees)]
        inputs += [self._prefill_input(s, n) for s, n in plan.prefill.items()]
        out = self.target.forward(inputs)
        now = time.monotonic()
        # Past the batched forward, work is per request: a failure there ends that request only.
        accepted = 0
        for i, (seq, tree) in enumerate(zip(plan.decode, trees)):
            try:
                accepted += self._verify(seq, tree, cands[i] if cands else None, out.of(i), out.hidden_of(i), now, outputs)
            except Exception as e:
                self._fail(seq, e, outputs)
        for j, (seq, n) in enumerate(plan.prefill.items(), start=len(plan.decode)):
            try:
                self._finish_prefill_chunk(seq, n, out.of(j), out.hidden_of(j), now, outputs)
            except Exception as e:
                self._fail(seq, e, outputs)
        if plan.decode:
            self._record(plan, sum(len(t.tokens) for t in trees), accepted, t_spec, t_select, now)
        return outputs

    def _record(self, plan: IterationPlan, verified: int, accepted: int, t_spec: float, t_select: float, now: float) -> None:
        stats = IterationStats(
            n=len(plan.decode), depth=plan.depth, width=plan.width, verified_tokens=verified,
            prefill_tokens=plan.prefill_tokens, accepted=accepted, latency=time.monotonic() - plan.start,
            speculation=t_spec - plan.start, selection=t_select - t_spec, verification=now - t_select,
        )
        self.estimator.record(stats)
        self.iteration_stats.append(stats)
        self.decode_iterations += 1

    def mean_accepted(self) -> float:
        """Mean tokens produced per verification (bonus included) since the last reset."""
        return self.estimator.mean_accepted()

    def reset_stats(self) -> None:
        self.iteration_stats.clear()
        self.estimator.reset_totals()

    def fail_all(self, message: str) -> list[RequestOutput]:
        """End every request with an error and free all KV blocks (after an unexpected failure)."""
        outputs: list[RequestOutput] = []
        self._drain_inbox(outputs)  # a queued abort still owes its request an ABORT; queued adds fail below
        now = time.monotonic()
        for seq in self.scheduler.drop_all():
            outputs.append(self._output(seq, [], now, FinishReason.ERROR, error=message))
        return outputs

    def _fail(self, seq: Sequence, error: Exception, outputs: list[RequestOutput]) -> None:
        log.exception("request %s failed", seq.request.request_id, exc_info=error)
        self.scheduler.finish(seq)
        msg = f"internal error: {type(error).__name__}: {error}"
        outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ERROR, error=msg))

    def drain(self, max_steps: int = 1_000_000) -> Iterator[RequestOutput]:
        """Drive the loop until every request finished, yielding the outputs as they come."""
        for _ in range(max_steps):
            if not self.has_work():
                return
            yield from self.step()
        raise RuntimeError("engine did not finish within max_steps")

    def run_until_done(self, max_steps: int = 1_000_000) -> dict[str, list[int]]:
        """Drive the loop until every request finished; returns output ids per request id."""
        results: dict[str, list[int]] = {}
        for o in self.drain(max_steps):
            results.setdefault(o.request_id, []).extend(o.new_token_ids)
        return results

    # ---- requests in and out --------------------------------------------------------------------
    def _drain_inbox(self, outputs: list[RequestOutput]) -> None:
        while not self._inbox.empty():
            kind, payload, received = self._inbox.get()
            if kind == "add":
                self.scheduler.add(self._sequence(payload, received))
            else:
                for seq in self.scheduler.abort(payload):
                    outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ABORT))

    def _sequence(self, req: Request, received: float) -> Sequence:
        sched = self.config.scheduler
        slo_ms = req.tpot_slo_ms or sched.slo_ms(req.slo_class or sched.default_slo_class)
        gen = None
        if not req.sampling.greedy:
            gen = torch.Generator().manual_seed(req.sampling.seed if req.sampling.seed is not None else torch.seed())
        eos = frozenset() if req.ignore_eos else self.eos_token_ids
        seq = Sequence(req, self._next_seq_id, slo_ms / 1e3, req.arrival_time or received, eos, gen, len(req.prompt_ids))
        self._next_seq_id += 1
        return seq

    def _release(self, seq: Sequence) -> None:
        self.target.free(seq.seq_id)
        if self.draft is not None:
            self.draft.release(seq)

    def _output(self, seq, new, now, reason, error=None) -> RequestOutput:
        if reason is not None:
            with self._live_lock:
                self._live_ids.discard(seq.request.request_id)
        return make_output(seq, new, now, reason, error)

    # ---- verification ---------------------------------------------------------------------------
    def _prefill_input(self, seq: Sequence, n: int) -> SeqInput:
        last = seq.prefilled + n == seq.prefill_goal and not seq.output
        return SeqInput(seq.seq_id, seq.tokens[seq.prefilled : seq.prefilled + n], num_logits=1 if last else 0)

    def _verify(self, seq: Sequence, tree: TokenTree, cand: CandidateTree | None, logits, hidden, now, outputs) -> int:
        """Accept a path of `tree`, commit it in the target cache and the draft's chain in the draft
        cache, emit; returns the tokens it produced."""
        depths = tree.depths()
        result = accept(tree, lambda node: choose(seq, logits[node], len(seq.output) + depths[node]))
        self.target.commit(seq.seq_id, result.path)
        if self.draft is not None:
            if cand is not None:
                self.draft.commit(seq, cand)
            self.draft.add_features(seq, len(seq.tokens) - 1, hidden[result.path])
        seq.verifications += 1
        seq.draft_tokens += len(tree.tokens) - 1
        seq.accepted_drafts += result.num_accepted_drafts
        self._emit(seq, result.tokens, now, outputs)
        return len(result.tokens)

    def _finish_prefill_chunk(self, seq: Sequence, n: int, logits, hidden, now, outputs) -> None:
        self.target.commit_all(seq.seq_id)
        if self.draft is not None:
            self.draft.add_features(seq, seq.prefilled, hidden)
        seq.prefilled += n
        if seq.prefilled == seq.prefill_goal and not seq.output:
            seq.first_token_time = now
            self._emit(seq, [choose(seq, logits[0], 0)], now, outputs)

    def _emit(self, seq: Sequence, tokens: list[int], now: float, outputs: list[RequestOutput]) -> None:
        new, reason = append_tokens(seq, tokens, self.tokenizer)
        if reason:
            self.scheduler.finish(seq)
        outputs.append(self._output(seq, new, now, reason))
