"""The continuous-batching engine: admits requests at any time, runs iterations, reports outputs.

One iteration under a speculative policy (the paper's Algorithm 2):
  1. speculation: d batched draft forwards of width-w beam search for every decoding request
     (prefill chunks of other requests ride along in the first one);
  2. SLO-customized, 3. throughput-optimized selection of the nodes to verify, within budget B (with a
     profile, only as much of B as raises expected tokens per second);
  4. verification: one target forward holding every selected tree and the prefill chunks; the
     accepted path of each tree is committed in the target cache, the rest released.
The draft cache only keeps tokens the draft saw with the target's features (its chain, see
`_draft_chain`): accepted tokens are fed again, as the next iteration's chain, with the features the
target just computed for them (for a feature-conditioned draft; a plain draft is fed the same way).
Baseline policies share everything but the decode step (one token per request, no draft).
With a profile, `adaserve` also admits a waiting request, and lets prefill chunks ride along decode,
only as far as the running requests' SLOs allow (SchedulerConfig.slo_admission).

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
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from .config import EngineConfig, policy_name
from .cost_model.cost_model import CostModel, load_cost_model
from .model_runner import ModelRunner, SeqInput
from .models import LlamaModel, load_model
from .request import FinishReason, Request, RequestOutput
from . import stop_strings
from .sampling import choose_token
from .stop_strings import StopScan
from .scheduler.control import adaptive_depth_width, ends_within_slo, paced_chunk, slo_slack_s
from .speculation.draft_fit import check_draft_fits, check_tokenizers_match
from .speculation.beam import BeamRequest, beam_search
from .speculation.selection import ROOT_CREDIT, SelectionParams, expected_accepted, required_accepted, select_tokens
from .speculation.token_tree import CandidateTree, TokenTree
from .verification.acceptance import accept

log = logging.getLogger("adaserve")


@dataclass(eq=False)  # identity semantics: sequences key per-iteration dicts
class Sequence:
    request: Request
    seq_id: int
    tpot_slo_s: float
    arrival: float
    eos_ids: frozenset[int]
    generator: torch.Generator | None
    prefill_goal: int  # tokens to prefill: the prompt, or after a preemption all but the last token
    output: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    prefilled: int = 0  # of those, already in the target cache
    # The target's final hidden states for positions features_start.., those the draft has not yet
    # read (a feature-conditioned draft only): the draft's token i reads the feature of position i-1.
    features: torch.Tensor | None = None
    features_start: int = 0
    emitted: int = 0  # output tokens reported; those after it are held back by a possible stop string
    stop_scan: StopScan = field(default_factory=StopScan)
    verifications: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.request.prompt_ids + self.output

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prefill_goal and bool(self.output)


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        target: LlamaModel | None = None,
        draft: LlamaModel | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer=None,
    ) -> None:
        self.config = config
        self.policy, self.spec_n = policy_name(config.scheduler.policy)
        target = target or load_model(config.target)
        self.target = ModelRunner(target, config.target_cache)
        self.vocab_size = target.spec.vocab_size
        self.max_model_len = self.target.max_len
        self.draft: ModelRunner | None = None
        if config.scheduler.speculative:
            if draft is None and config.draft is None:
                draft = target
            elif draft is None:
                draft = load_model(dataclasses.replace(config.draft, max_model_len=self.max_model_len))
            check_draft_fits(target, draft)
            self.draft = ModelRunner(draft, config.draft_cache)
        self._keep_features = self.draft is not None and self.draft.model.takes_features
        self._no_features = torch.zeros(0, target.spec.hidden_size, device=self.target.device)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer = tokenizer  # only needed for stop strings
        spec = config.speculation
        self.cost: CostModel | None = load_cost_model(spec.profile_path)
        self.budget = self.cost.budget if self.cost else spec.budget
        # t_spec in A(r): the cost model's prediction times an EMA of measured/predicted, or without a
        # profile an EMA of measured decode iterations.
        self.t_iter = 0.0
        self._cost_correction = 1.0
        # by the number of decoding requests: EMAs of tokens per request and tree tokens verified
        self._by_load: dict[int, tuple[float, float]] = {}
        self._scored = self._hits = 0.0  # decaying sums (about 50 iterations): draft scores verified, drafts accepted
        self._slo_admission = self.policy == "adaserve" and config.scheduler.slo_admission and self.cost is not None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live_ids: set[str] = set()  # accepted and not yet finished; guarded by _live_lock
        self._live_lock = threading.Lock()
        self._next_seq_id = 0
        self.iteration_stats: deque[dict] = deque(maxlen=10_000)  # recent decode iterations
        self.num_preemptions = 0
        self.decode_iterations = 0
        self.total_verifications = 0
        self.total_accepted = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        """Load the target (and draft) checkpoints, the tokenizer and the end-of-sequence ids."""
        from .models import load_tokenizer, locate
        from .models.loader import is_trained_draft

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
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or not self._inbox.empty())

    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        self._drain_inbox(outputs)
        self._admit()
        if not self.running:
            return outputs
        start = time.monotonic()
        decode = [s for s in self.running if s.decoding]
        prefill = [s for s in self.running if not s.decoding]
        if self.policy == "continuous" and prefill:
            decode = []  # vLLM-style: prefill iterations take precedence over decode
        if self.draft is not None and decode:
            depth, width = self._depth_width(len(decode))
        else:
            depth = width = 0
        chunks = self._prefill_chunks(prefill, decode, depth, width, start)
        decode, depth, width = self._ensure_capacity(decode, chunks, depth, width, outputs)
        chunks = {s: n for s, n in chunks.items() if s in self.running}

        cands = self._speculate(decode, chunks, depth, width)
        t_spec = time.monotonic()
        trees = self._select(decode, cands, chunks, depth, width, start)
        t_select = time.monotonic()
        target_in = [SeqInput(s.seq_id, t.tokens, parents=t.parents, num_logits=len(t.tokens)) for s, t in zip(decode, trees)]
        target_in += [self._prefill_input(s, n) for s, n in chunks.items()]
        if not target_in:
            return outputs
        out = self.target.forward(target_in)
        now = time.monotonic()
        accepted = 0
        # Past the batched forward, work is per request: a failure there ends that request only.
        for i, (seq, tree) in enumerate(zip(decode, trees)):
            try:
                accepted += self._verify(seq, tree, cands[i] if cands else None, out.of(i), out.hidden_of(i), now, outputs)
            except Exception as e:
                self._fail(seq, e, outputs)
        for j, (seq, n) in enumerate(chunks.items()):
            try:
                self._finish_prefill_chunk(seq, n, out.of(len(decode) + j), out.hidden_of(len(decode) + j), now, outputs)
            except Exception as e:
                self._fail(seq, e, outputs)
        if decode:
            phases = {"speculation": t_spec - start, "selection": t_select - t_spec, "verification": now - t_select}
            verified = sum(len(t.tokens) for t in trees)
            self._record_iteration(len(decode), depth, width, verified, sum(chunks.values()), accepted, start, phases)
        return outputs

    def _record_iteration(self, n, depth, width, verified, prefill, accepted, start, phases) -> None:
        elapsed = time.monotonic() - start
        self.t_iter = elapsed if self.t_iter == 0 else 0.7 * self.t_iter + 0.3 * elapsed
        if self.cost:
            predicted = self.cost.iteration_ms(n, depth, width, verified + prefill) / 1e3
            self._cost_correction = 0.7 * self._cost_correction + 0.3 * elapsed / predicted
        if depth:
            self._hits = 0.98 * self._hits + accepted - n  # bonus tokens excluded
        now = (accepted / n, float(verified))
        old = self._by_load.get(n, now)
        self._by_load[n] = (0.8 * old[0] + 0.2 * now[0], 0.8 * old[1] + 0.2 * now[1])
        self.decode_iterations += 1
        self.total_verifications += n
        self.total_accepted += accepted
        self.iteration_stats.append(
            {
                "n": n,
                "depth": depth,
                "width": width,
                "verified_tokens": verified,
                "accepted": accepted,  # tokens produced by the verifications, bonus tokens included
                "latency": elapsed,
                **phases,  # seconds spent speculating, selecting, verifying (with acceptance and commit)
            }
        )

    def mean_accepted(self) -> float:
        """Mean tokens produced per verification (bonus included) over this engine's lifetime."""
        return self.total_accepted / max(self.total_verifications, 1)

    def reset_stats(self) -> None:
        self.iteration_stats.clear()
        self.total_verifications = self.total_accepted = 0

    def fail_all(self, message: str) -> list[RequestOutput]:
        """End every request with an error and free all KV blocks (after an unexpected failure)."""
        outputs: list[RequestOutput] = []
        self._drain_inbox(outputs)  # a queued abort still owes its request an ABORT; queued adds fail below
        now = time.monotonic()
        for seq in list(self.waiting) + self.running:
            self._release(seq)
            outputs.append(self._output(seq, [], now, FinishReason.ERROR, error=message))
        self.waiting.clear()
        self.running.clear()
        return outputs

    def _fail(self, seq: Sequence, error: Exception, outputs: list[RequestOutput]) -> None:
        log.exception("request %s failed", seq.request.request_id, exc_info=error)
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)
        msg = f"internal error: {type(error).__name__}: {error}"
        outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ERROR, error=msg))

    def run_until_done(self, max_steps: int = 1_000_000) -> dict[str, list[int]]:
        """Drive the loop until every request finished; returns output ids per request id."""
        results: dict[str, list[int]] = {}
        for _ in range(max_steps):
            if not self.has_work():
                return results
            for o in self.step():
                results.setdefault(o.request_id, []).extend(o.new_token_ids)
        raise RuntimeError("engine did not finish within max_steps")

    # ---- admission, prefill, capacity -----------------------------------------------------------
    def _drain_inbox(self, outputs: list[RequestOutput]) -> None:
        while not self._inbox.empty():
            kind, payload, t = self._inbox.get()
            if kind == "add":
                self._enqueue(payload, t)
            else:
                self._abort(payload, outputs)

    def _enqueue(self, req: Request, received: float) -> None:
        slo_ms = req.tpot_slo_ms or self.config.scheduler.slo_ms(req.slo_class or self.config.scheduler.default_slo_class)
        gen = None
        if not req.sampling.greedy:
            gen = torch.Generator().manual_seed(req.sampling.seed if req.sampling.seed is not None else torch.seed())
        eos = frozenset() if req.ignore_eos else self.eos_token_ids
        seq = Sequence(req, self._next_seq_id, slo_ms / 1e3, req.arrival_time or received, eos, gen, len(req.prompt_ids))
        self._next_seq_id += 1
        self.waiting.append(seq)
        if self.policy == "priority":
            self._sort_waiting()

    def _sort_waiting(self) -> None:
        self.waiting = deque(sorted(self.waiting, key=lambda s: (s.tpot_slo_s, s.arrival)))

    def _abort(self, request_id: str, outputs: list[RequestOutput]) -> None:
        for pool in (self.waiting, self.running):
            for seq in list(pool):
                if seq.request.request_id == request_id:
                    pool.remove(seq)
                    self._release(seq)
                    outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ABORT))

    def _admit(self) -> None:
        sched = self.config.scheduler
        reserved, i = 0, 0
        while i < len(self.waiting):
            seq = self.waiting[i]
            need = self.target.blocks.blocks_for(seq.prefill_goal + 1)
            fits = reserved + need <= self.target.blocks.num_free_blocks
            if len(self.running) < sched.max_num_seqs and fits:
                if self._slo_admission and self.running and not self._keeps_slos(seq):
                    i += 1  # it would put someone off their SLO now; a looser request may still fit
                    continue
                del self.waiting[i]
                self.running.append(seq)
                reserved += need
            elif self.policy == "priority" and self.running and self._victim().tpot_slo_s > seq.tpot_slo_s:
                self._preempt(self._victim())  # re-sorted behind the more urgent head
            else:
                return

    def _keeps_slos(self, seq: Sequence) -> bool:
        """Whether, with `seq` running too, every running request that can still make its SLO (at the
        time per token of a lone request) is on track for it, and `seq` itself can make its SLO (see
        SchedulerConfig.slo_admission). One that fell behind blocks admissions until it has caught up:
        letting others in because it is behind anyway would make it, and those after it, miss."""
        now, n = time.monotonic(), len(self.running)
        best, after = self._tpot_at(1), self._tpot_at(n + 1) * self.config.scheduler.admission_headroom
        if not self._on_track(seq, now, after):
            return False
        return all(self._on_track(s, now, after) or not self._on_track(s, now, best) for s in self.running)

    def _on_track(self, seq: Sequence, now: float, tpot: float) -> bool:
        """Whether `seq` ends within its SLO if each of its remaining tokens takes `tpot`."""
        if seq.first_token_time is None:
            return tpot <= seq.tpot_slo_s
        return self._ends_within_slo(seq, self._slack_s(seq, now, tpot), tpot)

    def _slack_s(self, seq: Sequence, now: float, t_iter: float) -> float:
        """How far a decoding `seq` is ahead of its SLO after an iteration of `t_iter` yielding one token."""
        return slo_slack_s(now - seq.first_token_time, t_iter, seq.tpot_slo_s, len(seq.output) - 1)

    def _ends_within_slo(self, seq: Sequence, slack: float, tpot: float) -> bool:
        return ends_within_slo(slack, seq.tpot_slo_s, seq.request.max_tokens - len(seq.output) - 1, tpot)

    def _tpot_at(self, n: int) -> float:
        """Predicted time per token of each of `n` decoding requests: an iteration over the tokens it
        yields per request, as measured at that load."""
        depth, width = self._depth_width(n)
        return self._predicted_iteration_s(n, depth, width) / self._at_load(n, depth)[0]

    def _prefill_chunks(self, prefill, decode, depth, width, start) -> dict[Sequence, int]:
        sched = self.config.scheduler
        cap = sched.token_budget - len(decode) if self.policy in ("sarathi", "priority") else sched.prefill_chunk
        if self._slo_admission and decode and prefill:
            cap = self._paced_prefill(decode, depth, width, start, cap)
        chunks: dict[Sequence, int] = {}
        for seq in prefill:
            n = min(seq.prefill_goal - seq.prefilled, cap)
            if n <= 0:
                break
            chunks[seq] = n
            cap -= n
        return chunks

    def _paced_prefill(self, decode, depth, width, start, cap) -> int:
        """The chunk the least slack among decoding requests that can still make their SLOs pays for."""
        verify = self._predicted_verify_tokens(len(decode), depth)
        t_iter, best = self._predicted_iteration_s(len(decode), depth, width), self._tpot_at(1)
        slacks = [(self._slack_s(s, start, t_iter), s) for s in decode]
        slacks = [x for x, s in slacks if self._ends_within_slo(s, x, best)]
        if not slacks:
            return cap

        def extra_ms(chunk: int) -> float:
            return self.cost.chunk_extra_ms(len(decode), verify, chunk) * self._cost_correction

        return paced_chunk(min(slacks) * 1e3, extra_ms, cap)

    def _predicted_iteration_s(self, n: int, depth: int, width: int) -> float:
        """t_spec: the cost model's prediction, corrected by measurements; without a profile, the EMA of
        measured decode iterations."""
        if not self.cost:
            return self.t_iter
        return self.cost.iteration_ms(n, depth, width, self._predicted_verify_tokens(n, depth)) / 1e3 * self._cost_correction

    def _at_load(self, n: int, depth: int) -> tuple[float, float]:
        """Tokens per request per iteration and tree tokens verified with `n` decoding requests: as
        measured at that load, else at the nearest measured load with as many tokens per request (the
        fewer requests, the more each gets, so extrapolating the yield upwards would be optimistic and
        admit too many), else all of B at the lifetime yield."""
        if n in self._by_load:
            return self._by_load[n]
        if not self._by_load:
            return max(self.mean_accepted(), 1.0), float(max(self.budget, n) if depth else n)
        m = min(self._by_load, key=lambda k: (abs(k - n), k))
        accepted, verified = self._by_load[m]
        return accepted, verified * n / m

    def _predicted_verify_tokens(self, n: int, depth: int) -> int:
        return round(self._at_load(n, depth)[1])

    def _prefill_input(self, seq: Sequence, n: int) -> SeqInput:
        last = seq.prefilled + n == seq.prefill_goal and not seq.output
        return SeqInput(seq.seq_id, seq.tokens[seq.prefilled : seq.prefilled + n], num_logits=1 if last else 0)

    def _depth_width(self, num_decode: int) -> tuple[int, int]:
        if self.policy == "spec":
            return self.spec_n, 1
        return adaptive_depth_width(num_decode, self.budget, self.config.speculation)

    def _ensure_capacity(self, decode, chunks, depth, width, outputs):
        """Preempt the least urgent requests until this iteration's worst-case KV needs fit; a lone
        request that still does not fit decodes without speculation, or fails if even that cannot fit.
        Returns the surviving decode list, depth and width."""
        while True:
            decode = [s for s in decode if s in self.running]
            prefill = {s: n for s, n in chunks.items() if s in self.running}
            tree = 1 + depth * width
            fits = _fits(self.target, {**{s: tree for s in decode}, **prefill})
            if fits and self.draft is not None:
                # the draft takes its chain, then d-1 levels of w beams
                beams = {s: len(self._draft_chain(s)) + depth * width for s in decode}
                fits = _fits(self.draft, {**beams, **{s: len(self._draft_chain(s)) for s in prefill}})
            if fits:
                return decode, depth, width
            if len(self.running) > 1:
                self._preempt(self._victim())
            elif depth:
                depth = width = 0
            else:
                seq = self.running.pop()
                self._release(seq)
                msg = "the KV cache cannot hold this request; raise the cache's memory_mb"
                outputs.append(self._output(seq, [], time.monotonic(), FinishReason.ERROR, error=msg))
                return [], 0, 0

    def _victim(self) -> Sequence:
        if self.policy in ("adaserve", "priority"):  # the loosest SLO waits; ties: the newest
            return max(self.running, key=lambda s: (s.tpot_slo_s, s.arrival))
        return max(self.running, key=lambda s: s.arrival)  # vLLM: the most recent arrival

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: the request keeps its output and re-prefills it when re-admitted."""
        self.running.remove(seq)
        self._release(seq)
        self.num_preemptions += 1
        seq.prefilled, seq.prefill_goal = 0, len(seq.tokens) - (1 if seq.output else 0)
        self.waiting.appendleft(seq)
        if self.policy == "priority":
            self._sort_waiting()

    def _release(self, seq: Sequence) -> None:
        self.target.free(seq.seq_id)
        if self.draft is not None:
            self.draft.free(seq.seq_id)
        seq.features, seq.features_start = None, 0

    # ---- speculation, selection, verification ---------------------------------------------------
    def _draft_chain(self, seq: Sequence) -> list[int]:
        """What the draft reads next: the tokens it lacks up to one past the target's cache (so, for a
        decoding request, up to the root). It trails a prefilling request by one chunk, since it
        reads the features the target computed for that chunk."""
        end = min(len(seq.tokens), self.target.num_committed(seq.seq_id) + 1)
        return seq.tokens[self.draft.num_committed(seq.seq_id) : end]

    def _chain_features(self, seq: Sequence, n: int) -> torch.Tensor | None:
        """The features of the draft's next `n` tokens: token i reads position i-1 (zeros for i = 0)."""
        if not self._keep_features:
            return None
        start = self.draft.num_committed(seq.seq_id)
        have = seq.features if seq.features is not None else self._no_features
        if start == 0:
            have = torch.cat([self._no_features.new_zeros(1, have.shape[1]), have])
        else:
            have = have[start - 1 - seq.features_start :]
        assert have.shape[0] >= n, "the draft cannot run ahead of the target's features"
        return have[:n]

    def _add_features(self, seq: Sequence, position: int, hidden: torch.Tensor) -> None:
        """Keep the target's features of positions position.., dropping those the draft has read."""
        if not self._keep_features:
            return
        if seq.features is None:
            seq.features, seq.features_start = hidden, position
        else:
            assert position == seq.features_start + seq.features.shape[0], "features must be contiguous"
            seq.features = torch.cat([seq.features, hidden])
        read = self.draft.num_committed(seq.seq_id) - 1 - seq.features_start  # rows no longer needed
        if read > 0:
            seq.features, seq.features_start = seq.features[read:], seq.features_start + read

    def _speculate(self, decode, chunks, depth, width) -> list[CandidateTree]:
        if self.draft is None:
            return []
        extra = []
        for s in chunks:
            if chain := self._draft_chain(s):
                extra.append(SeqInput(s.seq_id, chain, num_logits=0, features=self._chain_features(s, len(chain))))
        reqs = []
        for s in decode:
            chain = self._draft_chain(s)
            reqs.append(BeamRequest(s.seq_id, chain, self._chain_features(s, len(chain))))
        cands = beam_search(self.draft, reqs, depth, width, extra)
        for s in chunks:
            self.draft.commit_all(s.seq_id)
        for seq, cand in zip(decode, cands):  # no tree may outgrow max_tokens or the context
            room = min(seq.request.max_tokens - len(seq.output), self.max_model_len - len(seq.tokens)) - 1
            _truncate_depth(cand, max(room, 0))
        return cands

    def _select(self, decode, cands, chunks, depth, width, start) -> list[TokenTree]:
        if not cands:
            return [TokenTree.chain([s.tokens[-1]]) for s in decode]
        if self.policy == "spec":
            return [TokenTree.from_selection(c, list(range(len(c)))) for c in cands]
        t_spec = self._predicted_iteration_s(len(decode), depth, width)
        a_caps = []
        for seq in decode:
            a = required_accepted(start - seq.first_token_time, t_spec, seq.tpot_slo_s, len(seq.output) - 1)
            a_caps.append(min(a, depth + 1))
        spec = self.config.speculation
        iteration_ms = None
        if self.cost and spec.goodput_selection:
            draft_ms, prefill = self.cost.draft_ms(len(decode), depth, width), sum(chunks.values())

            def iteration_ms(tree_tokens: int) -> float:
                return draft_ms + self.cost.verify_ms(tree_tokens + prefill)

        params = SelectionParams(max(self.budget, len(decode)), spec.n_max, spec.order, iteration_ms, self._calibration())
        selections = select_tokens(cands, a_caps, params)
        self._scored = 0.98 * self._scored + sum(expected_accepted(c, nodes) - ROOT_CREDIT for c, nodes in zip(cands, selections))
        return [TokenTree.from_selection(c, nodes) for c, nodes in zip(cands, selections)]

    def _calibration(self) -> float:
        """Accepted draft tokens per unit of draft score verified: what turns the draft's path
        probabilities into acceptance probabilities (drafts are rarely calibrated). 1 until measured."""
        if self._scored < 1.0:
            return 1.0
        return min(max(self._hits / self._scored, 0.05), 2.0)

    def _verify(self, seq, tree, cand, logits, hidden, now, outputs) -> int:
        """Accept a path of `tree`, commit it in the target cache and the draft's chain in the draft
        cache, emit; returns the tokens it produced."""
        depths = tree.depths()
        result = accept(tree, lambda node: self._choose(seq, logits[node], len(seq.output) + depths[node]))
        self.target.commit(seq.seq_id, result.path)
        if self.draft is not None and cand is not None:
            self.draft.commit(seq.seq_id, list(range(cand.draft_region[0] + 1)))
        self._add_features(seq, len(seq.tokens) - 1, hidden[result.path])
        seq.verifications += 1
        seq.draft_tokens += len(tree.tokens) - 1
        seq.accepted_drafts += result.num_accepted_drafts
        self._emit(seq, result.tokens, now, outputs)
        return len(result.tokens)

    def _choose(self, seq: Sequence, logits: torch.Tensor, num_output: int) -> int:
        """The target's next token after `num_output` output tokens (min_tokens holds off stops)."""
        if num_output < seq.request.min_tokens:
            banned = list(seq.eos_ids | set(seq.request.stop_token_ids))
            if banned:
                logits = logits.clone()
                logits[banned] = float("-inf")
        return choose_token(logits, seq.request.sampling, seq.generator)

    def _finish_prefill_chunk(self, seq, n, logits, hidden, now, outputs) -> None:
        self.target.commit_all(seq.seq_id)
        self._add_features(seq, seq.prefilled, hidden)
        seq.prefilled += n
        if seq.prefilled == seq.prefill_goal and not seq.output:
            seq.first_token_time = now
            self._emit(seq, [self._choose(seq, logits[0], 0)], now, outputs)

    def _emit(self, seq: Sequence, tokens: list[int], now: float, outputs: list[RequestOutput]) -> None:
        req, reason = seq.request, None
        for tok in tokens:
            seq.output.append(tok)
            if (tok in seq.eos_ids or tok in req.stop_token_ids) and len(seq.output) > req.min_tokens:
                reason = FinishReason.STOP
            elif len(seq.output) >= req.max_tokens:
                reason = FinishReason.LENGTH
            if reason:
                break
        send = len(seq.output)
        if req.stop_strings:
            send, matched = stop_strings.scan(self.tokenizer, seq.output, req.stop_strings, seq.stop_scan, len(seq.output) > req.min_tokens)
            if matched:
                del seq.output[send:]
                reason = FinishReason.STOP
            elif reason:
                send = len(seq.output)  # finished anyway: nothing is held back
        new, seq.emitted = seq.output[seq.emitted : send], max(seq.emitted, send)
        if reason:
            self.running.remove(seq)
            self._release(seq)
        outputs.append(self._output(seq, new, now, reason))

    def _output(self, seq, new, now, reason, error=None) -> RequestOutput:
        if reason is not None:
            with self._live_lock:
                self._live_ids.discard(seq.request.request_id)
        return RequestOutput(
            request_id=seq.request.request_id,
            new_token_ids=new,
            finished=reason is not None,
            finish_reason=reason,
            error=error,
            arrival_time=seq.arrival,
            first_token_time=seq.first_token_time,
            emit_time=now,
            num_prompt_tokens=len(seq.request.prompt_ids),
            num_output_tokens=seq.emitted,
            tpot_slo_ms=seq.tpot_slo_s * 1e3,
            stats={"verifications": seq.verifications, "draft_tokens": seq.draft_tokens, "accepted_drafts": seq.accepted_drafts},
        )


def _fits(runner: ModelRunner, new_tokens: dict[Sequence, int]) -> bool:
    """Whether appending `n` tokens to each sequence fits the runner's free KV blocks."""
    need = sum(runner.blocks.extra_blocks_needed(s.seq_id, n) for s, n in new_tokens.items())
    return need <= runner.blocks.num_free_blocks


def _truncate_depth(cand: CandidateTree, max_depth: int) -> None:
    """Drop nodes deeper than `max_depth` (levels are stored in order, so this is a list cut)."""
    depth = [0]
    for p in cand.parents[1:]:
        depth.append(depth[p] + 1)
    keep = next((i for i, d in enumerate(depth) if d > max_depth), len(depth))
    del cand.tokens[keep:], cand.parents[keep:], cand.scores[keep:], cand.draft_region[keep:]
