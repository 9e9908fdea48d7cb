"""Speculation: depth-d, width-w beam search with the draft model for many requests at once.

Step 1 feeds each request's uncached chain (tokens the draft has not seen, ending in the root) and
takes the root's w most likely children. Steps 2..d feed the w nodes of the previous level as a tree
and keep, per request, the w best (parent, token) extensions by path probability. Every step is one
batched draft forward for all requests (prefill chunks of other requests may ride along in step 1).
The deepest level is never fed to the draft, so d forwards build d levels. A request under a grammar
extends each beam only with tokens its grammar allows there (constrained.py).

A feature-conditioned draft (models/feature_draft.py) also reads one feature per token: the target's hidden
states for the chain (the caller supplies them), and for tree nodes the draft's own output at the
node's parent, its prediction of the target's feature there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..grammar.state import GrammarState
from ..model_runner import ModelRunner, SeqInput
from .constrained import beam_allowed
from .token_tree import CandidateTree

FORBIDDEN_SCORE = 1e-300  # a forbidden node's path probability: > 0, so the next level's logarithm is defined


@dataclass(frozen=True)
class BeamRequest:
    seq_id: int
    chain: list[int]  # tokens the draft cache lacks, ending with the root (the request's last token)
    features: torch.Tensor | None = None  # [len(chain), hidden] for a feature-conditioned draft
    grammar: GrammarState | None = None  # its parse state at the root, read only (copies go down the beams)


@torch.inference_mode()
def beam_search(
    draft: ModelRunner, requests: Sequence[BeamRequest], depth: int, width: int, extra: Sequence[SeqInput] = ()
) -> list[CandidateTree]:
    if depth <= 0 or not requests:
        if extra:
            draft.forward(list(extra))
        return [CandidateTree.root_only(r.chain[-1]) for r in requests]
    trees = [CandidateTree([r.chain[-1]], [-1], [1.0], [len(r.chain) - 1]) for r in requests]
    for r in requests:
        assert draft.region_len(r.seq_id) == 0, "draft region must be empty before speculation"
    out = draft.forward([SeqInput(r.seq_id, r.chain, features=r.features) for r in requests] + list(extra))
    logp = torch.log_softmax(out.logits[: len(requests)], dim=-1)  # [n, V]
    hidden = [out.features_of(i)[-1:] for i in range(len(requests))]  # the root's output
    vocab_ids = draft.model.vocab_ids  # a tensor, mapped on the w rows kept: listing every id per search costs more
    states = [None if r.grammar is None else {0: r.grammar} for r in requests]  # per node of the beams
    beams, slots = _extend(trees, [[0] for _ in requests], logp.unsqueeze(1), width, vocab_ids, states)
    for step in range(1, depth):
        inputs = []
        for i, (r, tree, level) in enumerate(zip(requests, trees, beams)):
            parents = [tree.draft_region[tree.parents[j]] for j in level]
            base = draft.region_len(r.seq_id)
            for k, j in enumerate(level):
                tree.draft_region[j] = base + k
            feats = hidden[i][slots[i]] if draft.model.takes_features else None
            inputs.append(SeqInput(r.seq_id, [tree.tokens[j] for j in level], parents, len(level), feats))
        out = draft.forward(inputs)
        logp = [torch.log_softmax(out.of(i), dim=-1) for i in range(len(requests))]
        hidden = [out.features_of(i) for i in range(len(requests))]
        beams, slots = _extend(trees, beams, logp, width, vocab_ids, states)
    return trees


def _extend(trees: list[CandidateTree], beams: list[list[int]], logps, width: int, vocab_ids, states):
    """Add, per tree, the `width` best children of its current beam nodes. Returns the new beams and,
    per tree, the position in the old beam of each new node's parent. `vocab_ids` (a tensor, or None)
    maps a draft head row to its token id (a head over part of the vocabulary). `states`: per tree, None
    or the grammar's state at each beam node; a forbidden token is never a child."""
    new_beams, new_slots = [], []
    for tree, beam, logp, state in zip(trees, beams, logps, states):
        if state is not None:
            logp = logp.masked_fill(~beam_allowed(state, beam, logp.shape[-1], vocab_ids).to(logp.device),
                                    float("-inf"))
        parent_log = torch.tensor([math.log(tree.scores[j]) for j in beam], dtype=logp.dtype, device=logp.device)
        total = (logp + parent_log[:, None]).reshape(-1)  # [len(beam) * V]
        top = torch.topk(total, min(width, total.numel()))
        vocab = logp.shape[-1]
        rows = top.indices % vocab
        ids = (rows if vocab_ids is None else vocab_ids[rows]).tolist()
        level, slots = [], []
        entries = list(zip(top.values.tolist(), top.indices.tolist(), ids))
        if state is not None:  # fewer allowed tokens than the width: the forbidden are left out, but a level
            # is never empty (the next step feeds it); a forbidden node is pruned before selection
            entries = [e for e in entries if e[0] > -math.inf] or entries[:1]
        for score, flat, token in entries:
            if state is not None:
                parent_state = state[beam[flat // vocab]]
                ok = score > -math.inf and parent_state is not None
                state[len(tree.tokens)] = parent_state.child(token) if ok else None
            tree.tokens.append(token)
            tree.parents.append(beam[flat // vocab])
            tree.scores.append(max(math.exp(score), FORBIDDEN_SCORE))
            tree.draft_region.append(-1)
            tree.origin.append(None)
            level.append(len(tree.tokens) - 1)
            slots.append(flat // vocab)
        new_beams.append(level)
        new_slots.append(slots)
    return new_beams, new_slots

