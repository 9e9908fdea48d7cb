"""Does speculation ever make a lone request slower? One request at a time, greedy, held-out prompts,
in one run: `continuous`; `adaserve` with the shipped draft, with prompt lookup's copies as served,
with its first version's (matches of up to 3 tokens) and without (speculation/lookup.py); the same with a deliberately
useless draft (the shipped draft's shapes, random weights); each `adaserve` row with the estimator's trimming of
unpaying speculation on (the served behaviour) and off (the paper's depth from load alone).

    python -m benchmarks.speculation_pays                  # runs/<date>-speculation-pays/

With --head-rows N [N ...], `adaserve` also runs with the draft's head cut to N rows (ModelConfig.head_rows;
the plain `adaserve` rows keep engine.json's). Writes OUT.json (TPOT per row, its ratio to `continuous`, tokens per
verification, the share of iterations that speculated) and OUT.png. With --rounds R every row is measured R times, the
rows interleaved round by round (every other round in reverse order), and reported by its median: a shared
machine's speed drifts over the minutes a round takes, enough to move a row's ratio by more than the
effect measured when the rows run one after the other (evidence: docs/experiments.md#spec-pays-trim).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass

import torch
from tqdm import tqdm

from adaserve_backend.config import EngineConfig
from adaserve_backend.models.linear import prepack_all
from benchmarks.one_request import ENGINE_JSON, engine_tpot_ms, held_out_prompts, served_engine
from harness.run_dir import run_dir


@dataclass(frozen=True)
class Variant:
    """One row: the engine's policy and what is changed in it."""

    name: str
    policy: str = "adaserve"
    useless: bool = False  # the draft's shapes with random weights
    trims: bool = True  # the estimator trims speculation that does not pay
    head_rows: int | None = None  # the draft's head rows; None: engine.json's
    per_depth: bool = True  # each speculative depth priced by its own correction (False: one for all)
    speculation: tuple[tuple[str, object], ...] = ()  # SpeculationConfig fields changed from engine.json's


NO_LOOKUP = (("lookup_ngram", 0),)
FIRST_LOOKUP = (("lookup_ngram", 3),)  # prompt lookup's first version: matches of up to 3 tokens


def randomize_draft(engine, seed: int = 0) -> None:
    """Random weights of the same shapes: a draft whose guesses are as good as chance."""
    model = engine.draft.runner.model
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    prepack_all(model)  # the packed copies would otherwise still hold the trained weights' speed path


def served_head_rows() -> int | None:
    """engine.json's draft head rows (None: the whole head), what the plain `adaserve` rows run."""
    draft = EngineConfig.from_json(str(ENGINE_JSON)).draft
    return draft and draft.head_rows


def row(name: str, engine, prompts, tokens: int) -> dict:
    tpot = engine_tpot_ms(engine, prompts, tokens)
    stats = list(engine.iteration_stats)
    speculated = sum(s.depth > 0 for s in stats)
    return {"name": name, "tpot_ms": tpot, "accepted_per_verify": engine.mean_accepted(),
            "speculating_share": speculated / max(len(stats), 1)}


def median_row(measured: list[dict]) -> dict:
    """A row's rounds: TPOT and the rest by their median, each round's TPOT kept."""
    out = {k: statistics.median(m[k] for m in measured)
           for k in ("tpot_ms", "accepted_per_verify", "speculating_share")}
    return {"name": measured[0]["name"], **out, "tpot_ms_rounds": [m["tpot_ms"] for m in measured]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each row reports its median")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=os.path.join(run_dir("speculation-pays"), "speculation_pays"),
                    help="writes OUT.json and OUT.png")
    ap.add_argument("--head-rows", type=int, nargs="*", default=[],
                    help="also `adaserve` with the draft's head over these many rows (engine.json's draft.head_rows "
                         "otherwise)")
    ap.add_argument("--one-correction", action="store_true",
                    help="also `adaserve` with one time correction for every speculative depth and no depth "
                         "exploration")
    args = ap.parse_args()
    prompts = held_out_prompts(args.prompts)
    variants = [Variant("continuous", "continuous"), Variant("adaserve"),
                Variant("adaserve, lookup 3-grams", speculation=FIRST_LOOKUP),
                Variant("adaserve, no prompt lookup", speculation=NO_LOOKUP),
                *([Variant("adaserve, one correction for every depth", per_depth=False)]
                  if args.one_correction else []),
                *[Variant(f"adaserve, head {n} rows", head_rows=n) for n in args.head_rows],
                Variant("adaserve, untrimmed", trims=False), Variant("adaserve, useless draft", useless=True),
                Variant("adaserve, useless draft, no prompt lookup", useless=True, speculation=NO_LOOKUP),
                Variant("adaserve, useless draft, untrimmed", useless=True, trims=False)]
    rounds: list[dict[int, dict]] = []  # per round: variant index -> its row
    with tqdm(total=args.rounds * len(variants), desc="one request at a time") as bar:
        for k in range(args.rounds):
            rounds.append({})
            # drift within a round evens out
            order = range(len(variants)) if k % 2 == 0 else reversed(range(len(variants)))
            for i in order:
                v = variants[i]
                engine = served_engine(v.policy, args.dtype, v.head_rows, **dict(v.speculation))
                if v.useless:
                    randomize_draft(engine)
                engine.estimator.size.trims = engine.estimator.size.trims and v.trims
                engine.estimator.per_depth = v.per_depth
                rounds[-1][i] = row(v.name, engine, prompts, args.tokens)
                del engine
                bar.update()
    rows = [median_row([r[i] for r in rounds]) for i in range(len(variants))]
    base = rows[0]["tpot_ms"]
    for r in rows:
        r["ratio_to_continuous"] = r["tpot_ms"] / base
        print(f"{r['name']:36s} TPOT {r['tpot_ms']:6.1f} ms  x{r['ratio_to_continuous']:.2f}  "
              f"tokens/verify {r['accepted_per_verify']:.2f}  speculating {r['speculating_share']:.0%}")
    with open(args.out + ".json", "w") as f:
        json.dump({"dtype": args.dtype, "draft_head_rows": served_head_rows(), "prompts": args.prompts,
                   "tokens": args.tokens, "rounds": args.rounds, "rows": rows}, f, indent=2)
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2 + 0.3 * len(rows)))
    names = [r["name"] for r in rows]
    bars = ax.barh(names, [r["tpot_ms"] for r in rows], color=["grey"] + ["tab:blue"] * (len(rows) - 1))
    for b, r in zip(bars, rows):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" x{r['ratio_to_continuous']:.2f}", va="center")
    ax.set_xlim(0, max(r["tpot_ms"] for r in rows) * 1.15)  # room for the ratio labels
    ax.invert_yaxis()
    ax.set_xlabel("TPOT of a lone request (ms), lower is better; x = ratio to continuous")
    ax.set_title("Speculation trimmed to what pays\n(one run, interleaved rounds, held-out prompts)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
