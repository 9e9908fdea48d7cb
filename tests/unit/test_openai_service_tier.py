"""OpenAI's service_tier as the server's SLO classes: priority the tightest, flex the loosest."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.config import DEFAULT_SLO_CLASSES
from adaserve_backend.openai_frontend.field_readers import OpenAIError
from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.openai_frontend.params import parse
from adaserve_backend.openai_frontend.service_tiers import tier_classes, with_tier
from tests.unit.test_openai_tenants import RecordingBackend

TIERS = tier_classes(DEFAULT_SLO_CLASSES)
BODY = {"prompt": "Hi", "max_tokens": 2}


def test_tiers_are_the_tightest_and_loosest_classes():
    assert TIERS == {"priority": "coding", "flex": "summary"}
    assert with_tier(parse({**BODY, "service_tier": "priority"}, "completions"), TIERS).slo.slo_class == "coding"
    assert with_tier(parse({**BODY, "service_tier": "flex"}, "completions"), TIERS).slo.slo_class == "summary"
    plain = parse(BODY, "completions").slo
    assert with_tier(parse({**BODY, "service_tier": "auto"}, "completions"), TIERS).slo == plain
    for body in ({**BODY, "service_tier": "scale"}, {**BODY, "service_tier": "priority", "slo_class": "chat"}):
        with pytest.raises(OpenAIError) as e:
            with_tier(parse(body, "completions"), TIERS)
        assert e.value.status == 400 and e.value.param == "service_tier"


def test_the_response_names_the_tier_and_the_backend_gets_the_class():
    backend = RecordingBackend()
    frontend = Frontend(backend, "adaserve", lambda messages: "", tiers=TIERS)

    async def main():
        async with TestClient(TestServer(frontend.app())) as client:
            out = []
            for tier in ("priority", "auto", None):
                body = BODY if tier is None else {**BODY, "service_tier": tier}
                out.append(json.loads(await (await client.post("/v1/completions", json=body)).text()))
            return out

    priority, auto, none = asyncio.run(main())
    assert priority["service_tier"] == "priority" and auto["service_tier"] == "default" and "service_tier" not in none
    assert backend.seen[0].slo.slo_class == "coding" and backend.seen[1].slo.slo_class is None


def test_engine_json_may_map_the_tiers_itself_and_is_checked_at_load():
    from adaserve_backend.config import SchedulerConfig

    config = SchedulerConfig(service_tiers={"priority": "chat", "default": "summary"})
    tiers = tier_classes(config.slo_classes, config.service_tiers)
    assert with_tier(parse({**BODY, "service_tier": "priority"}, "completions"), tiers).slo.slo_class == "chat"
    assert with_tier(parse({**BODY, "service_tier": "default"}, "completions"), tiers).slo.slo_class == "summary"
    with pytest.raises(OpenAIError):
        with_tier(parse({**BODY, "service_tier": "flex"}, "completions"), tiers)  # not offered by this map
    with pytest.raises(ValueError, match="service_tiers"):
        SchedulerConfig(service_tiers={"priority": "platinum"})
