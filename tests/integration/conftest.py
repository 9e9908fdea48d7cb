"""A real tritonserver on free local ports, serving the project's model repository."""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaserve_backend.triton.grpc_client import ensemble_tensors, infer_inputs
from adaserve_backend.triton.launch import triton_server as triton_server_process
from harness.servers import free_ports  # noqa: F401  (the tests import it from here)


def build_inputs(grpcclient, prompt: str, max_tokens: int, **kwargs) -> list:
    """InferInputs for the ensemble (see ensemble_tensors for the keywords)."""
    return infer_inputs(grpcclient, ensemble_tensors(prompt, max_tokens, **kwargs))


@dataclass(frozen=True)
class Server:
    http: int
    grpc: int
    metrics: int
    log: Path

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc}"

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://localhost:{self.metrics}/metrics", timeout=10).read().decode()
        values = [float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith(name + " ") or line.startswith(name + "{")]
        if not values:
            raise KeyError(name)
        return sum(values)


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    http, grpc, metrics = free_ports(3)
    log = tmp_path_factory.mktemp("triton") / "server.log"
    process = triton_server_process(http, grpc, metrics, log)
    try:
        process.start(timeout_s=600)
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(str(e))
    try:
        yield Server(http, grpc, metrics, log)
    finally:
        process.stop(grace_s=60)
    if os.environ.get("ADASERVE_KEEP_LOG"):
        print(log.read_text())
