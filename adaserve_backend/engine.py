"""The engine loop: requests in from any thread, then per iteration
  plan = scheduler.schedule(now)              admission, prefill chunks, KV blocks reserved (scheduler/)
  cands = draft.propose(plan)                 d batched draft forwards of width-w beam search
  trees = choose_trees(plan, cands)           SLO-customized and throughput-optimized selection within B
  out = target.forward(trees + chunks)        one verification forward, prefill chunks riding along
  result = verify(plan, trees, out)           per request: the accepted path, committed in both caches
  outputs = scheduler.update(plan, result)    tokens, stops, finished requests, the estimator's measurements
Baseline policies share everything but the decode step (one token per request, no draft).

Thread-safety: `add_request` and `abort` may be called from any thread (they only enqueue, inbox.py);
everything else runs on the thread that calls `step` (the engine loop), which owns the models.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Iterable, Iterator

import torch

from .calibration_pool import engine_parts, pooled
from .config import EngineConfig
from .cost_model.cost_model import CostModel, load_cost_model
from .device import check_device, on_cpu, synchronize
from .grammar.compiler import Grammars
from .grammar.spec import JSON, GrammarSpec
from .inbox import Inbox
from .model_runner import ModelRunner
from .models import LlamaModel, load_model
from .models.kernel_choice import apply as choose_kernels
from .output_processor import make_output
from .profiler import calibrate
from .request import FinishReason, Overloaded, Request, RequestOutput
from .scheduler.plan import IterationPlan, IterationResult
from .scheduler.policies import make_policy
from .scheduler.prefill_estimator import Estimator
from .scheduler.scheduler import Scheduler
from .scheduler.speculation_size import speculation_budget
from .sequence import Sequence
from .speculation.constrained import prune
from .speculation.draft_fit import check_draft_tokenizer
from .speculation.draft_worker import DraftWorker
from .speculation.tree_choice import choose_trees
from .speculation.verify import target_inputs, verify

log = logging.getLogger("adaserve")


class Engine:
    def __init__(
        self, config: EngineConfig, target: LlamaModel | None = None, draft: LlamaModel | None = None,
        eos_token_ids: Iterable[int] = (), tokenizer=None, grammars: Grammars | None = None,
    ) -> None:
        """`grammars`: structured output's compiler (by default over `tokenizer`'s vocabulary; without
        either, requests with a grammar are refused)."""
        self.config = config
        self.device = check_device(config.target.device)  # before any weights are read
        if config.threads is not None:  # the host's threads (scheduling, sampling) on any device
            torch.set_num_threads(config.threads)
        self.policy = make_policy(config.scheduler.policy)
        target = target or load_model(config.target)
        if target.embed_tokens.weight.device != self.device:
            raise ValueError(f"the target model is on {target.embed_tokens.weight.device}; the config says "
                             f"{config.target.device}")
        # before anything is timed: the calibration prices the kernels chosen here
        self.kernel_choice = choose_kernels(target, config.kernels) if on_cpu(self.device) else None
        self.target = ModelRunner(target, config.target_cache, graphs=config.target.cuda_graph_max_batch)
        self.vocab_size, self.max_model_len = target.spec.vocab_size, self.target.max_len
        self.draft = (DraftWorker.for_target(self.target, config, draft, self.policy.lookup(config.speculation))
                      if self.policy.speculative else None)
        self.eos_token_ids = frozenset(eos_token_ids)
        if grammars is None and tokenizer is not None:
            grammars = Grammars(tokenizer, self.vocab_size, self.eos_token_ids)
        self.grammars = grammars
        if not on_cpu(self.device):
            log.info("engine on %s: the CPU kernels (prepacked and fused layers, GGUF-block dtypes, paged_cpu "
                     "attention) stay off; attention runs %s", self.device, type(self.target.attn).__name__)
        spec = config.speculation
        self.cost = self._calibrate(config) if spec.calibrate else load_cost_model(spec.profile_path)
        self.budget = speculation_budget(self.cost, spec)
        self.estimator = Estimator.for_policy(self.cost, self.budget, self.policy, config.speculation)
        # The scheduler owns both caches' blocks from here on: it reserves, trims and frees them.
        self.scheduler = Scheduler(config.scheduler, config.speculation, self.policy,
                                   self.estimator, self.target.blocks,
                                   self.draft.runner.blocks if self.draft else None, tokenizer)
        self._inbox = Inbox()
        # Taken from the inbox, final output not produced yet: what fail_all still owes an answer. A step
        # that fails after it ended some requests (aborts taken, the plan's timed-out or rejected ones)
        # loses their outputs, and those requests have left the scheduler: without this their ids stayed
        # in flight and the front ends' per-request state (and their clients) waited for good.
        self._owed: dict[str, Sequence] = {}
        self._seq_ids = itertools.count()
        if spec.calibrate:
            self.warm_up()

    def _calibrate(self, config: EngineConfig) -> CostModel:
        draft, keep = self.draft.runner if self.draft else None, config.speculation.calibration_pool
        if keep != 1 and not on_cpu(self.device):
            # The pool steadies a CPU's timing noise and names a machine by its CPU, not by its GPU.
            log.info("calibration on %s: this start's alone (the calibration pool is for CPU engines)", self.device)
            keep = 1
        if keep == 1:  # this start's alone: no machine record to name or read
            return calibrate(self.target, draft)
        parts = engine_parts(config, self.target.model.spec, draft.model.spec if draft
                             else None, torch.get_num_threads(), self.kernel_choice)
        return calibrate(self.target, draft, pool=functools.partial(pooled, parts, keep=keep))

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """Load the target (and draft) checkpoints, the tokenizer and the end-of-sequence ids."""
        from .models import load_tokenizer, locate

        tokenizer = load_tokenizer(locate(config.target.path))
        check_draft_tokenizer(config, tokenizer)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        return cls(config, eos_token_ids=eos, tokenizer=tokenizer)

    # ---- API for other threads ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Validate (raising ValueError for bad input) and enqueue. Safe from any thread."""
        request.validate(self.vocab_size, self.max_model_len)
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need an engine built with a tokenizer")
        if request.grammar is not None:  # compiled here, on the caller's thread, for the loop to find cached
            if self.grammars is None:
                raise ValueError("a grammar (response_format) needs an engine built with a tokenizer")
            self.grammars.compile(request.grammar)
        slo = self.config.scheduler.resolve_slo(request.slo)  # ValueError for an unknown class
        self._inbox.put_request(request, slo)  # ValueError if its id is in flight

    def num_waiting(self) -> int:
        """Requests not admitted yet, queued ones included. Read from any thread: a bound, not a count."""
        return len(self.scheduler.waiting) + self._inbox.queued()

    def check_room(self) -> None:
        """Overloaded once SchedulerConfig.max_waiting requests wait already: what a serving driver asks
        before add_request, so a full queue is answered at once. Safe from any thread."""
        if (waiting := self.num_waiting()) >= self.config.scheduler.max_waiting:
            raise Overloaded(f"server overloaded: {waiting} requests are waiting; retry later")

    def abort(self, request_id: str) -> None:
        self._inbox.put_abort(request_id)

    # ---- engine loop ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self._take_inbox()
        plan = self.scheduler.schedule(time.monotonic())
        if self.draft is not None:
            self.draft.forget(plan.released)
        result = self._run(plan) if not plan.empty else IterationResult(time.monotonic())
        outputs += self.scheduler.update(plan, result)
        self.scheduler.stamp_step(plan, time.monotonic() - plan.start)
        return self._settle(outputs)

    def _run(self, plan: IterationPlan) -> IterationResult:
        drafting = self.draft is not None and plan.runs_draft
        if drafting:
            cands = self.draft.propose(plan, self.max_model_len)
        else:  # model-free proposals need no draft step
            cands = self.draft.copies.alone(plan, self.max_model_len) if self.draft is not None and plan.copies else []
        prune(plan.decode, cands)  # nothing a request's grammar forbids reaches selection
        # The times below teach the estimator: on a GPU each waits for the work it times (no-ops on the CPU).
        synchronize(self.device)
        t_spec = time.monotonic()
        trees = choose_trees(plan, cands, self.policy, self.estimator, self.config.speculation)
        t_select = time.monotonic()
        out = self.target.forward(target_inputs(plan, trees))
        synchronize(self.device)
        t_forward = time.monotonic()
        result = verify(plan, trees, cands, out, self.target, self.draft, time.monotonic())
        result.speculation, result.selection = t_spec - plan.start, t_select - t_spec
        result.draft_chain_tokens = self.draft.chain_tokens if drafting else 0
        result.verification = time.monotonic() - t_select
        result.target_forward = t_forward - t_select  # target_inputs too: building them is the forward's setup
        return result

    def fail_all(self, message: str) -> list[RequestOutput]:
        """End every request with an error and free all KV blocks (after an unexpected failure), those a
        failed step had ended without answering included."""
        outputs = self._take_inbox()  # a queued abort still owes its request an ABORT; queued adds fail below
        now = time.monotonic()
        outputs += self.scheduler.fail_all(message, now)
        answered = {o.request_id for o in outputs if o.finished}
        outputs += [make_output(seq, [], now, FinishReason.ERROR, message)
                    for request_id, seq in self._owed.items() if request_id not in answered]
        return self._settle(outputs)

    def _settle(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """A finished request is owed nothing more, and its id may be used again."""
        for o in outputs:
            if o.finished:
                self._owed.pop(o.request_id, None)
        return self._inbox.settle(outputs)

    def _take_inbox(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        for item, slo, received in self._inbox.take():
            if isinstance(item, Request):
                seq = Sequence.start(item, next(self._seq_ids), slo, received, self.eos_token_ids)
                if item.grammar is not None:
                    seq.grammar = self.grammars.start(item.grammar, item.max_tokens)
                self._owed[item.request_id] = seq
                self.scheduler.add(seq)
            else:
                outputs += self.scheduler.abort(item, time.monotonic())
        return outputs

    def has_work(self) -> bool:
        return self.scheduler.has_work() or not self._inbox.empty()

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

    def warm_up(self) -> None:
        """Serve two requests (a prompt of two prefill chunks, then speculative decoding, alone and
        side by side) through the whole step, so the first real requests pay no first-use costs; the
        scheduler's counters are reset after.

        Last, the garbage collector's debt: loading and measuring left hundreds of thousands of objects
        that its first full collection walks, a pause that fell on the first requests' steps
        (docs/scheduling.md#first-token-deadlines-and-overload). They live as long as the process, so they are collected
        once and then frozen: later full collections walk only what serving made."""
        import gc
        import random

        rng = random.Random(0)
        prompt = [rng.randrange(3, self.vocab_size)
                  for _ in range(min(2 * self.config.scheduler.prefill_chunk, self.max_model_len // 2))]
        self.add_request(Request("warm-up-0", prompt, max_tokens=16, ignore_eos=True))
        for _ in range(8):  # alone for a while (prefill, then decoding), then beside a second one
            self.step()
        self.add_request(Request("warm-up-1", prompt[1:], max_tokens=16, ignore_eos=True))  # no shared prefix
        list(self.drain())
        self.reset_stats()
        self.estimator.forget_yield()  # random tokens teach the times, not what real text yields
        if self.grammars is not None:  # the vocabulary's grammar tables, a second's work no request should wait for
            self.grammars.compile(GrammarSpec(JSON))
        gc.collect()
        gc.freeze()

    # ---- what readers (metrics, benchmarks, tests) look at --------------------------------------
    tokenizer = property(lambda self: self.scheduler.tokenizer)
    running = property(lambda self: self.scheduler.running)
    waiting = property(lambda self: self.scheduler.waiting)
    num_preemptions = property(lambda self: self.scheduler.num_preemptions)
    iteration_stats = property(lambda self: self.scheduler.iteration_stats)
    prefill_stats = property(lambda self: self.scheduler.prefill_stats)
    decode_iterations = property(lambda self: self.scheduler.decode_iterations)

    def mean_accepted(self) -> float:
        """Mean tokens produced per verification (bonus included) since the last reset."""
        return self.estimator.mean_accepted()

    def reset_stats(self) -> None:
        self.iteration_stats.clear()
        self.prefill_stats.clear()
        self.estimator.reset_totals()
