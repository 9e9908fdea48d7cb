"""The target's side of an iteration: its inputs for a plan (a token tree per decoding request, the
prefill chunks riding along) and, from its outputs, what each request accepted, committed in the
target cache (and the draft's), as an `IterationResult` for `Scheduler.update`.

Past the batched forward, work is per request: an exception here ends that request only.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from ..grammar.state import GrammarState, allows_token, masked
from ..model_runner import ForwardOutput, ModelRunner, SeqInput
from ..request import INTERNAL_ERROR, SamplingParams
from ..sampling import adjusted, choose_token, token_logprobs
from ..scheduler.plan import IterationPlan, IterationResult, Prefilled, Verified
from ..sequence import Sequence
from .acceptance import accept
from .draft_worker import DraftWorker
from .prediction import is_predicted
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
        rows = n if scores_prompt(s) else int(ends_prompt(s, n))
        inputs.append(SeqInput(s.seq_id, s.tokens[s.prefilled : s.prefilled + n], num_logits=rows))
    return inputs


def scores_prompt(seq: Sequence) -> bool:
    """Whether its prompt's own tokens get logprobs (Request.prompt_logprobs): every row of its first
    prefill, not of a re-prefill after a preemption."""
    return seq.request.prompt_logprobs is not None and not seq.output


def prompt_logprobs_of(seq: Sequence, rows: torch.Tensor, n: int):
    """The logprobs of the prompt tokens that rows of this n-token chunk predict (row i: the token after)."""
    start, prompt = seq.prefilled, seq.request.prompt_ids
    ahead = [prompt[p + 1] for p in range(start, start + n) if p + 1 < len(prompt)]
    # the model's own distribution (temperature 1, no filters), as evaluation harnesses score a prompt
    return token_logprobs(rows[:len(ahead)], ahead, SamplingParams(), seq.request.prompt_logprobs)


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
            first, first_logprob, scored = None, None, None
            rows = out.of(j)
            if scores_prompt(seq):
                scored = prompt_logprobs_of(seq, rows, n)
            if ends_prompt(seq, n):
                params = seq.request.sampling
                last = adjusted(sampling_rows(seq, rows)[-1], params, Counter())[None]
                top = None if params.adjusts else tops[out.offsets[j + 1] - 1]
                if seq.grammar is not None:  # the first token is a one-node walk under the grammar
                    last = GrammarRows(seq.grammar, last, [top])
                    first = grammar_choice(seq, last, 0, 0)
                else:
                    first = choose(seq, last[0], 0, top)
                first_logprob = logprobs_of(seq, last[[0]], [first]) if seq.request.logprobs is not None else None
                first_logprob = first_logprob[0] if first_logprob else None
            result.prefilled.append(Prefilled(seq, n, first, first_logprob, scored))
        except Exception as e:
            result.failed.append((seq, _failure(seq, e)))
    return result


def _accept(seq, tree: TokenTree, cand: CandidateTree | None, logits, tops: list[int], features,
            target: ModelRunner, draft) -> Verified:
    depths = tree.depths()
    if seq.request.sampling.adjusts:  # penalties count each node's own path: rows per node, as visited
        logits, tops = PathRows(seq, tree, logits), [None] * len(tree.tokens)
    if seq.grammar is not None:  # masked by the grammar's state at each node the walk reaches
        logits = GrammarRows(seq.grammar, logits, tops)

    def target_token_at(node: int) -> int:
        if seq.grammar is None:
            return choose(seq, logits[node], len(seq.output) + depths[node], tops[node])
        return grammar_choice(seq, logits, node, len(seq.output) + depths[node])

    acc = accept(tree, target_token_at)
    target.commit(seq.seq_id, acc.path)
    if draft is not None:
        if cand is not None:
            draft.commit(seq, cand)
            draft.learn(cand, tree, acc.path)
        # the accepted path's features, for the tokens the draft reads next iteration
        draft.add_features(seq, len(seq.tokens) - 1, features[acc.path])
    predicted = (sum(is_predicted(cand.origin[tree.source[n]]) for n in acc.path[1:])
                 if cand is not None and seq.request.prediction else 0)
    # the path's rows only where the request asked: a grammar's or a penalty's rows are computed per node
    logprobs = logprobs_of(seq, logits[acc.path], acc.tokens) if seq.request.logprobs is not None else None
    return Verified(seq, acc.tokens, len(tree.tokens) - 1, acc.num_accepted_drafts, max(depths), logprobs, predicted)


class PathRows:
    """A tree's logits rows adjusted per node (sampling.adjusted): penalties count the output so far and
    the tokens on the node's own path, exactly what plain decoding would have counted there."""

    def __init__(self, seq: Sequence, tree: TokenTree, logits: torch.Tensor) -> None:
        self.seq, self.tree, self.logits, self.rows = seq, tree, logits, {}

    def __getitem__(self, node):
        if isinstance(node, list):  # the accepted path's rows, for their logprobs
            return torch.stack([self[n] for n in node])
        if node not in self.rows:
            counts, n = Counter(self.seq.output), node
            while n > 0:  # the root is the last token already counted
                counts[self.tree.tokens[n]] += 1
                n = self.tree.parents[n]
            self.rows[node] = adjusted(self.logits[node], self.seq.request.sampling, counts)
        return self.rows[node]


def grammar_choice(seq: Sequence, rows: GrammarRows, node: int, num_output: int) -> int:
    """The target's token at a node the walk reached, under the grammar, fed to its state (the walk goes on
    below it). A greedy request takes its allowed argmax with no row masked (no min_tokens with a grammar)."""
    top = rows.top(node)
    token = choose(seq, None if top is not None and seq.request.sampling.greedy else rows[node], num_output, top)
    if not seq.grammar.done:  # past its end the request has ended
        seq.grammar.accept(token)
    return token


class GrammarRows:
    """A tree's rows masked by the grammar where verification reads them: the walk visits an accepted
    path in order, and the state has consumed that path's tokens when it reaches each node, so each row
    is masked exactly as plain constrained decoding would mask it (kept for the path's logprobs). A
    greedy choice whose row's argmax the grammar allows takes it, with no row masked at all."""

    def __init__(self, state: GrammarState, logits, tops: list[int | None]) -> None:
        self.state, self.logits, self.tops, self.masks, self.rows = state, logits, tops, {}, {}

    def _mask(self, node: int):
        """The node's mask, read when the walk reaches it (None past the grammar's end: nothing is kept)."""
        if node not in self.masks:
            self.masks[node] = None if self.state.done else self.state.bitmask()
        return self.masks[node]

    def top(self, node: int) -> int | None:
        """The row's argmax where the grammar allows it there, else None."""
        mask, top = self._mask(node), self.tops[node]
        return top if top is not None and (mask is None or allows_token(mask, top)) else None

    def __getitem__(self, node):
        if isinstance(node, list):
            return torch.stack([self[n] for n in node])
        if node not in self.rows:
            mask, row = self._mask(node), self.logits[node]
            self.rows[node] = row if mask is None else masked(row, mask)
        return self.rows[node]


def logprobs_of(seq: Sequence, rows: torch.Tensor, tokens: list[int]):
    """The tokens' logprobs from the rows they were chosen at (token i at row i), where the request asked
    for them: the accepted path's nodes, so a token verified in a tree reports the logprob plain decoding
    gives it. Only the requests that ask pay for the softmax."""
    n = seq.request.logprobs
    return None if n is None else token_logprobs(rows, tokens, seq.request.sampling, n)


def _failure(seq: Sequence, error: Exception) -> str:
    log.exception("request %s failed", seq.request.request_id, exc_info=error)
    return INTERNAL_ERROR
