"""Predicted Outputs: edit-style requests (networkx functions, "add type hints, reply with the whole
function"), each sent alone with the function as its prediction and again without, greedy, through the
served engine in process. Prints tokens per verification and one-request TPOT both ways and checks the
outputs are identical (issue 89).

    python -m benchmarks.predicted_outputs [--requests 12] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from tqdm import tqdm

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.chat import encode_chat
from adaserve_backend.config import EngineConfig
from adaserve_backend.engine import Engine
from adaserve_backend.request import Request
from harness.machine import cpu_model
from harness.prompt_sources import networkx_function_sources
from harness.prompts import EDIT_TASK
from harness.run_dir import run_dir


def one(engine: Engine, rid: str, prompt: list[int], prediction: tuple[int, ...], max_tokens: int) -> dict:
    engine.add_request(Request(rid, prompt, max_tokens=max_tokens, prediction=prediction))
    start, first, tokens, last = time.monotonic(), None, [], None
    for o in engine.drain():
        if o.new_token_ids and first is None:
            first = time.monotonic()
        tokens += o.new_token_ids
        last = o
    end = time.monotonic()
    s = last.stats
    return {"tokens": tokens, "per_verification": (s.accepted_drafts + s.verifications) / max(s.verifications, 1),
            "tpot_ms": (end - first) / max(len(tokens) - 1, 1) * 1e3, "ttft_ms": (first - start) * 1e3,
            "accepted_prediction": s.accepted_prediction_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default=run_dir("predicted-outputs"))
    args = ap.parse_args()
    config = EngineConfig.from_json(str(PROJECT_ROOT / "model_repository/adaserve/1/engine.json"))
    engine = Engine.from_config(config)
    tok = engine.tokenizer
    codes = networkx_function_sources()[: args.requests]
    rows = []
    for i, code in enumerate(tqdm(codes, desc="requests, with and without a prediction")):
        prompt = encode_chat(tok, EDIT_TASK + code)
        prediction = tuple(tok(code, add_special_tokens=False)["input_ids"])
        # without first, then with, then without again: by then the suffix index holds this answer (a
        # request with a prediction takes the prediction in the index's place), the best case without one
        plain = one(engine, f"p{i}", prompt, (), args.max_tokens)
        with_prediction = one(engine, f"w{i}", prompt, prediction, args.max_tokens)
        plain_again = one(engine, f"a{i}", prompt, (), args.max_tokens)
        rows.append({"plain": plain, "prediction": with_prediction, "plain_again": plain_again})
    same = sum(r["plain"]["tokens"] == r["prediction"]["tokens"] == r["plain_again"]["tokens"] for r in rows)

    def mean(kind: str, key: str) -> float:
        return statistics.mean(r[kind][key] for r in rows)

    lines = [f"{cpu_model()}; {len(rows)} edit requests, greedy, served engine.json in process",
             f"identical outputs (plain, with prediction, plain again): {same} of {len(rows)}"]
    for kind in ("plain", "prediction", "plain_again"):
        lines.append(f"{kind:>12}: tokens/verification {mean(kind, 'per_verification'):.2f}, "
                     f"TPOT {mean(kind, 'tpot_ms'):.1f} ms, accepted from the prediction "
                     f"{mean(kind, 'accepted_prediction'):.0f}")
    print("\n".join(lines))
    run_out = {"rows": [{k: {kk: vv for kk, vv in v.items() if kk != "tokens"} for k, v in r.items()} for r in rows],
               "identical": same, "cpu": cpu_model()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "predicted-outputs.json"), "w") as f:
        json.dump(run_out, f, indent=2)
    sys.exit(0 if same == len(rows) else 1)


if __name__ == "__main__":
    main()
