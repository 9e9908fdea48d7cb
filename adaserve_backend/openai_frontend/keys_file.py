"""The keys file (`--api-keys-file`): JSON naming each tenant, its keys' digests and its limits,
checked when the frontend starts, so a typo stops the server with a message instead of leaving a
limit unenforced (docs/tenants.md has the format and an example).

    {"tenants": {"team-a": {"keys": ["sha256:<hex>"], "default_slo_class": "chat", "min_tpot_slo_ms": 65,
                            "max_in_flight": 16, "tokens_per_minute": 60000, "isolate": true}}}
"""

from __future__ import annotations

import json
import math
import re

from ..config import SchedulerConfig
from ..slo import BEST_EFFORT, SLO
from .tenants import DIGEST_PREFIX, Tenant

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # safe as a Prometheus label value and in logs
BOUNDS = ("min_tpot_slo_ms", "min_ttft_slo_ms")
COUNTS = ("max_in_flight", "tokens_per_minute", "burst_tokens")
FIELDS = frozenset({"keys", "default_slo_class", "isolate", *BOUNDS, *COUNTS})


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """json.loads keeps the last of a repeated name silently; here it is an error (a tenant given twice)."""
    names = [k for k, _ in pairs]
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        raise ValueError(f"{', '.join(map(repr, repeated))} given more than once in one object")
    return dict(pairs)


def _positive_number(where: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where} must be a positive number of ms, got {v!r}")
    return float(v)


def _positive_int(where: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where} must be an integer >= 1, got {v!r}")
    return v


def _default_class(where: str, name, scheduler: SchedulerConfig) -> str | None:
    if name is None or name == BEST_EFFORT:
        return name
    if not isinstance(name, str):
        raise ValueError(f"{where}: default_slo_class must be a string, got {name!r}")
    try:
        scheduler.slo_class(name)
    except ValueError as e:
        raise ValueError(f"{where}: default_slo_class: {e}") from None
    return name


def _tenant(name: str, spec, scheduler: SchedulerConfig) -> Tenant:
    if not NAME.match(name):
        raise ValueError(f"tenant name {name!r}: 1-64 letters, digits, '.', '_' or '-', a letter or digit first")
    where = f"tenant {name!r}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object")
    unknown = sorted(set(spec) - FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}")
    keys = spec.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and DIGEST.match(k) for k in keys):
        raise ValueError(f"{where}: 'keys' must be a non-empty list of \"sha256:<64 lower-case hex digits>\" "
                         "(python -m adaserve_backend.openai_frontend.tenants hash < KEY)")
    limits = {f: None if spec.get(f) is None else _positive_number(f"{where}: {f}", spec[f]) for f in BOUNDS}
    limits |= {f: None if spec.get(f) is None else _positive_int(f"{where}: {f}", spec[f]) for f in COUNTS}
    if limits["burst_tokens"] is not None and limits["tokens_per_minute"] is None:
        raise ValueError(f"{where}: burst_tokens needs tokens_per_minute")
    if limits["burst_tokens"] is None:
        limits["burst_tokens"] = limits["tokens_per_minute"]  # one minute's worth
    isolate = spec.get("isolate", False)
    if not isinstance(isolate, bool):
        raise ValueError(f"{where}: isolate must be true or false, got {isolate!r}")
    tenant = Tenant(name, tuple(bytes.fromhex(k[len(DIGEST_PREFIX):]) for k in keys),
                    _default_class(where, spec.get("default_slo_class"), scheduler), isolate=isolate, **limits)
    if tenant.default_slo_class is not None:  # its own default must not be refused
        tight = tenant.too_tight(scheduler.resolve_slo(SLO(slo_class=tenant.default_slo_class)))
        if tight:
            raise ValueError(f"{where}: default_slo_class {tenant.default_slo_class!r} has {tight[0]} {tight[1]:g}, "
                             f"tighter than its own {'min_' + tight[0]} {tight[2]:g}")
    return tenant


def parse_keys_file(text: str, scheduler: SchedulerConfig) -> tuple[Tenant, ...]:
    """The tenants of a keys file's text, or ValueError saying what is wrong; SLO classes are the
    served ones (`scheduler`)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(data, dict) or set(data) != {"tenants"} or not isinstance(data["tenants"], dict):
        raise ValueError('the file must be one object {"tenants": {"<name>": {...}, ...}} and nothing more')
    if not data["tenants"]:
        raise ValueError("no tenants: every request would be refused")
    tenants = tuple(_tenant(name, spec, scheduler) for name, spec in data["tenants"].items())
    owner: dict[bytes, str] = {}
    for t in tenants:
        for d in t.key_digests:
            if d in owner:
                whose = f"twice for tenant {t.name!r}" if owner[d] == t.name else f"for {owner[d]!r} and {t.name!r}"
                raise ValueError(f"key {DIGEST_PREFIX}{d.hex()[:12]}... is listed {whose}")
            owner[d] = t.name
    return tenants


def load_keys_file(path: str, scheduler: SchedulerConfig) -> tuple[Tenant, ...]:
    """The keys file's tenants, or SystemExit saying what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"--api-keys-file {path}: cannot read it: {e}") from None
    try:
        return parse_keys_file(text, scheduler)
    except ValueError as e:
        raise SystemExit(f"--api-keys-file {path}: {e}") from None

