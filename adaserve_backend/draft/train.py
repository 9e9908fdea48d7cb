"""Distil the draft for the embedded default from the target itself (self-distillation).

    python -m adaserve_backend.draft.train [--out adaserve_backend/draft/weights/...safetensors]

1. prompts: code, instructions, summarisation inputs (draft/data.py; held-out prompts excluded);
2. the target's own continuations of them (greedy, some sampled), with continuous batching;
3. the target's top-k next-token distribution at every position (float32 target: the one we serve);
4. the head's vocabulary: the most frequent tokens the target produces;
5. LoRA training of the draft layers and head, minimising cross-entropy to the target distribution
   (KL up to a constant), output positions weighted above prompt positions;
6. save only the draft's own tensors, and print top-1 agreement on held-out prompts.
Runs on this CPU in well under an hour; on a GPU pass --device cuda.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import random
import time

import torch
from tqdm import tqdm

from ..config import EMBEDDED_DEFAULT, ModelConfig
from ..models.loader import load_model, load_tokenizer, locate, read_checkpoint
from .data import build_prompts, encode
from .model import SHIPPED, DraftLayout, add_lora, base_draft, save_draft
from .teacher import continuations, dense_logits, padded_batch, teacher_topk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=EMBEDDED_DEFAULT)
    ap.add_argument("--out", default=SHIPPED)
    ap.add_argument("--layers", default="0,1,2,3,28,29", help="target layers the draft starts from")
    ap.add_argument("--vocab", type=int, default=8192, help="tokens the draft head covers")
    ap.add_argument("--rank", type=int, default=96)
    ap.add_argument("--max-prompts", type=int, default=800)
    ap.add_argument("--max-prompt-tokens", type=int, default=320)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--prompt-weight", type=float, default=0.3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", help="save (or reuse) the target's continuations and distributions here")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.monotonic()

    loc = locate(args.target)
    tokenizer = load_tokenizer(loc)
    parts = read_checkpoint(args.target)
    target = load_model(ModelConfig(path=args.target, device=args.device), parts)
    train_prompts, held_out = build_prompts(seed=args.seed)
    train_prompts = train_prompts[: args.max_prompts]
    prompt_ids = [encode(tokenizer, p)[-args.max_prompt_tokens :] for p in train_prompts]

    if args.cache and os.path.exists(args.cache):  # steps 2-3 are deterministic: reuse them
        prompt_ids, seqs, teacher = torch.load(args.cache)
        print(f"reusing target continuations and distributions from {args.cache}")
    else:
        # 2. the target's own outputs; bfloat16 for speed (the teacher distributions below are float32)
        fast = copy.deepcopy(target).place(args.device, torch.bfloat16 if args.device == "cpu" else torch.float16)
        temps = [0.0 if rng.random() < 0.7 else 0.7 for _ in prompt_ids]
        outputs = continuations(fast, prompt_ids, args.max_new_tokens, temps, {tokenizer.eos_token_id})
        del fast
        seqs = [p + o for p, o in zip(prompt_ids, outputs)]
        # 3. teacher distributions
        teacher = teacher_topk(target, seqs, args.topk, args.batch_tokens)
        if args.cache:
            os.makedirs(os.path.dirname(args.cache) or ".", exist_ok=True)
            torch.save((prompt_ids, seqs, teacher), args.cache)

    # 4. head vocabulary
    counts = collections.Counter()
    for (ids, _), p in zip(teacher, prompt_ids):
        counts.update(ids[:, 0].tolist())  # the target's argmax at every position
        counts.update(ids[len(p) - 1 :, 0].tolist())  # outputs count twice: that is what drafts propose
    head_vocab = [t for t, _ in counts.most_common(args.vocab)]
    covered = sum(c for t, c in counts.items() if t in set(head_vocab)) / sum(counts.values())
    print(f"head vocabulary: {len(head_vocab)} tokens cover {covered:.1%} of the target's choices")
    del target

    # 5. train
    layout = DraftLayout(args.target, [int(x) for x in args.layers.split(",")], head_vocab, args.rank)
    draft = base_draft(layout, max_len=args.max_prompt_tokens + args.max_new_tokens + 8, parts=parts).to(args.device)
    params = add_lora(draft, args.rank)
    draft.to(args.device)
    index = torch.full((parts[1].vocab_size,), -1, dtype=torch.long)
    index[torch.tensor(head_vocab)] = torch.arange(len(head_vocab))
    batches = length_batches(seqs, args.batch_tokens)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps = args.epochs * len(batches)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.05)
    bar = tqdm(total=steps, desc="training draft")
    for epoch in range(args.epochs):
        rng.shuffle(batches)
        for batch in batches:
            loss = distill_loss(draft, [seqs[i] for i in batch], [teacher[i] for i in batch],
                                [len(prompt_ids[i]) for i in batch], index, args.prompt_weight, args.device)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
    bar.close()

    # 6. save
    save_draft(draft, layout, args.out)
    print(f"saved {args.out} after {(time.monotonic() - started) / 60:.1f} min")


def length_batches(seqs: list[list[int]], batch_tokens: int) -> list[list[int]]:
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(seqs[i]) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    return batches + ([cur] if cur else [])


def distill_loss(draft, seqs, teacher, prompt_lens, index, prompt_weight, device) -> torch.Tensor:
    """Cross-entropy of the draft's head distribution to the target's top-k distribution (restricted
    to the head's vocabulary and renormalised), per position, weighted, averaged."""
    ids, mask = padded_batch(seqs)
    logq = torch.log_softmax(dense_logits(draft, ids.to(device)).float(), dim=-1)  # [B, T, V']
    b, t, _ = logq.shape
    k = teacher[0][0].shape[1]
    t_ids = torch.zeros(b, t, k, dtype=torch.long)
    t_logp = torch.full((b, t, k), float("-inf"))
    weight = torch.zeros(b, t)
    for row, ((tid, tlp), plen) in enumerate(zip(teacher, prompt_lens)):
        n = tid.shape[0]
        t_ids[row, :n] = tid.long()
        t_logp[row, :n] = tlp.float()
        weight[row, :n] = prompt_weight
        weight[row, plen - 1 : n] = 1.0
    sub = index[t_ids]  # teacher tokens as head rows; -1 outside the head
    p = torch.softmax(t_logp.masked_fill(sub < 0, float("-inf")), dim=-1).nan_to_num(0.0)
    q = logq.gather(-1, sub.clamp(min=0).to(device))
    per_pos = -(p.to(device) * q).sum(-1)
    weight = (weight * mask).to(device)
    return (per_pos * weight).sum() / weight.sum()


if __name__ == "__main__":
    main()
