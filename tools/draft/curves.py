"""The draft's training curves as a PNG: the loss and per-step top-1 agreement on training batches,
and the agreement at step 0 on every held-out family after each epoch."""

from __future__ import annotations

import os


def plot_curves(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_train, ax_eval) = plt.subplots(1, 3, figsize=(16, 4.5))
    ax_loss.plot(curves["step"], curves["loss"])
    ax_loss.set(title="training loss (TTT, depth-weighted soft CE)", xlabel="optimizer step", yscale="log")
    steps = len(curves["train_top1"][0]) if curves["train_top1"] else 0
    for j in range(steps):
        ax_train.plot(curves["step"], [a[j] for a in curves["train_top1"]], label=f"step {j}")
    ax_train.set(title="top-1 agreement, training batches", xlabel="optimizer step", ylim=(0, 1))
    ax_train.legend()
    at = [e["step"] for e in curves["eval"]]
    for fam in sorted(curves["eval"][-1]["agreement"]):
        ax_eval.plot(at, [e["agreement"][fam][0] for e in curves["eval"]], marker="o", label=fam)
    ax_eval.axhline(0.7, color="grey", linestyle=":", label="target 0.7")
    ax_eval.set(title="step-0 top-1 agreement, held-out families", xlabel="optimizer step", ylim=(0, 1))
    ax_eval.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
