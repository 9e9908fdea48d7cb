"""Tenants from an API-keys file (docs/tenants.md): a key is required, the tenant is the key's whatever
the request says, SLO bounds give 403, the in-flight cap and token rate give 429 with Retry-After, the
file is checked loudly, the hashing command's entries work, and /metrics counts per tenant. The real
aiohttp application with a backend that records what it was asked; test_cache_scope.py has what
isolation does in the engine."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend.config import SchedulerConfig
from adaserve_backend.openai_frontend import tenants as tenants_cli
from adaserve_backend.openai_frontend.field_readers import OpenAIError
from adaserve_backend.openai_frontend.http_app import Frontend
from adaserve_backend.openai_frontend.keys_file import load_keys_file, parse_keys_file
from adaserve_backend.openai_frontend.params import Generation, parse
from adaserve_backend.openai_frontend.tenancy import Tenancy, load_tenancy
from adaserve_backend.openai_frontend.tenants import key_entry
from adaserve_backend.openai_frontend.triton_backend import ensemble_request
from adaserve_backend.triton.protocol import parse_request
from tests.openai_backends import NO_CACHE, StandInBackend

SCHEDULER = SchedulerConfig()  # coding 65 ms / 2 s, chat 80 ms / 2 s, summary 150 ms / 5 s
KEY_A, KEY_B, KEY_C = "sk-team-a-0123456789abcdef", "sk-team-b-0123456789abcdef", "sk-team-c-0123456789abcdef"
KEYS = {"tenants": {
    "team-a": {"keys": [key_entry(KEY_A)], "default_slo_class": "summary", "min_tpot_slo_ms": 70,
               "min_ttft_slo_ms": 1000},
    "team-b": {"keys": [key_entry(KEY_B)], "max_in_flight": 1, "isolate": True},
    "team-c": {"keys": [key_entry(KEY_C)], "tokens_per_minute": 60, "burst_tokens": 10},
}}
USAGE = (5, 3)  # what every generation reports: prompt and completion tokens


class RecordingBackend(StandInBackend):
    """Answers every generation with one delta and USAGE; `hold` keeps streams open until set."""

    def __init__(self) -> None:
        self.seen: list[Generation] = []
        self.hold: asyncio.Event | None = None

    async def stream(self, gen: Generation, prompt: str):
        self.seen.append(gen)
        yield "Hi", {"num_input_tokens": USAGE[0]}
        if self.hold is not None:
            await self.hold.wait()
        yield "", {"num_output_tokens": USAGE[1], "finish_reason": "length"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def frontend(clock: Clock | None = None, keys: dict = KEYS) -> Frontend:
    tenancy = Tenancy(parse_keys_file(json.dumps(keys), SCHEDULER), SCHEDULER, clock or Clock())
    return Frontend(RecordingBackend(), "adaserve", lambda messages: "", tenancy=tenancy)


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def ask(client, key: str | None, **body):
    resp = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, **body},
                             headers=auth(key) if key else {})
    return resp.status, await resp.json(), resp.headers


def served(fe: Frontend, coro):
    async def main():
        async with TestClient(TestServer(fe.app())) as client:
            return await coro(client)

    return asyncio.run(main())


def test_a_request_without_a_valid_key_is_refused_and_open_paths_stay_open():
    async def calls(client):
        out = [await ask(client, None), await ask(client, "sk-not-a-key-0123456789"),
               await ask(client, KEY_A.upper())]
        basic = await client.post("/v1/completions", json={"prompt": "Hi"}, headers={"Authorization": f"Basic {KEY_A}"})
        models = await client.get("/v1/models")
        health, metrics = await client.get("/health"), await client.get("/metrics")
        return out, basic.status, models.status, health.status, metrics.status

    out, basic, models, health, metrics = served(frontend(), calls)
    for status, body, _ in out:
        assert status == 401 and body["error"]["type"] == "authentication_error", body
    assert (basic, models, health, metrics) == (401, 401, 200, 200)


def test_the_tenant_is_the_keys_never_the_clients_user_field():
    fe = frontend()

    async def calls(client):
        return [await ask(client, KEY_A, user="team-b"), await ask(client, KEY_B, user="someone-else"),
                await ask(client, KEY_C)]

    assert [status for status, _, _ in served(fe, calls)] == [200, 200, 200]
    seen = fe.backend.seen
    assert [g.tenant for g in seen] == ["team-a", "team-b", "team-c"]
    assert [g.cache_scope for g in seen] == [None, "team-b", None]  # only team-b asked for isolation


def test_the_default_class_applies_and_targets_tighter_than_the_tenants_bounds_get_403():
    fe = frontend()

    async def calls(client):
        return {
            "nothing asked": await ask(client, KEY_A),
            "numbers within": await ask(client, KEY_A, tpot_slo_ms=100, ttft_slo_ms=3000),
            "best effort": await ask(client, KEY_A, slo_class="best_effort"),
            "class too tight": await ask(client, KEY_A, slo_class="coding"),
            "tpot too tight": await ask(client, KEY_A, tpot_slo_ms=50),
            "ttft too tight": await ask(client, KEY_A, ttft_slo_ms=500),
            "header too tight": (await client.post("/v1/completions", json={"prompt": "Hi"},
                                                   headers={**auth(KEY_A), "x-slo-tpot-ms": "60"})).status,
            "unknown class": await ask(client, KEY_A, slo_class="platinum"),
            "no bounds": await ask(client, KEY_B, slo_class="coding"),
        }

    got = served(fe, calls)
    ok = ("nothing asked", "numbers within", "best effort", "no bounds")
    assert all(got[name][0] == 200 for name in ok), got
    assert [g.slo.slo_class for g in fe.backend.seen] == ["summary", "summary", "best_effort", "coding"]
    for name, param in (("class too tight", "slo_class"), ("tpot too tight", "tpot_slo_ms"),
                        ("ttft too tight", "ttft_slo_ms")):
        status, body, _ = got[name]
        assert status == 403 and body["error"]["type"] == "permission_error", (name, body)
        assert body["error"]["param"] == param and "team-a" in body["error"]["message"], (name, body)
    assert got["header too tight"] == 403
    assert got["unknown class"][0] == 400 and got["unknown class"][1]["error"]["param"] == "slo_class"


def test_beyond_the_in_flight_cap_a_tenant_gets_429_with_retry_after_and_others_are_served():
    fe = frontend()
    fe.backend.hold = asyncio.Event()  # every stream stays open until set
    in_flight = fe.tenancy.limits.in_flight

    async def calls(client):
        first, other = asyncio.ensure_future(ask(client, KEY_B)), asyncio.ensure_future(ask(client, KEY_A))
        while in_flight["team-b"] < 1 or in_flight["team-a"] < 1:
            await asyncio.sleep(0.01)
        second = await ask(client, KEY_B)
        fe.backend.hold.set()
        return second, (await first)[0], (await other)[0], (await ask(client, KEY_B))[0]

    (status, body, headers), first, other, after = served(fe, calls)
    assert (first, other, after) == (200, 200, 200)
    assert status == 429 and headers["Retry-After"] == "1", (status, body)
    assert body["error"]["type"] == "requests" and body["error"]["code"] == "rate_limit_exceeded", body
    assert in_flight == {"team-a": 0, "team-b": 0, "team-c": 0}


def test_every_choice_takes_a_place_and_pays_for_its_tokens():
    keys = {"tenants": {"t": {"keys": [key_entry(KEY_A)], "max_in_flight": 3}}}
    fe = frontend(keys=keys)
    fe.backend.hold = asyncio.Event()
    in_flight = fe.tenancy.limits.in_flight

    async def calls(client):
        never = await ask(client, KEY_A, n=4)  # more than the tenant may ever run at once
        first = asyncio.ensure_future(ask(client, KEY_A, n=2))
        while in_flight["t"] < 2:
            await asyncio.sleep(0.01)
        over = await ask(client, KEY_A, prompt=["a", "b"])  # a batch: a generation per prompt
        fe.backend.hold.set()
        return never, over, await first

    never, over, (status, body, _) = served(fe, calls)
    assert never[0] == 400 and never[1]["error"]["param"] == "n"
    assert over[0] == 429 and "would pass its limit of 3" in over[1]["error"]["message"]
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11, **NO_CACHE}
    assert in_flight == {"t": 0}
    assert (fe.tenancy.metrics.tokens["t", "prompt"], fe.tenancy.metrics.tokens["t", "completion"]) == (5, 6)


def test_a_tenant_whose_token_bucket_is_in_debt_gets_429_until_the_rate_pays_it_off():
    clock = Clock()
    fe = frontend(clock)  # team-c: 60 tokens a minute (one a second), a bucket of 10; each request uses 8

    async def calls(client):
        out = [(await ask(client, KEY_C))[0], (await ask(client, KEY_C))[0]]  # 10 -> 2 -> -6: in debt
        out.append(await ask(client, KEY_C))
        clock.now += 5.5
        out.append((await ask(client, KEY_C))[0])  # still 0.5 tokens in debt
        clock.now += 0.5
        out.append((await ask(client, KEY_C))[0])
        out.append((await ask(client, KEY_A))[0])  # other tenants never wait for it
        return out

    first, second, (status, body, headers), early, paid, other = served(fe, calls)
    assert (first, second) == (200, 200)
    assert status == 429 and headers["Retry-After"] == "6", (status, headers)
    assert body["error"]["type"] == "tokens" and body["error"]["code"] == "rate_limit_exceeded", body
    assert (early, paid, other) == (429, 200, 200)


def test_per_tenant_metrics_count_outcomes_in_flight_and_tokens():
    fe = frontend()

    async def calls(client):
        await ask(client, KEY_A)
        await ask(client, KEY_A, tpot_slo_ms=10)  # 403
        await ask(client, KEY_A, max_tokens=0)  # 400
        await ask(client, None)  # 401
        for _ in range(3):
            await ask(client, KEY_C)  # 200, 200, 429
        return await (await client.get("/metrics")).text()

    text = served(fe, calls)
    lines = set(text.splitlines())
    for line in ('adaserve_frontend_tenant_requests_total{tenant="team-a",outcome="ok"} 1',
                 'adaserve_frontend_tenant_requests_total{tenant="team-a",outcome="4xx"} 2',
                 'adaserve_frontend_tenant_requests_total{tenant="team-c",outcome="ok"} 2',
                 'adaserve_frontend_tenant_requests_total{tenant="team-c",outcome="429"} 1',
                 'adaserve_frontend_tenant_requests_total{tenant="team-b",outcome="ok"} 0',
                 'adaserve_frontend_tenant_requests_in_flight{tenant="team-a"} 0',
                 'adaserve_frontend_tenant_tokens_total{tenant="team-a",kind="prompt"} 5',
                 'adaserve_frontend_tenant_tokens_total{tenant="team-c",kind="completion"} 6',
                 "adaserve_frontend_unauthenticated_requests_total 1", "adaserve_frontend_requests_in_flight 0"):
        assert line in lines, (line, text)


def test_a_cancelled_stream_frees_its_place_and_pays_for_what_it_used():
    fe = frontend()
    fe.backend.hold = asyncio.Event()

    async def calls(client):
        resp = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True}, headers=auth(KEY_B))
        await resp.content.readline()  # the first delta arrived
        resp.close()  # the client goes away mid-stream
        while fe.tenancy.limits.in_flight["team-b"]:
            await asyncio.sleep(0.01)
        return fe.tenancy.metrics.requests["team-b", "cancelled"], fe.tenancy.metrics.tokens["team-b", "prompt"]

    assert served(fe, calls) == (1, USAGE[0])


def test_the_cache_scope_travels_to_the_scheduler_model_and_is_never_dropped():
    gen = parse({"prompt": "Hi"}, "completions")
    scoped = Generation(**{**gen.__dict__, "tenant": "team-b", "cache_scope": "team-b"})
    tensors = ensemble_request(scoped, "Hi", supported={"tenant", "cache_scope"})
    assert tensors["cache_scope"][0] == b"team-b"
    with pytest.raises(OpenAIError) as refused:  # a repository that cannot isolate never serves the tenant
        ensemble_request(scoped, "Hi", supported={"tenant"})
    assert refused.value.status == 500
    assert "cache_scope" not in ensemble_request(gen, "Hi", supported={"tenant", "cache_scope"})
    request, _ = parse_request("r", {"input_ids": np.array([1, 2, 3], dtype=np.int32),
                                     "cache_scope": np.array([b"team-b"], dtype=object)})
    assert request.cache_scope == "team-b"
    assert parse_request("r", {"input_ids": np.array([1, 2, 3], dtype=np.int32)})[0].cache_scope is None


def tenant_file(**spec) -> str:
    return json.dumps({"tenants": {"t": {"keys": [key_entry(KEY_A)], **spec}}})


@pytest.mark.parametrize("text, says", [
    ("{", "not valid JSON"),
    (json.dumps({"tenants": {}}), "no tenants"),
    (json.dumps({"tenants": {"t": {"keys": [key_entry(KEY_A)]}}, "extra": 1}), "nothing more"),
    ('{"tenants": {"t": {"keys": ["%s"]}, "t": {"keys": ["%s"]}}}' % (key_entry(KEY_A), key_entry(KEY_B)),
     "'t' given more than once"),
    (tenant_file(max_inflight=3), "unknown field(s) max_inflight"),
    (tenant_file(keys=[KEY_A]), "'keys' must be"),
    (json.dumps({"tenants": {"t": {"keys": []}}}), "'keys' must be"),
    (json.dumps({"tenants": {"t": {"keys": [key_entry(KEY_A).upper()]}}}), "'keys' must be"),
    (json.dumps({"tenants": {"a": {"keys": [key_entry(KEY_A)]}, "b": {"keys": [key_entry(KEY_A)]}}}),
     "listed for 'a' and 'b'"),
    (tenant_file(keys=[key_entry(KEY_A)] * 2), "twice for tenant 't'"),
    (json.dumps({"tenants": {"team a": {"keys": [key_entry(KEY_A)]}}}), "tenant name 'team a'"),
    (tenant_file(max_in_flight=0), "max_in_flight must be an integer >= 1"),
    (tenant_file(max_in_flight=True), "max_in_flight must be an integer >= 1"),
    (tenant_file(tokens_per_minute=2.5), "tokens_per_minute must be an integer >= 1"),
    (tenant_file(min_tpot_slo_ms=-5), "min_tpot_slo_ms must be a positive number"),
    (tenant_file(min_ttft_slo_ms="1000"), "min_ttft_slo_ms must be a positive number"),
    (tenant_file(burst_tokens=100), "burst_tokens needs tokens_per_minute"),
    (tenant_file(isolate="yes"), "isolate must be true or false"),
    (tenant_file(default_slo_class="platinum"), "unknown slo_class 'platinum'"),
    (tenant_file(default_slo_class="coding", min_tpot_slo_ms=70), "tighter than its own min_tpot_slo_ms 70"),
    (json.dumps({"tenants": {"t": "sk-plain"}}), "tenant 't' must be an object"),
])
def test_a_bad_keys_file_is_refused_with_a_message_naming_the_problem(text, says, tmp_path):
    with pytest.raises(ValueError) as e:
        parse_keys_file(text, SCHEDULER)
    assert says in str(e.value), str(e.value)
    path = tmp_path / "keys.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as stopped:
        load_keys_file(str(path), SCHEDULER)
    assert str(path) in str(stopped.value) and says in str(stopped.value)


def test_a_good_keys_file_loads_with_its_defaults(tmp_path):
    (t,) = parse_keys_file(tenant_file(tokens_per_minute=600, default_slo_class="best_effort"), SCHEDULER)
    assert (t.name, t.burst_tokens, t.max_in_flight, t.isolate, t.cache_scope) == ("t", 600, None, False, None)
    with pytest.raises(SystemExit, match="cannot read it"):
        load_keys_file(str(tmp_path / "missing.json"), SCHEDULER)


def test_a_single_api_key_and_a_keys_file_together_are_refused(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    with pytest.raises(SystemExit, match="exclude each other"):
        load_tenancy(str(path), "sk-single", SCHEDULER)
    assert load_tenancy(None, "sk-single", SCHEDULER) is None
    assert isinstance(load_tenancy(str(path), None, SCHEDULER), Tenancy)


def test_the_hashing_command_makes_entries_the_frontend_accepts(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY_A + "\n"))
    tenants_cli.main(["hash"])
    assert capsys.readouterr().out.strip() == key_entry(KEY_A)
    tenants_cli.main(["new"])
    key, entry = capsys.readouterr().out.split()
    assert entry == key_entry(key) and key != KEY_A
    for short in ("sk-short", "has a space in it 0123456789", ""):
        monkeypatch.setattr("sys.stdin", io.StringIO(short))
        with pytest.raises(SystemExit):
            tenants_cli.main(["hash"])
    fe = frontend(keys={"tenants": {"new": {"keys": [entry]}}})
    assert served(fe, lambda client: ask(client, key))[0] == 200
