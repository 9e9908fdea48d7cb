"""One request at a time, in interleaved rounds: each round sends its own fresh held-out prompts to every
system in turn (our in-process engines by policy and dtype, llama-server on the shipped Q4_1), so a
machine that drifts between minutes moves every system alike, and a prompt is never answered twice (the
suffix index would replay it). Reports each system's median TPOT, per round and overall, and the median
per-prompt ratio to llama-server Q4_1 (the issue's reference), with a plot of every prompt.

    python -m benchmarks.one_request_rounds --systems adaserve:q4_1_int8 continuous:q4_1_int8 \\
        adaserve:bfloat16 --rounds 3 --prompts 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from functools import partial
from pathlib import Path

from benchmarks.one_request import engine_tpots_ms, held_out_prompts, peer_tpots_of_texts, prompt_texts, served_engine
from harness.run_dir import run_dir

REFERENCE = "llama-server q4_1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", default=["adaserve:q4_1_int8", "continuous:q4_1_int8", "adaserve:bfloat16"],
                    help="POLICY:DTYPE engines, in process (llama-server Q4_1 always runs where `make peers` built it)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="fresh prompts per round")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(run_dir("one-request-rounds"), "one_request_rounds"))
    args = ap.parse_args()
    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate
    from harness.servers import llamacpp_server

    texts = prompt_texts(load_tokenizer(locate(EMBEDDED_DEFAULT)), held_out_prompts(args.rounds * args.prompts + 1))
    warm, texts = texts[-1], texts[:-1]
    engines = {name: served_engine(*name.split(":", 1)) for name in args.systems}
    for engine in engines.values():
        engine_tpots_ms(engine, [warm], 16)  # first uses outside the rounds
    tpots: dict[str, list[float]] = {name: [] for name in [*engines, REFERENCE]}
    logs = Path(tempfile.mkdtemp())
    for r in range(args.rounds):
        batch = texts[r * args.prompts:(r + 1) * args.prompts]
        for name, engine in engines.items():
            tpots[name] += engine_tpots_ms(engine, batch, args.tokens)
        peer = peer_tpots_of_texts(partial(llamacpp_server, log_path=logs / "llamacpp.log", weights="q4_1", slots=1),
                                   [warm] + batch, args.tokens)
        if peer is None:
            tpots.pop(REFERENCE, None)
        else:
            tpots[REFERENCE] += peer[1:]
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {statistics.median(v[-args.prompts:]):.2f} ms"
                                                          for n, v in tpots.items()), flush=True)
    report(tpots, args)


def report(tpots: dict[str, list[float]], args) -> None:
    summary = {}
    for name, values in tpots.items():
        rounds = [statistics.median(values[i:i + args.prompts]) for i in range(0, len(values), args.prompts)]
        row = {"median_ms": statistics.median(values), "round_medians_ms": rounds}
        if REFERENCE in tpots:
            row["ratio_to_reference"] = statistics.median(a / b for a, b in zip(values, tpots[REFERENCE]))
        summary[name] = row
        ratio = (f"; per-prompt ratio to {REFERENCE}: median {row['ratio_to_reference']:.2f}"
                 if REFERENCE in tpots else "")
        per_round = ", ".join(f"{x:.2f}" for x in rounds)
        print(f"{name}: TPOT median {row['median_ms']:.2f} ms, per round {per_round}{ratio}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"tpots_ms": tpots, "summary": summary, "rounds": args.rounds, "prompts": args.prompts,
                   "tokens": args.tokens}, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    names = list(tpots)
    ax.boxplot([tpots[n] for n in names], showfliers=False)
    for i, n in enumerate(names, 1):
        ax.scatter([i] * len(tpots[n]), tpots[n], s=8, alpha=0.6)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=15, fontsize=8)
    ax.set_ylabel("TPOT (ms), one request at a time")
    ax.set_title(f"{args.rounds} interleaved rounds x {args.prompts} held-out prompts, {args.tokens} tokens each")
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
