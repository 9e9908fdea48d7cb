"""PNG plots of a sweep: SLO attainment, goodput and accepted tokens per verification against the
swept variable, one line per policy (like the paper's Figures 7-8); for a fluctuating trace, SLO
attainment over time per policy."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

X_KEYS = {"rps": "rps", "urgent_share": "urgent_share", "slo_scale": "urgent_slo_scale"}
X_LABELS = {"rps": "requests per second", "urgent_share": "share of urgent (coding) requests",
            "slo_scale": "urgent (coding) TPOT target scale"}


def plot_sweep(rows: list[dict], sweep: str, stem: str) -> None:
    if sweep == "fluctuating":
        return plot_timeline(rows, stem)
    x_key = X_KEYS[sweep]
    metrics = [("slo_attainment", "SLO attainment"), ("goodput_tok_s", "goodput (tok/s)"),
               ("mean_accepted_per_verify", "accepted tokens / verification")]
    metrics = [m for m in metrics if any(m[0] in r for r in rows)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4))
    for ax, (key, label) in zip(axes if len(metrics) > 1 else [axes], metrics):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted((r[x_key], r[key]) for r in rows if r["policy"] == policy and key in r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=policy)
        ax.set_xlabel(X_LABELS[sweep])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes_list = axes if len(metrics) > 1 else [axes]
    axes_list[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)


def plot_timeline(rows: list[dict], stem: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        line = r.get("timeline", [])
        ax.plot([w["start_s"] for w in line], [w["slo_attainment"] for w in line], "o-", label=r["policy"])
    ax.set_xlabel("arrival time (s); coding, then chat, then summary requests peak")
    ax.set_ylabel("SLO attainment of the window's arrivals")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    plt.close(fig)
