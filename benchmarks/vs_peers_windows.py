"""Windows and the bounds in the side-by-side report (benchmarks/vs_peers_report.py): per system and
level the mean over windows with their min-max spread, the prefill-only bound (one per window) and the
decode-aware one (per system and window: over its own outputs), attainment over each, each window's
burst, and the attainment panels of the plot.

A level run on K windows has K rows per system (`window` 0..K-1); every window of a level has the same
number of requests, so the mean of the windows' attainments is the level's attainment over all its
requests, and the spread says how much it moved with the stretch of traffic the level met.
"""

from __future__ import annotations

import statistics

SPREAD = ("slo_attainment", "tpot_slo_attainment", "ttft_slo_attainment", "goodput_tok_s", "bound", "over_bound",
          "bound_decode", "over_bound_decode")
MEAN = ("throughput_tok_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
        "output_tokens_mean", "stopped_at_eos")  # means of the windows' figures: a summary, not a percentile
SUM = ("errors", "requests", "finished", "violations", "rejected")


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (system, level), in first-seen order: a single row as it is, several windows' rows as
    their means (SPREAD and MEAN keys), sums (SUM keys), `spread` {key: (min, max)}, `windows` (how many)
    and `peak_5s` (a list, per window in order)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["rps"]), []).append(r)
    out = []
    for (system, rps), rs in groups.items():
        if len(rs) == 1:
            out.append({"windows": 1, **rs[0]})
            continue
        rs = sorted(rs, key=lambda r: r.get("window", 0))
        row: dict = {"system": system, "rps": rps, "windows": len(rs), "spread": {},
                     "peak_5s": [r.get("peak_5s") for r in rs]}
        for key in SPREAD + MEAN:
            values = [r[key] for r in rs if r.get(key) is not None]
            row[key] = statistics.fmean(values) if values else None
            if key in SPREAD and values:
                row["spread"][key] = (min(values), max(values))
        for key in SUM:
            if any(key in r for r in rs):
                row[key] = sum(r.get(key) or 0 for r in rs)
        out.append(row)
    return out


def with_spread(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """`mean (min-max)` over windows, or the one value; '-' where there is none."""
    value = row.get(key)
    if value is None:
        return "-"
    lo_hi = row.get("spread", {}).get(key)
    text = fmt.format(value)
    return text if not lo_hi or row.get("windows", 1) < 2 else f"{text} ({fmt.format(lo_hi[0])}-{fmt.format(lo_hi[1])})"


def has_bound(rows: list[dict]) -> bool:
    return any(r.get("bound") is not None for r in rows)


def has_decode_bound(rows: list[dict]) -> bool:
    return any(r.get("bound_decode") is not None for r in rows)


def level_windows(rows: list[dict]) -> dict[float, dict[int, dict]]:
    """Per level, per window: its burst and bound (the same for every system that ran it)."""
    out: dict[float, dict[int, dict]] = {}
    for r in rows:
        if "window" in r:
            out.setdefault(r["rps"], {}).setdefault(r["window"], {"peak_5s": r.get("peak_5s"), "bound": r.get("bound")})
    return {rps: dict(sorted(ws.items())) for rps, ws in sorted(out.items())}


def window_lines(rows: list[dict]) -> list[str]:
    """One line per level: peak arrivals in 5 s per window, and the windows' bounds."""
    lines = []
    for rps, ws in level_windows(rows).items():
        line = f"{rps:g} rps: peak arrivals in 5 s per window " + ", ".join(str(w["peak_5s"]) for w in ws.values())
        line += f" (mean {rps * 5:g})"
        if all(w["bound"] is not None for w in ws.values()):
            line += "; prefill-only bound " + ", ".join(f"{w['bound']:.2f}" for w in ws.values())
        lines.append(line)
    return lines


def plot_attainment(ax, rows: list[dict], key: str = "slo_attainment") -> None:
    """Per system, the mean over windows with min-max error bars; for attainment itself, the prefill-only
    bound (mean over windows, dashed; its spread shaded) and each system's decode-aware bound (mean over
    windows, dotted in the system's colour)."""
    agg = aggregate(rows)
    dotted = False
    for system in dict.fromkeys(r["system"] for r in agg):
        pts = sorted((r["rps"], r[key], r.get("spread", {}).get(key)) for r in agg
                     if r["system"] == system and r.get(key) is not None)
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[y - (s[0] if s else y) for _, y, s in pts], [(s[1] if s else y) - y for _, y, s in pts]]
        line = ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label=system)
        bound = sorted((r["rps"], r["bound_decode"]) for r in agg
                       if r["system"] == system and r.get("bound_decode") is not None)
        if key == "slo_attainment" and bound:
            ax.plot([x for x, _ in bound], [b for _, b in bound], ":", color=line[0].get_color(),
                    label=None if dotted else "decode-aware bound (dotted, per system)")
            dotted = True
    if key in ("over_bound", "over_bound_decode"):
        ax.axhline(1.0, color="k", ls="--", lw=0.8)  # at the bound
    levels = {rps: [w["bound"] for w in ws.values() if w["bound"] is not None]
              for rps, ws in level_windows(rows).items()}
    levels = {rps: b for rps, b in levels.items() if b}
    if key == "slo_attainment" and levels:
        xs = sorted(levels)
        ax.plot(xs, [statistics.fmean(levels[x]) for x in xs], "k--", label="prefill-only bound")
        ax.fill_between(xs, [min(levels[x]) for x in xs], [max(levels[x]) for x in xs], color="k", alpha=0.08)
