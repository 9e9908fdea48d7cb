"""The draft side of speculation: what the draft reads next (its chain), the target features a
feature-conditioned draft reads with it, the beam search that proposes candidate trees, and what stays
in the draft cache after verification.

The draft cache only keeps tokens the draft saw with the target's features: accepted tokens are fed
again, as the next iteration's chain, with the features the target just computed for them (a plain
draft is fed the same way).
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import EngineConfig, Lookup
from ..model_runner import ModelRunner, SeqInput
from ..models import LlamaModel, load_model
from ..scheduler.draft_reads import draft_chain_span, draft_reads, drafts_now
from ..scheduler.plan import IterationPlan
from ..sequence import Sequence
from .beam import BeamRequest, beam_search
from .copies import Copies
from .draft_fit import check_draft_fits
from .token_tree import CandidateTree, TokenTree


class DraftWorker:
    def __init__(self, runner: ModelRunner, target: ModelRunner, lookup: Lookup = Lookup()) -> None:
        self.runner = runner
        self.target = target  # only its committed lengths are read
        self.keeps_features = runner.model.takes_features
        # An EAGLE-3 draft reads taps of the target's layers: the target returns them from now on.
        target.model.feature_layers = tuple(getattr(runner.model, "target_layers", ()))
        self._no_features = torch.zeros(0, target.model.feature_size, device=target.device)
        # seq_id -> (the target's features of positions start.., start): those the draft
        # has not read yet; the draft's token i reads the feature of position i-1.
        self._features: dict[int, tuple[torch.Tensor, int]] = {}
        self.chain_tokens = 0  # tokens the last propose() read in its first draft step (IterationStats)
        self.copies = Copies(lookup)  # prompt lookup's and the suffix index's proposals

    @classmethod
    def for_target(cls, target: ModelRunner, config: EngineConfig, draft: LlamaModel | None = None,
                   lookup: Lookup = Lookup()) -> DraftWorker:
        """The given or configured draft, checked against the target at load; none configured: the
        target drafts for itself. `lookup`: prompt lookup's copies (Policy.lookup)."""
        if draft is None:
            draft = target.model
            if config.draft is not None:
                draft = load_model(dataclasses.replace(config.draft, max_model_len=target.max_len))
        check_draft_fits(target.model, draft)
        graphs = config.draft.cuda_graph_max_batch if config.draft is not None else 0
        # the beam widths adaptive speculation may pick (1..w_max): its steps past the first replay graphs
        widths = range(2, config.speculation.w_max + 1)
        return cls(ModelRunner(draft, config.draft_cache, graphs=graphs, beam_widths=widths), target, lookup)

    def chain(self, seq: Sequence) -> list[int]:
        start, end = draft_chain_span(seq, self.target.num_committed(seq.seq_id), self.runner.num_committed(seq.seq_id))
        return seq.tokens[start:end]

    def propose(self, plan: IterationPlan, max_model_len: int) -> list[CandidateTree]:
        """Candidate trees for plan.decode (a root alone for a request that does not draft now); the
        draft reads lazily (scheduler/draft_reads.py): catching up, and prefill chunks, ride along."""
        extra, drafting, catching_up = [], {}, []
        for s, decoding in [(s, False) for s in plan.prefill] + [(s, True) for s in plan.decode]:
            chain = self.chain(s)
            # a beam search of depth d puts its deepest beams d - 1 positions past the root: a request that
            # close to the end of the context verifies its root alone (and what copies fit)
            if drafts_now(len(chain), decoding, plan.depth) and len(s.tokens) + plan.depth <= self.runner.max_len:
                drafting[s.seq_id] = BeamRequest(s.seq_id, chain, self._chain_features(s, len(chain)),
                                                  s.grammar if decoding else None)
            elif n := draft_reads(len(chain), decoding, plan.depth, bool(plan.decode)):
                extra.append(SeqInput(s.seq_id, chain[:n], num_logits=0, features=self._chain_features(s, n)))
                catching_up.append(s.seq_id)
        # all the first draft step reads: drafting chains (roots included), chains catching up, prefill chunks
        self.chain_tokens = sum(len(b.chain) for b in drafting.values()) + sum(len(x.token_ids) for x in extra)
        trees = iter(beam_search(self.runner, list(drafting.values()), plan.depth, plan.width, extra))
        for seq_id in catching_up:
            self.runner.commit_all(seq_id)
        for s in list(plan.prefill) + plan.decode:  # blocks the chains just filled (drafting ones: in commit)
            self._publish(s)
        cands = [next(trees) if s.seq_id in drafting else CandidateTree.root_only(s.tokens[-1]) for s in plan.decode]
        if plan.copies:
            for seq, cand in zip(plan.decode, cands):
                self.copies.graft(seq, cand, max_model_len, seq.seq_id in drafting)
        return cands

    def learn(self, cand: CandidateTree, tree: TokenTree, path: list[int]) -> None:
        self.copies.learn(cand, tree, path)

    def commit(self, seq: Sequence, cand: CandidateTree) -> None:
        """Keep the chain the draft read this iteration; its beams go (accepted tokens are re-read). A
        root alone (no draft) left nothing in the region: the draft may not even hold the request yet."""
        if cand.draft_region[0] >= 0:
            self.runner.commit(seq.seq_id, list(range(cand.draft_region[0] + 1)))
            self._publish(seq)

    def _publish(self, seq: Sequence) -> None:
        """Offer the draft's newly full committed blocks to its prefix cache; a feature-conditioned
        draft's block carries the target's feature of its last position (a request that reuses the
        block reads on from there), and one without it is not cached."""
        if not self.runner.blocks.prefix_caching:
            return
        size = self.runner.blocks.block_size

        def last_feature(block_index: int) -> torch.Tensor | None:
            features, start = self._features.get(seq.seq_id, (self._no_features, 0))
            row = (block_index + 1) * size - 1 - start
            return features[row : row + 1].clone() if 0 <= row < features.shape[0] else None

        self.runner.blocks.publish(seq.seq_id, seq.tokens, last_feature if self.keeps_features else None,
                                   seq.cache_root)

    def _seed_features(self, seq: Sequence) -> None:
        """A request that started on cached draft blocks reads on with the feature their last block
        carries (the target's feature of the position before its first uncached token)."""
        start = self.runner.num_committed(seq.seq_id)
        if seq.seq_id in self._features or start == 0 or start % self.runner.blocks.block_size:
            return
        feature = self.runner.blocks.cached_payload(seq.seq_id, start // self.runner.blocks.block_size - 1)
        if feature is not None:
            self._features[seq.seq_id] = (feature, start - 1)

    def add_features(self, seq: Sequence, position: int, hidden: torch.Tensor) -> None:
        """Keep the target's features of positions position.., dropping those the draft has read."""
        if not self.keeps_features:
            return
        self._seed_features(seq)
        if seq.seq_id not in self._features:
            features, start = hidden, position
        else:
            features, start = self._features[seq.seq_id]
            assert position == start + features.shape[0], "features must be contiguous"
            features = torch.cat([features, hidden])
        read = self.runner.num_committed(seq.seq_id) - 1 - start  # rows no longer needed
        if read > 0:
            features, start = features[read:], start + read
        self._features[seq.seq_id] = (features, start)

    def forget(self, released: list[Sequence]) -> None:
        """Drop the per-request state of requests whose KV blocks the scheduler freed."""
        for seq in released:
            self._features.pop(seq.seq_id, None)
        self.copies.forget(released)

    def _chain_features(self, seq: Sequence, n: int) -> torch.Tensor | None:
        """The features of the draft's next `n` tokens: token i reads position i-1 (zeros for i = 0)."""
        if not self.keeps_features:
            return None
        self._seed_features(seq)
        start = self.runner.num_committed(seq.seq_id)
        have, first = self._features.get(seq.seq_id, (self._no_features, 0))
        if start == 0:
            have = torch.cat([self._no_features.new_zeros(1, have.shape[1]), have])
        else:
            have = have[start - 1 - first :]
        assert have.shape[0] >= n, "the draft cannot run ahead of the target's features"
        return have[:n]
