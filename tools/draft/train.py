"""Train the embedded default's draft from the target itself, the EAGLE-3 way (Li et al., 2025, and its
public training code): one decoder layer over a fusion of the target's low, middle and high layers,
training-time test, soft targets weighted down with depth, a reduced draft vocabulary.

    python -m tools.draft.train --cache DIR [--out adaserve_backend/models/weights/...safetensors]

Stages, each cached in DIR so a cut-off run resumes (delete a file to redo its stage):
1. the target's own continuations of the training prompts (tools/draft/generate.py; run it first in
   several processes to share the work, or let this command run it);
2. at every position of those sequences, the target's top-k next-token distribution and its taps
   (teacher-<i>.pt per shard), computed by the served dtype's target;
3. an evaluation set: greedy continuations of prompts from the held-out families and the benchmark's
   families, with their teacher data (eval.pt);
4. the head's vocabulary: the tokens the target chooses most often;
5. training with training-time test; top-1 agreement on the evaluation set after every epoch;
   curves in DIR/curves.json and --plot;
6. only the draft's own tensors are saved.

`--init PATH` warm-starts from a draft this command saved (e.g. the shipped one): its head vocabulary,
taps and weights, so a longer schedule continues where a session stopped instead of starting over.
`--layers N` gives the draft N decoder layers; with `--init`, layers beyond the saved draft's start as
the identity (zero output projections), so training begins exactly where the saved draft stands.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import math
import os
import random
import time

import torch
from tqdm import tqdm

from adaserve_backend.config import ModelConfig
from adaserve_backend.models import load_model, load_tokenizer, locate, read_checkpoint
from adaserve_backend.models.feature_draft import (
    DraftLayout,
    base_draft,
    eagle3_taps,
    save_draft,
    trainable,
    trained_draft,
)
from harness.prompts import BENCHMARK_FAMILIES, family_prompts
from tools.draft.data import HELD_OUT_FAMILIES, Prompt, build_prompts, encode
from tools.draft.teacher import continuations, padded_batch, teacher_data
from tools.draft.train_args import parse
from tools.draft.ttt import SoftTargets, shifted_rows, step_loss, unrolled


def cached(path: str, make):
    if os.path.exists(path):
        return torch.load(path)
    value = make()
    torch.save(value, path + ".tmp")
    os.replace(path + ".tmp", path)
    return value


def eval_prompts(per_family: int, seed: int = 0) -> list[Prompt]:
    """Prompts of families the draft never trains on: the held-out ones and the benchmark's."""
    _, held = build_prompts(seed)
    rng = random.Random(seed)
    out = []
    for fam in HELD_OUT_FAMILIES:
        items = [p for p in held if p.family == fam]
        out += rng.sample(items, min(per_family, len(items)))
    for cat, families in BENCHMARK_FAMILIES.items():
        for fam in families:
            items = family_prompts(fam)
            out += [Prompt(cat, t, chat, f"bench:{fam}") for t, chat in rng.sample(items, min(per_family, len(items)))]
    return out


def training_batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length, each group's padded size within batch_tokens, shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches += [cur] if cur else []
    rng.shuffle(batches)
    return batches


def collate(items, soft: SoftTargets, prompt_weight: float):
    """items: (seq, prompt_len, (top_ids, top_logp, taps)). Returns ids [B, T], taps shifted so row i
    holds position i-1's, head rows and probabilities [B, T, k] of position i, weights [B, T], and the
    shortest prompt's length."""
    ids, _ = padded_batch([s for s, _, _ in items])
    b, t = ids.shape
    k, width = items[0][2][0].shape[1], items[0][2][2].shape[1]
    top_ids = torch.zeros(b, t, k, dtype=torch.int32)
    top_logp = torch.full((b, t, k), -1e4, dtype=torch.float16)
    taps = torch.zeros(b, t, width, dtype=torch.bfloat16)
    weight = torch.zeros(b, t)
    for row, (seq, plen, (tid, tlp, tap)) in enumerate(items):
        n = len(seq)
        top_ids[row, :n], top_logp[row, :n] = tid, tlp
        taps[row, 1:n] = tap[: n - 1]
        weight[row, :n] = prompt_weight
        weight[row, plen - 1 : n] = 1.0  # positions whose next token is an output token
    rows, p = soft(top_ids, top_logp)
    return ids, taps, rows, p, weight, min(plen for _, plen, _ in items)


def run_batch(draft, batch, steps: int, decay: float):
    """Depth-weighted loss and (hits, count) per step. Steps past the first start at the first row whose
    chain can reach an output position (rows before it only score prompt text)."""
    ids, taps, rows, p, weight, min_prompt = batch
    start = max(0, min_prompt - steps)
    outs = unrolled(draft, ids, taps, steps, start)
    loss, stats = 0.0, []
    for j, hidden in enumerate(outs):
        first = 0 if j == 0 else start
        lj, hits, count = step_loss(draft, hidden, *(shifted_rows(x, j, first) for x in (rows, p, weight)))
        loss = loss + decay**j * lj
        stats.append((hits.item(), count.item()))
    return loss, stats


def deepened(draft, layout: DraftLayout, layers: int, max_len: int, parts) -> tuple:
    """The draft with decoder layers appended up to `layers`, each starting as the identity (its
    attention and MLP output projections zeroed; they get gradients, so the layer learns from there)."""
    if layers < len(layout.layers):
        raise SystemExit(f"--layers {layers}: the --init draft already has {len(layout.layers)}")
    layout = dataclasses.replace(layout, layers=layout.layers + [layout.layers[-1]] * (layers - len(layout.layers)))
    grown = base_draft(layout, max_len, parts)
    missing, unexpected = grown.load_state_dict(draft.state_dict(), strict=False)
    new = tuple(f"layers.{i}." for i in range(len(draft.layers), layers))
    if unexpected or not all(k.startswith(new) for k in missing):
        raise ValueError(f"cannot grow the draft: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.no_grad():
        for layer in grown.layers[len(draft.layers):]:
            for proj in (layer.o_proj, layer.down_proj):
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
    return grown, layout


@torch.no_grad()
def agreement_by_family(draft, data, soft, steps: int, batch_tokens: int) -> dict[str, list[float]]:
    """family -> top-1 agreement per step on output positions (greedy continuations)."""
    by_family = collections.defaultdict(list)
    for i, (fam, *_rest) in enumerate(data):
        by_family[fam].append(i)
    out = {}
    for fam, idx in by_family.items():
        hits, counts = [0] * steps, [0] * steps
        for group in training_batches([len(data[i][1]) for i in idx], batch_tokens, random.Random(0)):
            items = [(data[idx[g]][1], data[idx[g]][2], data[idx[g]][3]) for g in group]
            _, stats = run_batch(draft, collate(items, soft, 0.0), steps, 1.0)
            for j, (h, c) in enumerate(stats):
                hits[j] += h
                counts[j] += c
        out[fam] = [h / max(c, 1) for h, c in zip(hits, counts)]
    return out


def main() -> None:
    args = parse(__doc__)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    os.makedirs(args.cache, exist_ok=True)
    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(stage: str) -> None:
        nonlocal clock
        timings[stage] = round(time.monotonic() - clock, 1)
        clock = time.monotonic()
        print(f"{stage}: {timings[stage]:.0f} s")

    tokenizer = load_tokenizer(locate(args.target))
    parts = read_checkpoint(args.target)
    target = load_model(ModelConfig(path=args.target, dtype=args.dtype), parts)
    taps = eagle3_taps(target.spec.num_layers)
    target.feature_layers = tuple(taps)

    # 1-2: continuations and teacher data, per shard
    shards = sorted(glob.glob(os.path.join(args.cache, "continuations-*.pt")))
    if not shards:
        raise SystemExit(f"no continuations in {args.cache}: run python -m tools.draft.generate --cache {args.cache}")
    train = []  # (family, seq, prompt_len, teacher)
    for i, path in enumerate(shards):
        if args.teacher_only and i % args.of != args.shard:
            continue
        part = torch.load(path)
        seqs = [p + o for p, o in zip(part["prompts"], part["outputs"])]
        teach = cached(path.replace("continuations-", "teacher-"),
                       lambda: teacher_data(target, seqs, args.topk, desc=f"teacher {i + 1}/{len(shards)}"))
        train += [(f, s, len(p), t) for f, s, p, t in zip(part["families"], seqs, part["prompts"], teach)]
    lap("teacher")
    if args.teacher_only:
        return

    # 3: evaluation set
    def make_eval():
        prompts = eval_prompts(args.eval_per_family, args.seed)
        ids = [encode(tokenizer, p)[-args.max_prompt_tokens :] for p in prompts]
        outs = continuations(target, ids, args.max_new_tokens, [0.0] * len(ids), {tokenizer.eos_token_id}, batch=48)
        seqs = [p + o for p, o in zip(ids, outs)]
        teach = teacher_data(target, seqs, args.topk, desc="teacher (eval)")
        return [(p.family, s, len(i), t) for p, s, i, t in zip(prompts, seqs, ids, teach)]

    evaluation = cached(os.path.join(args.cache, "eval.pt"), make_eval)
    lap("eval set")
    target = None  # frees the model before training (the closures above ran already)

    # 4: head vocabulary: the target's choices at output positions count twice (what drafts propose);
    # a warm start keeps its own (its head rows are trained for it)
    max_len = args.max_prompt_tokens + args.max_new_tokens + args.steps + 8
    if args.init:
        draft, layout = trained_draft(args.init, max_len, parts)
        if layout.target_path != args.target or layout.feature_layers != taps:
            raise SystemExit(f"--init {args.init} drafts for {layout.target_path} from taps {layout.feature_layers}, "
                             f"not {args.target} from {taps}")
        head_vocab = layout.head_vocab
        if args.layers and args.layers != len(layout.layers):
            draft, layout = deepened(draft, layout, args.layers, max_len, parts)
    else:
        counts = collections.Counter()
        for _, _, plen, (tid, _, _) in train:
            counts.update(tid[:, 0].tolist())
            counts.update(tid[plen - 1 :, 0].tolist())
        head_vocab = [t for t, _ in counts.most_common(args.vocab)]
        layout = DraftLayout(args.target, [0] * (args.layers or 1), head_vocab, taps)
        draft = base_draft(layout, max_len=max_len, parts=parts)
    choices = collections.Counter(t for _, _, plen, (tid, _, _) in train for t in tid[plen - 1 :, 0].tolist())
    covered = sum(choices[t] for t in set(head_vocab)) / max(sum(choices.values()), 1)
    print(f"head vocabulary: {len(head_vocab)} tokens cover {covered:.1%} of the target's output choices; "
          f"{len(train)} sequences, {sum(len(s) for _, s, _, _ in train)} tokens"
          + (f"; warm start from {args.init}" if args.init else ""))

    # 5: train
    params = trainable(draft)
    soft = SoftTargets(head_vocab, parts[1].vocab_size)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    per_epoch = len(training_batches([len(s) for _, s, _, _ in train], args.batch_tokens, random.Random(0)))
    total = args.epochs * per_epoch
    warm = max(1, total // 50)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda n: min(1.0, (n + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(n, total) / total)))
    curves = {"step": [], "loss": [], "train_top1": [], "eval": [], "timings": timings}
    bar = tqdm(total=total, desc="training draft (TTT)")
    done = 0
    curves["eval"].append({"step": 0,
                           "agreement": agreement_by_family(draft, evaluation, soft, args.steps, args.batch_tokens)})
    for epoch in range(args.epochs):
        for group in training_batches([len(s) for _, s, _, _ in train], args.batch_tokens, rng):
            batch = collate([(train[i][1], train[i][2], train[i][3]) for i in group], soft, args.prompt_weight)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss, stats = run_batch(draft, batch, args.steps, args.decay)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            sched.step()
            done += 1
            top1 = [h / max(c, 1) for h, c in stats]
            if done % 10 == 0:
                curves["step"].append(done)
                curves["loss"].append(loss.item())
                curves["train_top1"].append(top1)
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", top1="/".join(f"{a:.2f}" for a in top1))
        agree = agreement_by_family(draft, evaluation, soft, args.steps, args.batch_tokens)
        curves["eval"].append({"step": done, "agreement": agree})
        print(f"epoch {epoch}: " + ", ".join(f"{f} {a[0]:.2f}" for f, a in sorted(agree.items())))
        save_draft(draft, layout, args.out)  # every epoch: a cut-off run keeps its best so far
        with open(os.path.join(args.cache, "curves.json"), "w") as f:
            json.dump(curves, f)
    bar.close()
    lap("training")
    with open(os.path.join(args.cache, "curves.json"), "w") as f:
        json.dump(curves, f)
    from tools.draft.curves import plot_curves

    plot_curves(curves, args.plot)
    print(f"saved {args.out}; curves {args.plot}; stage times {timings}")


if __name__ == "__main__":
    main()
