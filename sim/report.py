"""Writing a command's results: <stem>.json (meta + rows) and a one-line-per-row table on stdout."""

from __future__ import annotations

import json
import os

COLUMNS = [("slo_attainment", "joint", "{:6.3f}"), ("tpot_slo_attainment", "tpot-only", "{:9.3f}"),
           ("goodput_tok_s", "goodput", "{:8.1f}"), ("mean_accepted_per_verify", "acc/verify", "{:10.2f}"),
           ("tpot_ms_p50", "TPOT p50", "{:8.1f}"), ("wall_s", "wall s", "{:6.1f}")]


def save(stem: str, meta: dict, rows: list[dict], **extra) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, **extra, "rows": rows}, f, indent=1, default=str)


def print_rows(rows: list[dict], x_keys: list[str]) -> None:
    head = f"{'policy':>22} " + " ".join(f"{k:>8}" for k in x_keys)
    print(head + " " + " ".join(f"{name:>{len(fmt.format(0))}}" for _, name, fmt in COLUMNS))
    for r in rows:
        xs = " ".join(f"{r[k]:8g}" for k in x_keys)
        print(f"{r['policy']:>22} {xs} " + " ".join(fmt.format(r.get(k) or 0) for k, _, fmt in COLUMNS))
