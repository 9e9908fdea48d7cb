"""The target's side of an iteration: its inputs for a plan (a token tree per decoding request, the
prefill chunks riding along) and, from its outputs, what each request accepted, committed in the
target cache (and the draft's), as an `IterationResult` for `Scheduler.update`.

Past the batched forward, work is per request: an exception here ends that request only.
"""

from __future__ import annotations

import logging

import torch

from ..model_runner import ForwardOutput, ModelRunner, SeqInput
from ..request import INTERNAL_ERROR
from ..sampling import choose_token
from ..scheduler.plan import IterationPlan, IterationResult, Prefilled, Verified
from ..sequence import Sequence
from .acceptance import accept
from .draft_worker import DraftWorker
from .token_tree import CandidateTree, TokenTree

log = logging.getLogger("adaserve")


def choose(seq: Sequence, logits: torch.Tensor, num_output: int, top: int | None = None) -> int:
    """The target's next token after `num_output` output tokens (min_tokens holds off stops). `top`:
    the row's argmax if already known; a greedy request takes it unless it is held off (then the
    argmax of the rest, as before: the same token, since the held-off ones can only win a tie first)."""
    banned = list(seq.eos_ids | set(seq.request.stop_token_ids)) if num_output < seq.request.min_tokens else []
    if top is not None and seq.request.sampling.greedy and top not in banned:
        return top
    if banned:
        logits = logits.clone()
        logits[banned] = float("-inf")
    return choose_token(logits, seq.request.sampling, seq.generator)


def sampling_rows(seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
    """A request's logits where its choices are made: a sampled request's generator lives on the host (its
    seed gives the same stream on any device), so its rows come there once, not once per tree node;
    greedy requests read the argmax taken on the device."""
    gen = seq.generator
    return logits if gen is None or logits.device == gen.device else logits.to(gen.device)


def ends_prompt(seq: Sequence, n: int) -> bool:
    """Whether a chunk of `n` tokens completes the prompt of a request with no output yet: only then
    does its last logit give the first output token (a preempted request re-prefills without one)."""
    return seq.prefilled + n == seq.prefill_goal and not seq.output


def target_inputs(plan: IterationPlan, trees: list[TokenTree]) -> list[SeqInput]:
    inputs = [SeqInput(s.seq_id, t.tokens, parents=t.parents, num_logits=len(t.tokens))
              for s, t in zip(plan.decode, trees)]
    for s, n in plan.prefill.items():
        inputs.append(SeqInput(s.seq_id, s.tokens[s.prefilled : s.prefilled + n], num_logits=int(ends_prompt(s, n))))
    return inputs


def verify(
    plan: IterationPlan, trees: list[TokenTree], cands: list[CandidateTree], out: ForwardOutput,
    target: ModelRunner, draft: DraftWorker | None, now: float,
) -> IterationResult:
    """Accept a path of each tree and commit it; keep each prefill chunk. The requests' own state
    (output, prefill progress) is left to `Scheduler.update`."""
    result = IterationResult(now)
    # Every row's argmax in one call: per row, argmax and the logits' clone add a fixed cost per decoding
    # request, which a large batch feels (evidence: docs/triton.md#decoupled-streaming); greedy rows take it
    # from here (see choose).
    tops = out.logits.argmax(-1).tolist() if len(out.logits) else []
    for i, (seq, tree) in enumerate(zip(plan.decode, trees)):
        try:
            top = tops[out.offsets[i] : out.offsets[i + 1]]
            result.decoded.append(_accept(seq, tree, cands[i] if cands else None, sampling_rows(seq, out.of(i)), top,
                                          out.features_of(i), target, draft))
        except Exception as e:
            result.failed.append((seq, _failure(seq, e)))
    for j, (seq, n) in enumerate(plan.prefill.items(), start=len(plan.decode)):
        try:
            target.commit_all(seq.seq_id)
            if draft is not None:
                draft.add_features(seq, seq.prefilled, out.features_of(j))
            first = (choose(seq, sampling_rows(seq, out.of(j))[0], 0, tops[out.offsets[j]]) if ends_prompt(seq, n)
                     else None)
            result.prefilled.append(Prefilled(seq, n, first))
        except Exception as e:
            result.failed.append((seq, _failure(seq, e)))
    return result


def _accept(seq, tree: TokenTree, cand: CandidateTree | None, logits, tops: list[int], features,
            target: ModelRunner, draft) -> Verified:
    depths = tree.depths()
    acc = accept(tree, lambda node: choose(seq, logits[node], len(seq.output) + depths[node], tops[node]))
    target.commit(seq.seq_id, acc.path)
    if draft is not None:
        if cand is not None:
            draft.commit(seq, cand)
            draft.learn(cand, tree, acc.path)
        # the accepted path's features, for the tokens the draft reads next iteration
        draft.add_features(seq, len(seq.tokens) - 1, features[acc.path])
    return Verified(seq, acc.tokens, len(tree.tokens) - 1, acc.num_accepted_drafts, max(depths))


def _failure(seq: Sequence, error: Exception) -> str:
    log.exception("request %s failed", seq.request.request_id, exc_info=error)
    return INTERNAL_ERROR
