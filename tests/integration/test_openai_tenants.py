"""Tenants from an API-keys file against a real tritonserver: the frontend refuses a request without a
key, and an isolated tenant's cache scope travels through the ensemble to the engine, where its
prompt reuses only its own cached prefix (Triton's prefix-cache counters say so)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

import pytest

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.child_process import ServerProcess
from adaserve_backend.openai_frontend.tenants import key_entry

from .conftest import free_ports

pytestmark = pytest.mark.slow

KEYS = {name: f"sk-{name}-0123456789abcdefghij" for name in ("iso-a", "iso-b", "open-c", "open-d")}
# Longer than two of the served engine's 128-token blocks: a repeat can reuse two of them.
PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches. " * 30
HIT = "adaserve_prefix_cache_hit_tokens_total"


@pytest.fixture(scope="module")
def frontend(triton_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps({"tenants": {
        name: {"keys": [key_entry(key)], "isolate": name.startswith("iso")} for name, key in KEYS.items()}}))
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "adaserve_backend.openai_frontend", "--triton-url", triton_server.grpc_url,
            "--port", str(port), "--model-repository", str(PROJECT_ROOT / "model_repository"),
            "--api-keys-file", str(keys_file)]
    proc = ServerProcess("openai frontend (tenants)", argv, None, f"http://localhost:{port}/health", "", (),
                         tmp / "frontend.log")
    proc.start(timeout_s=180)
    try:
        yield f"http://localhost:{port}"
    finally:
        proc.stop()


def complete(url: str, key: str | None) -> int:
    req = urllib.request.Request(url + "/v1/completions", method="POST",
                                 data=json.dumps({"prompt": PROMPT, "max_tokens": 1, "temperature": 0}).encode(),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def hit_tokens_after(triton_server, url: str, tenant: str) -> float:
    """The prefix-cache tokens one request of `tenant` was served from."""
    before = triton_server.metric(HIT)
    assert complete(url, KEYS[tenant]) == 200
    time.sleep(1.5)  # the engine publishes its counters when it goes idle
    return triton_server.metric(HIT) - before


def test_a_request_without_a_key_is_refused(frontend):
    assert complete(frontend, None) == 401 and complete(frontend, "sk-unknown-0123456789abcdef") == 401


def test_isolated_tenants_reuse_only_their_own_cached_prefix(triton_server, frontend):
    assert hit_tokens_after(triton_server, frontend, "iso-a") == 0  # the first time anyone sends it
    assert hit_tokens_after(triton_server, frontend, "iso-b") == 0  # another scope: nothing of iso-a's
    assert hit_tokens_after(triton_server, frontend, "open-c") == 0  # unscoped: nothing of either
    assert hit_tokens_after(triton_server, frontend, "iso-a") >= 256  # its own, again
    assert hit_tokens_after(triton_server, frontend, "open-d") >= 256  # unscoped requests share as before
    metrics = urllib.request.urlopen(frontend + "/metrics", timeout=10).read().decode()
    assert 'adaserve_frontend_tenant_requests_total{tenant="iso-a",outcome="ok"} 2' in metrics
