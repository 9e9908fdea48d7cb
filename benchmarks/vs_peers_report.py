"""The side-by-side result as people read it: a Markdown table and a PNG (attainment, goodput and TTFT
p99 against RPS, one line per system)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.metrics import fmt_ms  # noqa: E402

COLUMNS = ("system", "rps", "joint attainment", "TPOT-only", "goodput tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
           "errors")


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[r["system"], f"{r['rps']:g}", f"{r['slo_attainment']:.2f}", f"{r['tpot_slo_attainment']:.2f}", f"{r['goodput_tok_s']:.1f}",
             fmt_ms(r["ttft_ms_p50"]), fmt_ms(r["ttft_ms_p99"]), fmt_ms(r["tpot_ms_p50"]), fmt_ms(r["tpot_ms_p99"]), f"{r['errors']}/{r['requests']}"]
            for r in sorted(rows, key=lambda r: (r["rps"], r["system"]))]


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines)


def capacity(rows: list[dict], target: float = 0.9) -> dict[str, dict]:
    """Per system: the highest load whose joint attainment is >= target, with no lower load below it
    (capacity), and whether a measured load above it fell below (bracketed: else it may be higher)."""
    out = {}
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
    print(markdown_table(rows))
    for system, c in capacity(rows).items():
        print(f"capacity (joint >= 0.9) of {system}: {c['capacity_rps']:g} rps" + ("" if c["bracketed"] else " or more (not bracketed)"))


def plot(rows: list[dict], path: str) -> None:
    metrics = [("slo_attainment", "SLO attainment (TTFT and TPOT)"), ("goodput_tok_s", "goodput (tok/s)"),
               ("ttft_ms_p99", "TTFT p99 (s)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4))
    for ax, (key, label) in zip(axes, metrics):
        for system in dict.fromkeys(r["system"] for r in rows):
            pts = sorted((r["rps"], r[key]) for r in rows if r["system"] == system and r.get(key) is not None)
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
