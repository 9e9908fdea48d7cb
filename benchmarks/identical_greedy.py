"""Identical greedy requests, alone and inside bursts: does the text ever change? (issue 91)

    python -m benchmarks.identical_greedy [--repeats 4] [--bursts 3] [--max-tokens 256]

The served engine.json in process: one greedy chat sent alone `--repeats` times one after another (from
the second on the suffix index holds its answer, so it verifies long copied chains), then inside
`--bursts` bursts of six other chats at mixed TPOT targets. Prints where each answer first differs
from the first one and the kernels chosen at startup (models/kernel_choice.py); exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.chat import encode_chat
from adaserve_backend.config import EngineConfig
from adaserve_backend.engine import Engine
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO

QUESTION = "What is machine learning?"
OTHERS = ["Write a haiku about rain.", "Explain how a CPU cache works in detail.", "List five uses of Python.",
          "Tell me a story about a dragon and a knight.", "What is the capital of France and why is it famous?",
          "Describe photosynthesis step by step.", "How do airplanes fly?", "Summarize the plot of Hamlet."]
TPOTS = (60.0, 84.0, 250.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = Engine.from_config(EngineConfig.from_json(str(PROJECT_ROOT / "model_repository/adaserve/1/engine.json")))
    count = iter(range(10**9))

    def run(batch: list[tuple[str, float]]) -> list[list[int]]:
        ids = [f"q{next(count)}" for _ in batch]
        for rid, (text, tpot) in zip(ids, batch):
            engine.add_request(Request(request_id=rid, prompt_ids=encode_chat(engine.tokenizer, text),
                                       max_tokens=args.max_tokens, slo=SLO(tpot_ms=tpot)))
        out = engine.run_until_done()
        return [out[r] for r in ids]

    answers = [("alone", run([(QUESTION, TPOTS[0])])[0]) for _ in range(args.repeats)]
    for k in range(args.bursts):
        others = [(q, TPOTS[i % 3]) for i, q in enumerate((OTHERS * 2)[k:k + 6])]
        answers.append((f"burst {k}", run(others[:3] + [(QUESTION, TPOTS[k % 3])] + others[3:])[3]))
    first = answers[0][1]
    differs = 0
    for name, tokens in answers:
        at = next((i for i, (a, b) in enumerate(zip(first, tokens)) if a != b), None)
        same = tokens == first
        differs += not same
        print(f"{name:>8}: {len(tokens)} tokens, " + ("the same" if same else f"differs from token {at}"))
    print(f"{differs} of {len(answers)} differ from the first; its text: {engine.tokenizer.decode(first)[:120]!r}")
    sys.exit(1 if differs else 0)


if __name__ == "__main__":
    main()
