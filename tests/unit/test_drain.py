"""The drain on SIGTERM (config/drain.py, openai_frontend/drain.py): the grace is validated at load and
can be overridden for one server; the OpenAI frontend, once signalled, answers /health and new
generations 503 (with Retry-After), lets a generation that finishes within the grace finish, and ends
one that cannot with "shutting down" when the grace runs out. The frontend is the real aiohttp
application with the ensemble faked, as in test_openai_hostile; the last test signals a real frontend
process. tests/integration/test_triton_shutdown.py does the same to tritonserver itself."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.config import EngineConfig
from adaserve_backend.openai_frontend.drain import Drain
from adaserve_backend.triton.launch import exit_timeout_s
from adaserve_backend.triton.repository import DRAIN_GRACE_ENV, load_engine_config, served_drain_grace_s
from harness.servers import free_ports
from tests.unit.test_openai_hostile import FakeEnsemble, frontend_without_triton

STEP_S = 0.05  # the fake ensemble's time per delta
GRACE_S = 1.0


class PacedEnsemble(FakeEnsemble):
    """One delta every STEP_S, `max_tokens` of them."""

    async def stream_tensors(self, tensors):
        n = int(tensors["max_tokens"].reshape(-1)[0])
        for i in range(n):
            await asyncio.sleep(STEP_S)
            yield "x", {"num_output_tokens": i + 1, **({"finish_reason": "length"} if i == n - 1 else {})}


@pytest.fixture(scope="module")
def tokenizer():
    from adaserve_backend.triton.repository import load_repository_tokenizer

    return load_repository_tokenizer(str(PROJECT_ROOT / "model_repository" / "preprocessing"))


def test_the_grace_is_validated_at_load_and_can_be_set_for_one_server(monkeypatch):
    assert EngineConfig.from_dict({}).drain.grace_s == 5.0
    assert EngineConfig.from_dict({"drain": {"grace_s": 0}}).drain.grace_s == 0
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="grace_s"):
            EngineConfig.from_dict({"drain": {"grace_s": bad}})
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"drain": {"grace": 1}})
    repository = str(PROJECT_ROOT / "model_repository")
    served = load_engine_config(os.path.join(repository, "adaserve")).drain.grace_s
    monkeypatch.setenv(DRAIN_GRACE_ENV, "0")
    assert served_drain_grace_s(repository) == 0 and served > 0
    monkeypatch.setenv(DRAIN_GRACE_ENV, "-2")
    with pytest.raises(ValueError, match="grace_s"):
        served_drain_grace_s(repository)
    monkeypatch.setenv(DRAIN_GRACE_ENV, "soon")
    with pytest.raises(ValueError, match=DRAIN_GRACE_ENV):
        served_drain_grace_s(repository)
    # Triton's exit timeout outlasts the grace: at its end Triton exits at once, cutting off the rest
    assert exit_timeout_s(0) >= 3 and exit_timeout_s(5.0) > 5.0 + 3 and exit_timeout_s(0.5) > 0.5 + 3


async def read_events(resp) -> list[str]:
    body = (await resp.read()).decode()
    return [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]


def test_a_draining_frontend_refuses_new_work_finishes_what_fits_the_grace_and_ends_the_rest(tokenizer):
    async def main():
        frontend = frontend_without_triton(tokenizer, ensemble_cls=PacedEnsemble)
        frontend.drain = Drain(GRACE_S)
        async with TestClient(TestServer(frontend.app())) as client:
            def generate(max_tokens: int):
                return client.post("/v1/completions", json={"prompt": "hi", "max_tokens": max_tokens, "stream": True})

            short, long = await generate(10), await generate(1000)  # headers sent: both are generating
            assert short.status == long.status == 200
            frontend.drain.signalled()
            started = time.monotonic()
            drained = asyncio.ensure_future(frontend.drain.wait_out(lambda: frontend.in_flight))
            health = await client.get("/health")
            refused = await generate(5)
            refused_body = await refused.json()
            short_events, long_events = await read_events(short), await read_events(long)
            long_ended_s = time.monotonic() - started
            await asyncio.wait_for(drained, 5)
            return health.status, refused, refused_body, short_events, long_events, long_ended_s

    health, refused, refused_body, short_events, long_events, long_ended_s = asyncio.run(main())
    assert health == 503
    assert refused.status == 503 and refused.headers.get("Retry-After")
    assert "shutting down" in refused_body["error"]["message"]
    assert short_events[-1] == "[DONE]" and json.loads(short_events[-2])["choices"][0]["finish_reason"] == "length"
    assert sum(json.loads(e)["choices"][0]["text"] == "x" for e in short_events[:-1]) == 10
    assert long_events[-1] == "[DONE]" and "shutting down" in json.loads(long_events[-2])["error"]["message"]
    assert GRACE_S <= long_ended_s < GRACE_S + 1, long_ended_s


def test_an_idle_drain_is_over_at_once_and_a_second_signal_ends_the_grace():
    async def main():
        idle = Drain(30.0)
        idle.signalled()
        t0 = time.monotonic()
        await asyncio.wait_for(idle.wait_out(lambda: 0), 2)
        busy = Drain(30.0)
        busy.signalled()
        task = asyncio.ensure_future(busy.wait_out(lambda: 1))
        await asyncio.sleep(0.1)
        busy.signalled()
        await asyncio.wait_for(task, 2)
        return time.monotonic() - t0, busy.over

    took, over = asyncio.run(main())
    assert took < 1 and over
    with pytest.raises(ValueError, match="grace_s"):
        Drain(-1)


FRONTEND_PROCESS = """
import sys
from adaserve_backend import PROJECT_ROOT
from adaserve_backend.openai_frontend.http_app import serve_frontend
from adaserve_backend.triton.repository import load_repository_tokenizer
from tests.unit.test_drain import PacedEnsemble
from tests.unit.test_openai_hostile import frontend_without_triton

tokenizer = load_repository_tokenizer(str(PROJECT_ROOT / "model_repository" / "preprocessing"))
serve_frontend(frontend_without_triton(tokenizer, ensemble_cls=PacedEnsemble), "127.0.0.1", int(sys.argv[1]),
               on_shutdown=lambda: print("backend stopped", flush=True), drain_grace_s=float(sys.argv[2]))
"""


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_sigterm_to_the_frontend_process_drains_then_stops_the_backend_and_exits(tmp_path):
    """The signal path itself (aiohttp's run_app would have stopped listening at once): a stream that
    fits the grace completes while /health says 503, then the backend is stopped and the process exits."""
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-c", FRONTEND_PROCESS, str(port), str(GRACE_S)], cwd=PROJECT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert status_of(f"http://127.0.0.1:{port}/health") == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        body = json.dumps({"prompt": "hi", "max_tokens": 10, "stream": True}).encode()
        stream = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}),
            timeout=10)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.1)
        assert status_of(f"http://127.0.0.1:{port}/health") == 503
        events = [line for line in stream.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]", events
        assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "length", events
        proc.wait(timeout=GRACE_S + 10)
        output = proc.stdout.read()
        assert proc.returncode == 0 and "backend stopped" in output, output
        assert time.monotonic() - signalled < GRACE_S + 3  # the stream ended early: no waiting out the grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_server_environment_caps_malloc_arenas_unless_the_user_set_them(monkeypatch):
    from adaserve_backend.triton.launch import server_environment

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert server_environment()["MALLOC_ARENA_MAX"] == "2"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert server_environment()["MALLOC_ARENA_MAX"] == "8"
