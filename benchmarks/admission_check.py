"""Whether admission refuses the right requests: each level served twice, as configured and with
admission off (`overload: best_effort`: every request kept and served), and a refusal counted wrong
when the same request, admitted, met both its targets (issue 91's measure).

    python -m benchmarks.vs_peers --admission-check --systems adaserve adaserve:NAME vllm ...

runs each of our Triton systems again with admission off right after it (`adaserve:admit-off` after
`adaserve`, `adaserve:NAME+admit-off` after a variant `adaserve:NAME`); the report then gives each of
them its levels' wrongly refused requests, as a count and as a share of those sent.
"""

from __future__ import annotations

BASE = "adaserve"
ADMIT_OFF = f"{BASE}:admit-off"
ADMIT_OFF_VARIANT = {"scheduler": {"overload": "best_effort"}}


def admit_off(system: str) -> str:
    """The name of `system` served with admission off."""
    return ADMIT_OFF if system == BASE else f"{system}+admit-off"


def merged(variant: dict, extra: dict) -> dict:
    return {k: {**variant.get(k, {}), **v} for k, v in extra.items()} | {k: v for k, v in variant.items()
                                                                        if k not in extra}


def with_admit_off(systems: list[str], variants: dict[str, dict]) -> tuple[list[str], dict[str, dict]]:
    """Each of our Triton systems (`adaserve` added if none is named) followed by itself with admission
    off, defined as a variant."""
    ours = [s for s in systems if s == BASE or s.startswith(BASE + ":")]
    if not ours:
        systems, ours = [BASE, *systems], [BASE]
    out, variants = [], dict(variants)
    for s in systems:
        out.append(s)
        if s in ours:
            out.append(admit_off(s))
            name = admit_off(s).split(":", 1)[1]
            variants[name] = merged(variants.get(s.split(":", 1)[1], {}) if s != BASE else {}, ADMIT_OFF_VARIANT)
    return out, variants


def wrongly_refused(rows: list[dict]) -> list[dict]:
    """Each of our rows that has an admit-off twin given `wrongly_refused` (refused there, attained with
    admission off, same level and window) and `wrongly_refused_share` (of the requests sent)."""
    at = {(r["system"], r["rps"], r.get("window", 0)): r for r in rows}
    out = []
    for r in rows:
        other = at.get((admit_off(r["system"]), r["rps"], r.get("window", 0)))
        if other is not None:
            wrong = len(set(r.get("refused_ids", ())) & set(other.get("attained_ids", ())))
            r = r | {"wrongly_refused": wrong, "wrongly_refused_share": wrong / r["requests"] if r["requests"] else 0.0}
        out.append(r)
    return out


def describe(rows: list[dict]) -> list[str]:
    return [f"{r['system']} @ {r['rps']} rps, window {r.get('window', 0)}: refused {r.get('rejected', 0)} of "
            f"{r['requests']}, {r['wrongly_refused']} of them met both targets with admission off "
            f"({r['wrongly_refused_share']:.1%} of those sent)" for r in rows if "wrongly_refused" in r]
