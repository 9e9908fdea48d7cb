"""Runs one batched model forward over the paged KV cache.

The caller says, per sequence, which tokens to add to its uncommitted region (a chain for prefill and
decode, a tree for draft beams and verification) and how many logits it wants back; after looking at
the logits it commits the path it accepts. The runner owns the model and its KV tensors; in the engine
the scheduler owns the blocks (kv_cache/block_manager.py: it reserves them before the iteration runs),
so the runner writes into blocks it was given. The target and the draft model each get one runner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .attention import build_metadata, make_backend
from .attention.flashinfer_plan import pages_for
from .attention.metadata import AttentionMetadata, is_chain
from .config import CacheConfig
from .kv_cache import BlockManager, KVCache, KVCacheFull, bytes_per_block, chain_parents
from .models.llama import LlamaModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeqInput:
    """New tokens for one sequence.

    parents: for each new token, the index of its parent in the sequence's uncommitted region (new
      tokens are numbered after the tokens already there; -1 hangs it off the committed prefix).
      None appends the tokens as a chain after the region's last token (prefill, decode).
    num_logits: logits are returned for the last `num_logits` new tokens (0 for none).
    features: [len(token_ids), hidden], one feature per new token, for models that take them.
    """

    seq_id: int
    token_ids: Sequence[int]
    parents: Sequence[int] | None = None
    num_logits: int = 1
    features: torch.Tensor | None = None


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # float32 [sum(num_logits), vocab]
    offsets: list[int]  # start row of each input's logits, plus the total at the end
    hidden: torch.Tensor  # [sum(len(token_ids)), hidden]: every new token's final hidden state
    token_offsets: list[int]  # start row of each input's tokens in `hidden`, plus the total
    # [sum(len(token_ids)), feature_size]: what a feature draft reads (LlamaModel.run); None: hidden
    features: torch.Tensor | None = None

    def of(self, i: int) -> torch.Tensor:
        return self.logits[self.offsets[i] : self.offsets[i + 1]]

    def features_of(self, i: int) -> torch.Tensor:
        rows = self.hidden if self.features is None else self.features
        return rows[self.token_offsets[i] : self.token_offsets[i + 1]]


class ModelRunner:
    """graphs: the largest batch replayed as a CUDA graph, 0 for none; only on cuda with FlashInfer
    attention. Plain decode replays (cuda_graphs/decode.py), and with beam_widths (a draft's: the widths its
    beam search may pick) so do beam steps of w > 1 tokens per request, all logits wanted (cuda_graphs/tree.py).
    graph_capture: how graphs are captured (the CPU tests' seam)."""

    def __init__(self, model: LlamaModel, cache: CacheConfig, attention_backend: str = "auto", graphs: int = 0,
                 graph_capture: Callable | None = None, beam_widths: Sequence[int] = ()) -> None:
        spec = model.spec
        self.model = model
        self.device = model.embed_tokens.weight.device
        dtype = model.embed_tokens.weight.dtype
        per_block = bytes_per_block(spec.num_layers, spec.num_kv_heads, spec.head_dim, cache.block_size, dtype)
        num_blocks = cache.num_blocks or cache.memory_mb * 2**20 // per_block
        if num_blocks < 1:
            raise ValueError(f"kv cache memory_mb={cache.memory_mb} holds not even one block of {per_block} bytes")
        self.blocks = BlockManager(num_blocks, cache.block_size, cache.prefix_caching)
        graphs = graphs if (self.device.type == "cuda" or graph_capture is not None) else 0
        widths = sorted({w for w in beam_widths if w > 1}) if graphs > 0 else []
        # with graphs, blocks beyond those the block manager hands out: the padding rows' scratch blocks,
        # room for the widest beam step's tokens
        scratch = pages_for(max(widths, default=1), cache.block_size) if graphs > 0 else 0
        self.kv = KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, num_blocks + scratch,
                          cache.block_size, dtype, self.device)
        self.attn = make_backend(attention_backend, self.kv, spec.num_heads)
        self.graphs = self.tree_graphs = None
        if graphs > 0:
            self._capture(graphs, widths, scratch_block=num_blocks, capture=graph_capture)

    def _capture(self, max_batch: int, widths: Sequence[int], scratch_block: int, capture: Callable | None) -> None:
        from .cuda_graphs.capture import cuda_capture
        from .cuda_graphs.decode import DecodeGraphs
        from .cuda_graphs.tree import TreeGraphs

        if not self.attn.cuda_graphs:
            log.info("CUDA graphs off: attention runs %s, which cannot be captured", type(self.attn).__name__)
            return
        capture = capture or cuda_capture
        with torch.inference_mode():
            self.graphs = DecodeGraphs(self.model, self.attn, scratch_block, max_batch, self.max_len, capture)
            if widths:
                self.tree_graphs = TreeGraphs(self.model, self.attn, scratch_block, widths, max_batch, self.max_len,
                                              capture)
        log.info("CUDA graphs captured for plain decode%s, batches %s",
                 f" and beam steps of {', '.join(map(str, widths))} tokens" if widths else "",
                 ", ".join(map(str, self.graphs.buckets)))

    def _replaying(self, inputs: Sequence[SeqInput], meta: AttentionMetadata):
        """The graphs that replay this forward (its tokens appended), None for eager: plain decode (one
        token onto a chain, its logit wanted) or a beam step (q > 1 tokens each, all their logits wanted)."""
        if self.graphs is None:
            return None
        if self.graphs.fits(len(inputs)) and all(len(x.token_ids) == 1 and x.num_logits == 1
                                                 and is_chain(self.blocks.seq(x.seq_id).region_parents)
                                                 for x in inputs):
            return self.graphs
        if (self.tree_graphs is not None and all(x.num_logits == len(x.token_ids) for x in inputs)
                and self.tree_graphs.fits(meta)):
            return self.tree_graphs
        return None

    @property
    def max_len(self) -> int:
        return self.model.max_len

    def region_len(self, seq_id: int) -> int:
        return len(self.blocks.seq(seq_id).region_parents) if self.blocks.has(seq_id) else 0

    def num_committed(self, seq_id: int) -> int:
        return self.blocks.num_committed(seq_id)

    def can_forward(self, inputs: Sequence[SeqInput]) -> bool:
        need = sum(self.blocks.extra_blocks_needed(x.seq_id, len(x.token_ids)) for x in inputs)
        return need == 0 or (not self.blocks.scheduler_owned and need <= self.blocks.num_free_blocks)

    @torch.inference_mode()
    def forward(self, inputs: Sequence[SeqInput]) -> ForwardOutput:
        """Append every input's tokens to its region and run them in one forward. Raises KVCacheFull
        (with nothing appended) if the batch does not fit: check `can_forward` first."""
        if not self.can_forward(inputs):
            raise KVCacheFull("batch needs more KV blocks than "
                              + ("its scheduler reserved" if self.blocks.scheduler_owned
                                                                   else f"the {self.blocks.num_free_blocks} free"))
        if len({x.seq_id for x in inputs}) != len(inputs):
            raise ValueError("a sequence may appear only once per forward")
        all_parents = []
        for x in inputs:  # validate everything before touching any state
            n = len(x.token_ids)
            if n == 0 or not 0 <= x.num_logits <= n or (x.parents is not None and len(x.parents) != n):
                raise ValueError(f"sequence {x.seq_id}: {n} tokens, num_logits={x.num_logits}, bad parents")
            if self.model.takes_features and (x.features is None or x.features.shape[0] != n):
                raise ValueError(f"sequence {x.seq_id}: this model needs one feature per new token")
            parents = list(x.parents) if x.parents is not None else chain_parents(self.region_len(x.seq_id), n)
            self.blocks.check_parents(x.seq_id, parents)
            if self.num_committed(x.seq_id) + max(self.blocks.depths_after(x.seq_id, parents)) >= self.max_len:
                raise ValueError(f"sequence {x.seq_id} would exceed max_model_len={self.max_len}")
            all_parents.append(parents)
        ids, positions, logit_rows, offsets, token_offsets = [], [], [], [0], [0]
        row = 0
        for x, parents in zip(inputs, all_parents):
            n = len(x.token_ids)
            self.blocks.append(x.seq_id, parents)
            s = self.blocks.seq(x.seq_id)
            ids.extend(x.token_ids)
            positions.extend(s.num_committed + d for d in s.region_depths[-n:])
            logit_rows.extend(range(row + n - x.num_logits, row + n))
            offsets.append(offsets[-1] + x.num_logits)
            row += n
            token_offsets.append(row)
        meta = build_metadata(self.blocks, [(x.seq_id, len(x.token_ids)) for x in inputs], self.device)
        features = torch.cat([x.features for x in inputs]).to(self.device) if self.model.takes_features else None
        if (graphs := self._replaying(inputs, meta)) is not None:
            hidden, feats, logits = graphs.run(ids, positions, meta, features)
            return ForwardOutput(logits, offsets, hidden, token_offsets, feats)
        self.attn.plan(meta)
        hidden, feats = self.model.run(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            self.attn,
            features,
        )
        rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        return ForwardOutput(self.model.compute_logits(hidden.index_select(0, rows)), offsets,
                             hidden, token_offsets, feats)

    def commit(self, seq_id: int, keep: Sequence[int]) -> None:
        """Keep one root-to-node path of the region (region indices), release the rest."""
        self.kv.move(*self.blocks.commit(seq_id, keep))

    def commit_all(self, seq_id: int) -> None:
        self.blocks.commit_all(seq_id)

    def free(self, seq_id: int) -> None:
        self.blocks.free(seq_id)
