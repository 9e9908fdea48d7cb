"""Time to first token with a shared system prompt, prefix cache on and off, in one run: the served
engine (engine.json, real weights) in-process, one request at a time, each a held-out question
after the same long system prompt (a passage of Python's documentation). Off and on alternate per
question (which goes first alternates too), so drift in machine speed falls on both alike.

    python -m benchmarks.prefix_cache --questions 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from benchmarks.one_request import served_engine
from harness.machine import cpu_model
from harness.run_dir import run_dir


def system_prompt(tokenizer, min_tokens: int) -> str:
    """Passages of the benchmark's summary family joined until the text is at least `min_tokens` long."""
    from harness.prompt_sources import python_howto_passages

    text = ""
    for passage in python_howto_passages():
        text = f"{text}\n\n{passage}".strip()
        if len(tokenizer(text)["input_ids"]) >= min_tokens:
            return text
    raise SystemExit("not enough documentation text for the system prompt")


def first_token_s(engine, request) -> float:
    """Seconds from add_request to its first output token; the request then runs to its end."""
    t0, first = time.perf_counter(), None
    engine.add_request(request)
    while engine.has_work():
        for out in engine.step():
            if first is None and out.new_token_ids:
                first = time.perf_counter() - t0
    return first


def set_caching(engine, on: bool) -> None:
    for runner in [engine.target] + ([engine.draft.runner] if engine.draft else []):
        runner.blocks.pool.caching = on


def main() -> None:
    from adaserve_backend.request import Request
    from harness.prompt_sources import python_faq_questions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--system-tokens", type=int, default=300)
    ap.add_argument("--policy", default="adaserve")
    ap.add_argument("--out", default=run_dir("prefix-cache"))
    args = ap.parse_args()
    engine = served_engine(args.policy, "bfloat16")
    tok = engine.tokenizer
    system = system_prompt(tok, args.system_tokens)
    questions = python_faq_questions()[: args.questions + 1]

    def request(i: int, q: str) -> Request:
        ids = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        return Request(f"q{i}-{time.monotonic_ns()}", list(ids), max_tokens=8)

    set_caching(engine, True)
    first_token_s(engine, request(0, questions[0]))  # warms the code paths and puts the system prompt in the cache
    times: dict[str, list[float]] = {"off": [], "on": []}
    prompt_tokens = []
    for i, q in enumerate(questions[1:], start=1):
        for mode in (("off", "on") if i % 2 else ("on", "off")):
            set_caching(engine, mode == "on")
            req = request(i, q)
            times[mode].append(first_token_s(engine, req))
        prompt_tokens.append(len(req.prompt_ids))
        print(f"question {i}/{args.questions}: {len(req.prompt_ids)} prompt tokens, "
              f"TTFT off {times['off'][-1] * 1e3:.0f} ms, "
              f"on {times['on'][-1] * 1e3:.0f} ms", flush=True)
    p50 = {m: statistics.median(t) for m, t in times.items()}
    ratios = sorted(a / b for a, b in zip(times["on"], times["off"]))
    report = {"policy": args.policy, "system_prompt_tokens": len(tok(system)["input_ids"]),
              "prompt_tokens_median": statistics.median(prompt_tokens), "block_size": engine.target.blocks.block_size,
              "ttft_p50_ms": {m: round(v * 1e3, 1) for m, v in p50.items()},
              "ratio_p50": round(p50["on"] / p50["off"], 3),
              "ratio_per_question_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
              "ttft_ms": {m: [round(x * 1e3, 1) for x in t] for m, t in times.items()}, "cpu": cpu_model()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prefix_cache.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot(times, os.path.join(args.out, "prefix_cache.png"))
    print(json.dumps({k: v for k, v in report.items() if k != "ttft_ms"}, indent=1))


def plot(times: dict[str, list[float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, label in (("off", "prefix cache off"), ("on", "prefix cache on")):
        ax.plot(range(1, len(times[mode]) + 1), [t * 1e3 for t in times[mode]], "o-", label=label)
    ax.set_xlabel("question (same system prompt)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
