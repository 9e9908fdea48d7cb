"""The soak's report: PASS/FAIL per target on the terminal, everything in soak.json, and soak.png with
server memory and TTFT over the run (the windows shaded)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .soak_judge import MEMORY_GROWTH_LIMIT, Verdict, hostile_misses, ttft_ms
from .soak_records import FAILED, ServerSample, SoakRecord


def print_verdicts(verdicts: Sequence[Verdict], counts: dict[str, dict[str, int]]) -> None:
    print("\nrequests by client behaviour and outcome:")
    for kind, outcomes in sorted(counts.items()):
        print(f"  {kind:>10}: " + ", ".join(f"{o} {n}" for o, n in sorted(outcomes.items())))
    width = max(len(v.target) for v in verdicts)
    print("\ntargets (issue 71):")
    for v in verdicts:
        print(f"  {'PASS' if v.passed else 'FAIL'}  {v.target:<{width}}  {v.value}  (target {v.limit})")
    print(f"\nsoak: {'PASS' if all(v.passed for v in verdicts) else 'FAIL'}")


def print_speed(rows: Sequence[dict]) -> None:
    """soak_speed's table: what slowed, the machine or the server, per window."""
    cols = (("steal_share", "steal", ".1%"), ("target_forward_ms_per_step", "forward ms/step", ".2f"),
            ("rest_ms_per_step", "rest ms/step", ".2f"), ("measured_over_predicted", "step/predicted", ".3f"),
            ("server_cpu_ms_per_token", "server CPU ms/token", ".2f"), ("steps_per_s", "steps/s", ".1f"),
            ("suffix_tokens", "suffix index tokens", ",.0f"), ("rss_mib_median", "RSS median MiB", ",.0f"))
    print("\nspeed per window (soak_speed: a slower machine moves the forward and steal; a server slowing "
          "itself, the rest):")
    print("  " + "window".ljust(14) + "".join(f"{h:>20}" for _, h, _ in cols))
    for r in rows:
        cells = "".join(f"{'n/a' if r.get(k) is None else format(r[k], f):>20}" for k, _, f in cols)
        print(f"  {r['start_s'] / 60:5.1f}-{r['end_s'] / 60:<5.1f} min" + cells)


def problems(records: Sequence[SoakRecord], limit: int = 20) -> list[dict]:
    """The first `limit` requests that hung, failed, or (hostile) were not answered with a clear 4xx."""
    bad = [r for r in records if r.hung or r.outcome == FAILED]
    bad += [r for r in hostile_misses(records) if r not in bad]
    return [r.to_dict() for r in sorted(bad, key=lambda r: r.arrival_s)[:limit]]


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


def plot(path: Path, samples: Sequence[ServerSample], records: Sequence[SoakRecord], timeline: list[dict],
         duration_s: float, window_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, side, ttft) = plt.subplots(3, 1, figsize=(9, 9), sharex=True, height_ratios=(2, 1, 2))
    minutes = [s.t_s / 60 for s in samples]
    mem.plot(minutes, [s.triton_rss_mib for s in samples], "o-", ms=3, label="tritonserver + Python stubs")
    warm = [s.triton_rss_mib for s in samples if s.t_s >= window_s]
    if warm:  # growth is judged from here: the target's limit drawn above it
        mem.axhline(warm[0] * (1 + MEMORY_GROWTH_LIMIT), color="red", lw=0.8, ls="--",
                    label=f"+{MEMORY_GROWTH_LIMIT:.0%} over the first sample after the warm-up")
    mem.set_ylabel("resident memory (MiB)")
    mem.legend(fontsize=8, loc="lower right")
    side.plot(minutes, [s.frontend_rss_mib for s in samples], "o-", ms=3, color="tab:orange")
    side.set_ylabel("frontend RSS (MiB)", color="tab:orange")
    kv = side.twinx()
    kv.plot(minutes, [s.kv_blocks_used or 0 for s in samples], color="grey", lw=1)
    kv.set_ylabel("KV blocks in use", color="grey")
    done = [r for r in records if ttft_ms([r], 0.0, duration_s)]
    ttft.scatter([r.arrival_s / 60 for r in done], [r.ttft_s * 1e3 for r in done], s=3, alpha=0.3,
                 label="TTFT of completed requests")
    line = [w for w in timeline if w["ttft_p99_ms"] is not None]
    ttft.plot([(w["start_s"]) / 60 for w in line], [w["ttft_p99_ms"] for w in line], "r-", label="p99 per stretch")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT (ms)")
    ttft.set_xlabel("minutes since the load started")
    ttft.legend(fontsize=8)
    for ax in (mem, side, ttft):
        ax.axvspan(0, window_s / 60, color="tab:blue", alpha=0.07)
        ax.axvspan((duration_s - window_s) / 60, duration_s / 60, color="tab:orange", alpha=0.07)
        ax.grid(alpha=0.3)
    mem.set_title("soak: first window (blue, also the warm-up) and last window (orange)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
