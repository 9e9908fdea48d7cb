"""A real tritonserver on free local ports, serving the project's model repository."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaserve_backend.triton.server import PROJECT_ROOT, server_command


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
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")]
        if not values:
            raise KeyError(name)
        return sum(values)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    http, grpc, metrics = free_ports(3)
    argv, env = server_command(str(PROJECT_ROOT / "model_repository"), http, grpc, metrics)
    log = tmp_path_factory.mktemp("triton") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tritonserver exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if urllib.request.urlopen(f"http://localhost:{http}/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tritonserver not ready after 600 s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield Server(http, grpc, metrics, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if os.environ.get("ADASERVE_KEEP_LOG"):
        print(log.read_text())
