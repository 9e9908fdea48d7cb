"""The simulator's PNGs: a sweep's four panels (joint and TPOT-only attainment, goodput, accepted tokens
per verification against the swept value, one line per policy; the paper's Figures 7-8 plot TPOT-only
attainment and goodput), and the scale-out figure (replicas needed per router and load)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

X_LABELS = {"rps": "requests per second", "urgent_share": "share of urgent (coding) requests",
            "urgent_slo_scale": "coding TPOT target / baseline TPOT", "replicas": "replicas"}
PANELS = [("slo_attainment", "joint attainment (TTFT and TPOT)"),
          ("tpot_slo_attainment", "TPOT-only attainment (paper)"),
          ("goodput_tok_s", "goodput, joint (tok/s)"), ("mean_accepted_per_verify", "tokens / verification")]


def plot_panels(rows: list[dict], x_key: str, stem: str, title: str = "") -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (key, label) in zip(axes, PANELS):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted((r[x_key], r[key]) for r in rows if r["policy"] == policy and r.get(key) is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=policy)
        ax.set_xlabel(X_LABELS.get(x_key, x_key))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=100)
    plt.close(fig)


def plot_scaleout(needed: dict[str, dict[float, int | None]], curves: list[dict], stem: str, title: str = "") -> None:
    """Left: replicas needed per load, one bar group per router (None: not reached within the search).
    Right: joint attainment against replicas for every run the search made."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    routers = list(needed)
    loads = sorted({rps for n in needed.values() for rps in n})
    width = 0.8 / max(len(routers), 1)
    for i, router in enumerate(routers):
        xs = [j + i * width for j in range(len(loads))]
        ys = [needed[router].get(rps) or 0 for rps in loads]
        bars = left.bar(xs, ys, width, label=router)
        for b, rps in zip(bars, loads):
            left.annotate("?" if needed[router].get(rps) is None else str(needed[router][rps]),
                          (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    left.set_xticks([j + width * (len(routers) - 1) / 2 for j in range(len(loads))], [f"{rps:g} rps" for rps in loads])
    left.set_ylabel("replicas for >= 90% joint attainment")
    left.legend(fontsize=7)
    for router in routers:
        for rps in loads:
            pts = sorted((r["replicas"], r["slo_attainment"]) for r in curves
                         if r["router"] == router and r["rps"] == rps)
            right.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=f"{router} {rps:g} rps")
    right.axhline(0.9, color="grey", lw=0.8, ls="--")
    right.set_xscale("log", base=2)
    right.set_xlabel("replicas")
    right.set_ylabel("joint attainment")
    right.legend(fontsize=6)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=100)
    plt.close(fig)
