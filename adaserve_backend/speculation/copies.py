"""Model-free proposals grafted onto a request's candidate tree: prompt lookup's copies from its own
context (lookup.py) and the suffix index's continuations from every request in its scope
(suffix_index.py), weighed by what verification measured of each source (copy_rates.py).

One object per engine, holding the per-request n-gram indexes and the shared suffix index; the
DraftWorker grafts with it, and the simulator's replica (sim/replica.py) runs the same one on the
requests' true tokens, so what copies yield under load is the engine's.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..config import Lookup
from ..scheduler.plan import IterationPlan
from ..sequence import Sequence
from .copy_rates import CopyRates
from .lookup import NgramIndex, graft
from .prediction import PredictionIndex, prediction_key
from .prediction import prior as prediction_prior
from .suffix_index import SuffixIndex, prior
from .token_tree import CandidateTree, TokenTree, truncate_depth

ISOLATED = "isolated"  # the suffix-index scope of a request with a cache scope: (ISOLATED, its scope)


class Copies:
    def __init__(self, lookup: Lookup = Lookup()) -> None:
        self.lookup = lookup
        self._ngrams: dict[int, NgramIndex] = {}
        self._predictions: dict[int, PredictionIndex] = {}  # requests that sent a prediction
        self.suffix = SuffixIndex(lookup.suffix_max_tokens) if lookup.suffix_tokens else None
        self.rates = CopyRates()  # what verification measured of each model-free source

    def alone(self, plan: IterationPlan, max_model_len: int) -> list[CandidateTree]:
        """An iteration that does not draft: trees of the suffix index's proposals alone (no draft
        forward), or none if no request got any (then each decodes its next token, as without
        speculation)."""
        cands = [CandidateTree.root_only(s.tokens[-1]) for s in plan.decode]
        for seq, cand in zip(plan.decode, cands):
            self.graft(seq, cand, max_model_len, drafting=False)
        return cands if any(len(c) > 1 for c in cands) else []

    def graft(self, seq: Sequence, cand: CandidateTree, max_model_len: int, drafting: bool) -> None:
        """Prompt lookup's copies from the request's own context beside the draft's beams (weighed like
        them: by measured priors, times the draft's calibration), then the suffix index's continuations
        from every request in its scope, weighed by their buckets' learnt rates (copy_rates.py)."""
        lookup = self.lookup
        # A client's prediction (Predicted Outputs) takes the suffix index's place in the tree (or prompt
        # lookup's without one), so the copies never outgrow the KV blocks reserved for them (Lookup.reserved).
        predicts = bool(seq.request.prediction) and (lookup.suffix_tokens or (lookup.tokens and drafting))
        if lookup.ngram and drafting and not (predicts and not lookup.suffix_tokens):
            index = self._ngrams.setdefault(seq.seq_id, NgramIndex(lookup.ngram))
            copied, conditional = index.propose(seq.tokens, lookup.tokens)
            if copied:
                graft(cand, copied, conditional)
        if predicts:
            self._graft_prediction(seq, cand, lookup.suffix_tokens or lookup.tokens)
        scope = self._scope(seq)
        if scope is not None:
            self.suffix.extend(seq.seq_id, scope, seq.tokens)
            if not predicts:
                p = self.suffix.propose(scope, seq.tokens, lookup.suffix_tokens,
                                        lambda k: self.rates.rate(k, prior(k)))
                graft(cand, p.tokens, p.conditional, p.parents, p.keys)
        # no tree may outgrow max_tokens or the context
        room = min(seq.request.max_tokens - len(seq.output), max_model_len - len(seq.tokens)) - 1
        truncate_depth(cand, max(room, 0))

    def _graft_prediction(self, seq: Sequence, cand: CandidateTree, k: int) -> None:
        """Up to k tokens of the client's prediction continuing the output (prediction.py), each place
        weighed by what verification measured of predictions."""
        index = self._predictions.setdefault(seq.seq_id, PredictionIndex(seq.request.prediction))
        n, copied = index.propose(seq.tokens, k)
        keys = [prediction_key(i) for i in range(len(copied))]
        graft(cand, copied, [self.rates.rate(k, prediction_prior(n, i)) for i, k in enumerate(keys)], origins=keys)

    def learn(self, cand: CandidateTree, tree: TokenTree, path: list[int]) -> None:
        """What verification accepted of the copied nodes (`path`: accepted nodes of `tree`)."""
        self.rates.observe(cand, tree, path)

    def forget(self, released: Iterable[Sequence]) -> None:
        """Drop the released requests' n-gram indexes; their last tokens join the suffix index, then
        become evictable."""
        for seq in released:
            self._ngrams.pop(seq.seq_id, None)
            self._predictions.pop(seq.seq_id, None)
            if (scope := self._scope(seq)) is not None:
                self.suffix.extend(seq.seq_id, scope, seq.tokens)
                self.suffix.finish(seq.seq_id)

    def _scope(self, seq: Sequence):
        """Which requests' tokens this one matches and feeds (None: the suffix index is not for it). A
        request with a cache scope (an isolated tenant's) matches only its own scope's, whatever
        suffix_scope says short of "off"; a tuple, so it equals no tenant's name nor the shared ""."""
        if self.suffix is None:
            return None
        if seq.request.cache_scope is not None:
            return (ISOLATED, seq.request.cache_scope)
        return "" if self.lookup.suffix_scope == "shared" else seq.request.tenant
