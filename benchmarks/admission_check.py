"""Whether admission refuses the right requests: each level served twice, as configured and with
admission off (`overload: best_effort`: every request kept and served), and a refusal counted wrong
when the same request, admitted, met both its targets (issue 91's measure).

    python -m benchmarks.vs_peers --admission-check --systems adaserve vllm ...

adds the system `adaserve:admit-off` right after `adaserve`; the report then gives `adaserve` each
level's wrongly refused requests as a count and as a share of those sent.
"""

from __future__ import annotations

BASE = "adaserve"
ADMIT_OFF = f"{BASE}:admit-off"
ADMIT_OFF_VARIANT = {"scheduler": {"overload": "best_effort"}}


def with_admit_off(systems: list[str], variants: dict[str, dict]) -> tuple[list[str], dict[str, dict]]:
    """The systems with `adaserve:admit-off` run right after `adaserve` (added if missing)."""
    systems = [s for s in systems if s != ADMIT_OFF]
    at = systems.index(BASE) + 1 if BASE in systems else len(systems)
    if BASE not in systems:
        systems.insert(0, BASE)
        at = 1
    return systems[:at] + [ADMIT_OFF] + systems[at:], variants | {"admit-off": ADMIT_OFF_VARIANT}


def wrongly_refused(rows: list[dict]) -> list[dict]:
    """Each `adaserve` row given `wrongly_refused` (refused there, attained with admission off, same level
    and window) and `wrongly_refused_share` (of the requests sent)."""
    off = {(r["rps"], r.get("window", 0)): r for r in rows if r["system"] == ADMIT_OFF}
    out = []
    for r in rows:
        other = off.get((r["rps"], r.get("window", 0))) if r["system"] == BASE else None
        if other is not None:
            wrong = len(set(r.get("refused_ids", ())) & set(other.get("attained_ids", ())))
            r = r | {"wrongly_refused": wrong, "wrongly_refused_share": wrong / r["requests"] if r["requests"] else 0.0}
        out.append(r)
    return out


def describe(rows: list[dict]) -> list[str]:
    return [f"{r['system']} @ {r['rps']} rps, window {r.get('window', 0)}: refused {r.get('rejected', 0)} of "
            f"{r['requests']}, {r['wrongly_refused']} of them met both targets with admission off "
            f"({r['wrongly_refused_share']:.1%} of those sent)" for r in rows if "wrongly_refused" in r]
