"""Issue 72's speed targets, judged per backend from the layer points' estimated 32-layer forwards: batch-1
decode within 6.5 ms, a 64-token tree within 15 % of a decode (at batch 1 and 16), a 2,048-token prefill
at 60 % of the sheet's bf16 FLOPs or more; and, from the draft points, one draft beam step within 0.25 ms
replayed as a CUDA graph at batch 1-32."""

from __future__ import annotations

from collections.abc import Sequence

from tools.gpu.measuring import BACKENDS


def targets(points: Sequence[dict]) -> dict:
    """Issue 72's speed targets, per backend, from the layer points (eager; CUDA graphs would come later)."""
    out = {}
    for name in BACKENDS:
        by = {p["name"]: p for p in points if p.get("backend") == name and "est_forward_ms" in p}
        t: dict = {}
        if "b1 decode" in by:
            d = by["b1 decode"]
            t["b1_decode_ms"] = d["est_forward_ms"]
            t["b1_decode_ok"] = d["est_forward_ms"] <= 6.5
            if "hbm_fraction" in d:
                t["b1_decode_hbm_fraction"] = d["hbm_fraction"]
        for b in ("b1", "b16"):
            if f"{b} decode" in by and f"{b} tree 64" in by:
                ratio = by[f"{b} tree 64"]["est_forward_ms"] / by[f"{b} decode"]["est_forward_ms"]
                t[f"{b}_tree64_over_decode"] = round(ratio, 3)
                t[f"{b}_tree64_ok"] = ratio <= 1.15
        if "b1 prefill 2048" in by and "flops_fraction" in by["b1 prefill 2048"]:
            t["prefill2048_flops_fraction"] = by["b1 prefill 2048"]["flops_fraction"]
            t["prefill2048_ok"] = by["b1 prefill 2048"]["flops_fraction"] >= 0.6
        if t:
            out[name] = t
    return out


DRAFT_STEP_MS = 0.25  # one draft beam step (EAGLE-style one-layer head, 8B width), CUDA graphs, batch 1-32


def draft_step_ok(graph_ms: float) -> bool:
    return graph_ms <= DRAFT_STEP_MS


def draft_targets(points: Sequence[dict]) -> dict:
    """The draft-step target per committed context, from the points replayed as graphs: how many met it,
    the slowest, and whether all did; {} when no graph was timed."""
    graphed = [p for p in points if "graph_ms" in p]
    out = {}
    for context in sorted({p["context"] for p in graphed}):
        at = [p for p in graphed if p["context"] == context]
        worst = max(at, key=lambda p: p["graph_ms"])
        out[f"context {context}"] = {"points": len(at), "met": sum(draft_step_ok(p["graph_ms"]) for p in at),
                                     "worst_ms": worst["graph_ms"], "worst_point": worst["name"],
                                     "ok": all(draft_step_ok(p["graph_ms"]) for p in at)}
    return out
