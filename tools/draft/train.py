"""Distil the draft for the embedded default from the target itself (self-distillation).

    python -m tools.draft.train [--out adaserve_backend/models/weights/...safetensors]

1. prompts: code, instructions, summarisation inputs (draft/data.py; held-out prompts excluded);
2. the target's own continuations of them (greedy, some sampled), with continuous batching;
3. at every position of those sequences, the target's top-k next-token distribution and its final
   hidden state (float32 target: the one we serve);
4. the head's vocabulary: the most frequent tokens the target produces;
5. training of the feature-conditioned draft (draft/model.py): cross-entropy to the target's
   distribution (KL up to a constant) plus a regression of the target's feature, output positions
   weighted above prompt positions. Each batch runs twice: with the target's features as inputs, and
   with the draft's own predicted features for a random half of the positions, which is what the draft
   reads at tree depths >= 2;
6. save only the draft's own tensors.
Steps 2-3 are deterministic and take most of the time: --cache DIR keeps them for later runs.
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
import torch.nn.functional as F
from tqdm import tqdm

from adaserve_backend.config import EMBEDDED_DEFAULT, ModelConfig
from adaserve_backend.models import load_model, load_tokenizer, locate, read_checkpoint
from tools.draft.data import build_prompts, encode
from adaserve_backend.models.feature_draft import SHIPPED, DraftLayout, base_draft, save_draft, trainable
from tools.draft.teacher import continuations, dense_head, dense_hidden, padded_batch, shifted, teacher_data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=EMBEDDED_DEFAULT)
    ap.add_argument("--out", default=SHIPPED)
    ap.add_argument("--layers", default="0", help="target layers the draft's decoder layers start from")
    ap.add_argument("--vocab", type=int, default=8192, help="tokens the draft head covers")
    ap.add_argument("--max-prompts", type=int, default=800)
    ap.add_argument("--max-prompt-tokens", type=int, default=320)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--prompt-weight", type=float, default=0.3)
    ap.add_argument("--feature-weight", type=float, default=0.5, help="weight of the feature regression")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", help="directory to save (or reuse) steps 2 and 3 in")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.monotonic()

    loc = locate(args.target)
    tokenizer = load_tokenizer(loc)
    parts = read_checkpoint(args.target)
    target = load_model(ModelConfig(path=args.target, device=args.device), parts)
    train_prompts, held_out = build_prompts(seed=args.seed)
    prompt_ids = [encode(tokenizer, p)[-args.max_prompt_tokens :] for p in train_prompts[: args.max_prompts]]

    def cached(name, make):
        path = os.path.join(args.cache, name) if args.cache else None
        if path and os.path.exists(path):
            print(f"reusing {path}")
            return torch.load(path)
        value = make()
        if path:
            os.makedirs(args.cache, exist_ok=True)
            torch.save(value, path)
        return value

    def generate():
        # bfloat16 for speed; the teacher distributions and features below are float32
        fast = copy.deepcopy(target).place(args.device, torch.bfloat16 if args.device == "cpu" else torch.float16)
        pick = random.Random(args.seed)
        temps = [0.0 if pick.random() < 0.7 else 0.7 for _ in prompt_ids]
        outputs = continuations(fast, prompt_ids, args.max_new_tokens, temps, {tokenizer.eos_token_id})
        return prompt_ids, [p + o for p, o in zip(prompt_ids, outputs)]

    prompt_ids, seqs = cached("continuations.pt", generate)
    teacher = cached("teacher.pt", lambda: teacher_data(target, seqs, args.topk, args.batch_tokens))
    del target

    # 4. head vocabulary
    counts = collections.Counter()
    for (ids, _, _), p in zip(teacher, prompt_ids):
        counts.update(ids[:, 0].tolist())  # the target's argmax at every position
        counts.update(ids[len(p) - 1 :, 0].tolist())  # outputs count twice: that is what drafts propose
    head_vocab = [t for t, _ in counts.most_common(args.vocab)]
    covered = sum(c for t, c in counts.items() if t in set(head_vocab)) / sum(counts.values())
    print(f"head vocabulary: {len(head_vocab)} tokens cover {covered:.1%} of the target's choices")

    # 5. train
    layout = DraftLayout(args.target, [int(x) for x in args.layers.split(",")], head_vocab)
    draft = base_draft(layout, max_len=args.max_prompt_tokens + args.max_new_tokens + 8, parts=parts).to(args.device)
    params = trainable(draft)
    scale = torch.cat([t[2][:64].float() for t in teacher]).std().item()  # features' spread, for the regression
    loss_fn = DistillLoss(head_vocab, parts[1].vocab_size, args.prompt_weight, args.feature_weight, scale)
    batches = length_batches(seqs, args.batch_tokens)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps = args.epochs * len(batches)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.05)
    bar = tqdm(total=steps, desc="training draft")
    for epoch in range(args.epochs):
        rng.shuffle(batches)
        for batch in batches:
            loss, agree = loss_fn(draft, [seqs[i] for i in batch], [teacher[i] for i in batch],
                                  [len(prompt_ids[i]) for i in batch], args.device)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", top1=f"{agree:.2f}")
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


class DistillLoss:
    """Per position: cross-entropy of the draft's head distribution to the target's top-k
    distribution (restricted to the head's vocabulary, renormalised) plus the feature regression;
    weighted, averaged over both passes (target features in; own predictions in for half)."""

    def __init__(self, head_vocab, vocab_size, prompt_weight, feature_weight, scale) -> None:
        self.index = torch.full((vocab_size,), -1, dtype=torch.long)
        self.index[torch.tensor(head_vocab)] = torch.arange(len(head_vocab))
        self.prompt_weight, self.feature_weight, self.scale = prompt_weight, feature_weight, scale

    def __call__(self, draft, seqs, teacher, prompt_lens, device) -> tuple[torch.Tensor, float]:
        ids, mask = padded_batch(seqs)
        b, t = ids.shape
        k = teacher[0][0].shape[1]
        t_ids = torch.zeros(b, t, k, dtype=torch.long)
        t_logp = torch.full((b, t, k), float("-inf"))
        feats = torch.zeros(b, t, teacher[0][2].shape[1])
        weight = torch.zeros(b, t)
        for row, ((tid, tlp, hid), plen) in enumerate(zip(teacher, prompt_lens)):
            n = tid.shape[0]
            t_ids[row, :n], t_logp[row, :n], feats[row, :n] = tid.long(), tlp.float(), hid.float()
            weight[row, :n] = self.prompt_weight
            weight[row, plen - 1 : n] = 1.0
        sub = self.index[t_ids]  # teacher tokens as head rows; -1 outside the head
        p = torch.softmax(t_logp.masked_fill(sub < 0, float("-inf")), dim=-1).nan_to_num(0.0).to(device)
        sub, feats, ids = sub.clamp(min=0).to(device), feats.to(device), ids.to(device)
        weight = (weight * mask).to(device)

        def pass_loss(inputs):
            hidden = dense_hidden(draft, ids, inputs)
            logq = torch.log_softmax(dense_head(draft, hidden), dim=-1)
            ce = -(p * logq.gather(-1, sub)).sum(-1)
            reg = F.smooth_l1_loss(hidden / self.scale, feats / self.scale, reduction="none").mean(-1)
            per_pos = ce + self.feature_weight * reg
            agree = ((logq.argmax(-1) == sub[..., 0]).float() * (weight == 1.0)).sum() / (weight == 1.0).sum()
            return (per_pos * weight).sum() / weight.sum(), hidden, agree.item()

        true_in = shifted(feats)
        loss1, hidden, agree = pass_loss(true_in)
        own = torch.rand(b, t, 1, device=device) < 0.5
        loss2, _, _ = pass_loss(torch.where(own, shifted(hidden.detach()), true_in))
        return (loss1 + loss2) / 2, agree


if __name__ == "__main__":
    main()
