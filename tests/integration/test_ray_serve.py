"""Engine replicas on a real Ray Serve (adaserve_backend/ray_serve) behind the SLO-aware router, with the
OpenAI frontend in front: a Ray cluster started and stopped here, two replicas of the embedded model
with one thread each. Requests are served and spread over both; a replica killed mid-stream ends its
own streams with a 503 and the others finish; a stop ends every stream with a final answer. The
router's recorded decisions replay identically through the simulator's SLO router."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Write a long story about a dragon who"
LONG_PROMPT = " ".join(["The dragon flew over the quiet village at dawn, and nobody saw it."] * 24)


@pytest.fixture(scope="module")
def ray_app(tmp_path_factory):
    """(handle, engine config, routing log) of a two-replica deployment; Ray and Serve stopped after the
    module."""
    import ray
    from ray import serve

    from adaserve_backend.ray_serve.app import deploy

    served = json.loads((ROOT / "model_repository/adaserve/1/engine.json").read_text())
    profile = str(ROOT / "model_repository/adaserve/1/profile-cpu.json")
    served["speculation"] = {"profile_path": profile, "calibrate": False}
    served["target_cache"] = {"block_size": 128, "memory_mb": 64}
    served["draft_cache"] = {"block_size": 128, "memory_mb": 16}
    path = tmp_path_factory.mktemp("ray") / "engine.json"
    routing_log = path.with_name("routing.jsonl")
    path.write_text(json.dumps(served))
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # workers inherit this environment
    try:
        yield deploy(str(path), replicas=2, threads=1, router="slo", stats_period_s=0.1,
                     record_routing=str(routing_log)), \
            str(path), routing_log
    finally:
        serve.shutdown()
        ray.shutdown()


def frontend_for(handle, config_path: str, routing_log=None):
    from adaserve_backend.config import EngineConfig
    from adaserve_backend.models import load_tokenizer, locate
    from adaserve_backend.openai_frontend.http_app import Frontend
    from adaserve_backend.openai_frontend.served_prompts import chat_renderer
    from adaserve_backend.ray_serve.backend import RayBackend

    config = EngineConfig.from_json(config_path)
    tokenizer = load_tokenizer(locate(config.target.path))
    return Frontend(RayBackend(handle, tokenizer, config.scheduler, config.target_cache.block_size), "adaserve",
                    chat_renderer(tokenizer))


async def stream_events(client, body: dict, events: list) -> None:
    """Appends each SSE event's JSON (or "[DONE]") as it arrives."""
    async with client.post("/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: "):
                data = line[6:].strip().decode()
                events.append(data if data == "[DONE]" else json.loads(data))


def replica_actors():
    import ray

    return [ray.get_actor(a["name"], namespace=a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if "SERVE_REPLICA" in a["name"]]


def run(ray_app, scenario):
    from aiohttp.test_utils import TestClient, TestServer

    async def main():
        frontend = frontend_for(*ray_app)
        async with TestClient(TestServer(frontend.app())) as client:
            return await asyncio.wait_for(scenario(client, frontend), 240)

    return asyncio.run(main())


def test_requests_are_served_and_spread_over_both_replicas(ray_app):
    async def scenario(client, frontend):
        resp = await client.post("/v1/completions", json={"prompt": "def fib(n):", "max_tokens": 16, "temperature": 0,
                                                          "slo_class": "coding"})
        whole = await resp.json()
        chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 8, "temperature": 0})
        bad = await client.post("/v1/completions", json={"prompt": "x", "slo_class": "nope"})
        streams = [[] for _ in range(4)]
        await asyncio.gather(*(stream_events(client, {"prompt": PROMPT, "max_tokens": 48,
                                                      "ignore_eos": True}, s) for s in streams))
        return resp.status, whole, chat.status, bad.status, streams

    status, whole, chat, bad, streams = run(ray_app, scenario)
    assert status == 200 and whole["usage"]["completion_tokens"] == 16 and whole["choices"][0]["text"]
    assert chat == 200 and bad == 400
    assert all(s[-1] == "[DONE]" and s[-2]["choices"][0]["finish_reason"] == "length" for s in streams)
    stats = [a.record_routing_stats.remote() for a in replica_actors()]
    import ray

    assert len(stats) == 2 and all(ray.get(stats, timeout=30))  # both replicas up and publishing
    from sim.router_check import agreement, read

    decisions = read(ray_app[2])
    assert len(decisions) >= 6 and {d.routed for d in decisions} <= set(decisions[-1].replicas)
    assert agreement(decisions, "slo")["agrees_with_first_choice"] == 1.0  # the simulator decides as the real router


def test_a_replica_killed_mid_stream_fails_its_streams_and_the_rest_go_on(ray_app):
    import ray

    async def scenario(client, frontend):
        # Long prompts, each its own: the router charges each send's prompt to its replica, so four
        # spread over both (four short prompts may all fit on the replica whose first token is soonest).
        streams = [[] for _ in range(4)]
        tasks = [asyncio.create_task(stream_events(client, {"prompt": f"{i}. {LONG_PROMPT}",
                                                            "max_tokens": 300, "ignore_eos": True}, s))
                 for i, s in enumerate(streams)]
        while sum(1 for s in streams if s) < 4:  # every stream under way
            await asyncio.sleep(0.05)
        ray.kill(replica_actors()[0], no_restart=False)
        await asyncio.gather(*tasks)
        after = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        return streams, after.status

    streams, after = run(ray_app, scenario)
    failed = [s for s in streams if "error" in s[-2]]
    assert all(s[-1] == "[DONE]" for s in streams)  # none hangs, each ends with a final event
    assert failed and len(failed) < len(streams)
    assert all("replica" in s[-2]["error"]["message"] for s in failed)
    assert after == 200  # routed to the replica left (or its replacement)


def test_a_stop_ends_every_stream_with_a_final_answer(ray_app):
    async def scenario(client, frontend):
        streams = [[] for _ in range(2)]
        tasks = [asyncio.create_task(stream_events(client,
                                                   {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}, s))
                 for s in streams]
        while not all(streams):
            await asyncio.sleep(0.05)
        frontend.backend.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        refused = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        return streams, refused.status

    streams, refused = run(ray_app, scenario)
    assert all(s[-1] == "[DONE]" and "shutting down" in s[-2]["error"]["message"] for s in streams)
    assert refused == 503
