"""llama.cpp's own runtime benchmark, `llama-bench` (built by `make peers`), on the same weights as ours:
prefill tokens per second over a `prompt`-token batch and decode ms per token over `gen` tokens, per
GGUF, on every core. What the runtime targets compare against, taken in the same run as ours."""

from __future__ import annotations

import json
import os
import subprocess

from harness.servers import LLAMACPP_DIR, LLAMACPP_WEIGHTS, llamacpp_gguf


def llama_bench(weights: tuple[str, ...] = LLAMACPP_WEIGHTS, prompt: int = 512, gen: int = 128,
                repeats: int = 3) -> dict | None:
    """{weights: {"prefill_tok_s", "prefill_tok_s_std", "decode_ms", "decode_ms_spread"}}, or None without
    `make peers`. decode_ms_spread: the decode time at the mean rate minus and plus one deviation."""
    binary = LLAMACPP_DIR / "bin" / "llama-bench"
    files = {w: f for w in weights if (f := llamacpp_gguf(w)).exists()}
    if not binary.exists() or not files:
        print(f"skipping llama-bench: no build at {LLAMACPP_DIR} (run `make peers`)")
        return None
    if missing := sorted(set(weights) - set(files)):
        print(f"llama-bench skips {', '.join(missing)}: no GGUF for them (run `make peers`)")
    argv = [str(binary), "-t", str(os.cpu_count() or 2), "-p", str(prompt), "-n", str(gen), "-r",
            str(repeats), "-o", "json"]
    out = {}
    for w, f in files.items():  # one run per file: a build that crashes on one format leaves the others
        rows = _run(argv + ["-m", str(f)], w)
        if rows is None:
            continue
        out[w] = {}
        for r in rows:
            if r["n_prompt"]:
                out[w] |= {"prefill_tok_s": r["avg_ts"], "prefill_tok_s_std": r["stddev_ts"]}
            else:
                rate, std = r["avg_ts"], r["stddev_ts"]
                out[w] |= {"decode_ms": 1e3 / rate,
                           "decode_ms_spread": [1e3 / (rate + std), 1e3 / max(rate - std, 1e-9)]}
    return out


def _run(argv: list[str], weights: str) -> list[dict] | None:
    """llama-bench's JSON rows, or None (reported) where it failed or crashed on these weights."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode == 0:
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError:
            pass
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    print(f"llama-bench failed on {weights} ({how}{': ' + tail if tail else ''}); going on without it")
    return None
