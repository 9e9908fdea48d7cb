"""OpenAI's `service_tier` as this server's SLO classes: "priority" is the tightest class (the shortest
time per token), "flex" the loosest, "default" and "auto" leave the request as it is (its own SLO
fields, or the server's default class), unless engine.json's scheduler.service_tiers maps them
otherwise. A request that names both a tier and SLO fields is refused: two answers to one question. A
tenant's key bounds the class a tier maps to as it bounds any class (tenancy.py). The response says
the tier it was served at, as OpenAI's does."""

from __future__ import annotations

import dataclasses

from ..slo import SLO
from .field_readers import bad
from .params import Generation


def tier_classes(slo_classes, configured: dict[str, str] | None = None) -> dict[str, str]:
    """Tier -> SLO class name: engine.json's scheduler.service_tiers if it sets them, else "priority" the
    tightest class (by TPOT target) and "flex" the loosest."""
    if configured is not None:
        return dict(configured)
    if not slo_classes:
        return {}
    by_pace = sorted(slo_classes, key=lambda c: (c.tpot_ms, c.ttft_ms))
    return {"priority": by_pace[0].name, "flex": by_pace[-1].name}


def with_tier(gen: Generation, classes: dict[str, str]) -> Generation:
    """The request's SLO under its tier (unchanged for auto, no tier, or a default the config maps to
    nothing)."""
    if gen.service_tier not in ("priority", "flex", "default") or (gen.service_tier == "default"
                                                                    and "default" not in classes):
        return gen
    if gen.slo != SLO():
        raise bad("service_tier", "give either 'service_tier' or SLO targets (slo_class, tpot_slo_ms, ttft_slo_ms)")
    if gen.service_tier not in classes:
        raise bad("service_tier", f"service_tier {gen.service_tier!r} is not offered by this server")
    return dataclasses.replace(gen, slo=SLO(slo_class=classes[gen.service_tier]))


def served_tier(asked: str | None) -> str | None:
    """The tier a response names: the one asked for, "default" for "auto"; none if none was asked."""
    return None if asked is None else asked if asked in ("priority", "flex") else "default"


def repository_tiers(model_repository: str) -> dict[str, str]:
    """tier_classes of the served engine's SLO classes."""
    import os

    from ..triton.repository import load_engine_config

    scheduler = load_engine_config(os.path.join(model_repository, "adaserve")).scheduler
    return tier_classes(scheduler.slo_classes, scheduler.service_tiers)
