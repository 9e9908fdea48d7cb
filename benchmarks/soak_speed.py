"""Whether the machine or the server slowed during a soak. A TTFT that grows over a run on a shared
virtual machine may be the server's own doing (work per step that grows with what it has served) or
the machine's (a neighbour taking CPU time or memory bandwidth); the soak's verdict cannot tell them
apart from the client's side, so the sampler also reads, cumulatively:

- the hypervisor's steal time and all CPU time, from /proc/stat: a neighbour taking the cores;
- the target model's forward time and the rest of each decode step (adaserve_step_seconds_total), and
  the steps timed: the forward is fixed arithmetic over fixed weights, so at the same load its time
  per step moves with the machine (steal, memory bandwidth), while a server that slows itself shows in
  the rest first;
- the engine's measured / predicted step time (the startup calibration's prediction);
- tritonserver's CPU seconds and the tokens generated: the server's work per token.

Per window, these differences say which moved."""

from __future__ import annotations

from collections.abc import Sequence

from .soak_records import ServerSample

# Prometheus series the sampler reads (series -> counter name in ServerSample.counters)
SERIES = {
    'adaserve_step_seconds_total{part="target_forward"}': "target_forward_s",
    'adaserve_step_seconds_total{part="rest"}': "rest_s",
    "adaserve_steps_total": "steps",
    "adaserve_step_time_measured_over_predicted_sum": "ratio_sum",
    "adaserve_step_time_measured_over_predicted_count": "ratio_count",
    "adaserve_generation_tokens_total": "tokens",
    "adaserve_suffix_index_tokens": "suffix_tokens",  # a gauge: how full the bounded index is
}


def series_values(text: str) -> dict[str, float]:
    """The SERIES found in a Prometheus exposition text (labels as Triton prints them, without spaces)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        key = key.replace("{}", "")
        if (name := SERIES.get(key)) is not None:
            out[name] = float(value)
    return out


def machine_cpu() -> dict[str, float]:
    """Steal and total CPU time of the machine so far (jiffies, /proc/stat's first line); {} elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return {}
    return {"steal_jiffies": fields[7] if len(fields) > 7 else 0.0, "all_jiffies": sum(fields[:8])}


def _ratio(num: float | None, den: float | None, scale: float = 1.0, digits: int = 3) -> float | None:
    return None if num is None or not den else round(num / den * scale, digits)


def speed_by_window(samples: Sequence[ServerSample], duration_s: float, window_s: float) -> list[dict]:
    """Per window of the load, from the first sample at or after its start to the first at or after its
    end: steal share of the machine's CPU time, target forward and rest ms per decode step, mean
    measured / predicted step time, tritonserver's CPU ms per generated token, the suffix index's
    tokens at the end (it grows the process until full), and the median of the window's RSS samples."""
    with_counters = [s for s in samples if s.counters]
    out, start = [], 0.0
    while start < duration_s - 1e-9:
        end = min(start + window_s, duration_s)
        a = next((s for s in with_counters if s.t_s >= start), None)
        b = next((s for s in with_counters if s.t_s >= end - 1e-9), with_counters[-1] if with_counters else None)
        row = {"start_s": start, "end_s": end}
        if a is not None and b is not None and b.t_s > a.t_s:
            d = {k: b.counters[k] - a.counters[k] for k in b.counters if k in a.counters}
            row |= {
                "steal_share": _ratio(d.get("steal_jiffies"), d.get("all_jiffies"), digits=4),
                "target_forward_ms_per_step": _ratio(d.get("target_forward_s"), d.get("steps"), 1e3, 2),
                "rest_ms_per_step": _ratio(d.get("rest_s"), d.get("steps"), 1e3, 2),
                "measured_over_predicted": _ratio(d.get("ratio_sum"), d.get("ratio_count")),
                "server_cpu_ms_per_token": _ratio(d.get("triton_cpu_s"), d.get("tokens"), 1e3, 2),
                "steps_per_s": _ratio(d.get("steps"), b.t_s - a.t_s, digits=1),
                "suffix_tokens": b.counters.get("suffix_tokens"),
            }
        inside = sorted(s.triton_rss_mib for s in samples if start <= s.t_s < end and s.triton_rss_mib > 0)
        if inside:
            row["rss_mib_median"] = round(inside[len(inside) // 2], 1)
        out.append(row)
        start = end
    return out
