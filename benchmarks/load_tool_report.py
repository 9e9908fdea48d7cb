"""The load-tool result as people read it: `vllm bench serve`'s figures for both servers, the runner
agreement, as Markdown tables and one PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.metrics import fmt_ms  # noqa: E402

BENCH_COLUMNS = (("request_throughput", "req/s", "{:.2f}"), ("output_throughput", "output tok/s", "{:.1f}"),
                 ("request_goodput", "goodput req/s", "{:.2f}"), ("median_ttft_ms", "TTFT p50", "ms"),
                 ("p99_ttft_ms", "TTFT p99", "ms"), ("median_tpot_ms", "TPOT p50", "ms"),
                 ("p99_tpot_ms", "TPOT p99", "ms"),
                 ("median_itl_ms", "ITL p50", "ms"), ("completed", "completed", "{}"), ("failed", "failed", "{}"))
AGREEMENT_COLUMNS = (("slo_attainment", "joint attainment", "{:.2f}"), ("tpot_slo_attainment", "TPOT-only", "{:.2f}"),
                     ("goodput_tok_s", "goodput tok/s", "{:.1f}"), ("ttft_ms_p50", "TTFT p50", "ms"),
                     ("ttft_ms_p99", "TTFT p99", "ms"), ("tpot_ms_p50", "TPOT p50", "ms"),
                     ("tpot_ms_p99", "TPOT p99", "ms"),
                     ("errors", "errors", "{}"))


def _cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt_ms(value) if fmt == "ms" else fmt.format(value)


def markdown(rows: dict[str, dict], columns, first: str) -> str:
    lines = ["| " + " | ".join([first, *(c[1] for c in columns)]) + " |", "|" + "---|" * (len(columns) + 1)]
    lines += ["| " + " | ".join([name, *(_cell(row.get(key), fmt) for key, _, fmt in columns)]) + " |"
              for name, row in rows.items()]
    return "\n".join(lines)


def print_tables(report: dict) -> None:
    print("`vllm bench serve`, same settings against both servers:\n"
          + markdown(report["bench_serve"], BENCH_COLUMNS, "server"))
    print("\nour server, the benchmark's workload through each runner:\n"
          + markdown(report["agreement"], AGREEMENT_COLUMNS, "runner"))


def plot(report: dict, path: str) -> None:
    bench, agree = report["bench_serve"], report["agreement"]
    panels = [(bench, [("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"),
                       ("p99_tpot_ms", "TPOT p99")], "vllm bench serve (ms)"),
              (agree, [("ttft_ms_p50", "TTFT p50"), ("ttft_ms_p99", "TTFT p99"), ("tpot_ms_p50", "TPOT p50"),
                       ("tpot_ms_p99", "TPOT p99")], "our server: OpenAI vs Triton runner (ms)")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for ax, (rows, metrics, title) in zip(axes, panels):
        width = 0.8 / max(1, len(rows))
        for i, (name, row) in enumerate(rows.items()):
            xs = [j + i * width for j in range(len(metrics))]
            ax.bar(xs, [row.get(k) or 0 for k, _ in metrics], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))], [label for _, label in metrics])
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
