"""A server child process that is ready when its health URL answers and is always stopped with its
whole process group: tritonserver for `make serve` and the benchmarks, vLLM for the comparison.
`wait_idle` polls the server's Prometheus gauges until nothing is running or waiting, so one load
level never inherits the last one's backlog.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .server import PROJECT_ROOT, server_command


@dataclass
class ServerProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    metrics_url: str
    busy_gauges: tuple[str, ...]  # gauges that are 0 when the server is idle
    log_path: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, timeout_s: float = 900.0) -> ServerProcess:
        self.spawn()
        return self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the process, in a process group of its own (what stop() ends)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=PROJECT_ROOT)

    def wait_ready(self, timeout_s: float = 900.0) -> ServerProcess:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}")
            if _status(self.ready_url) == 200:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}")
            time.sleep(1.0)

    def signal_stop(self) -> None:
        """Ask it to stop (SIGTERM to its process group) without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the group, SIGKILL after `grace_s`; then whatever of the group outlived the
        leader goes too (a Python-backend stub still initializing when tritonserver was stopped
        ignores SIGTERM and would notice its parent's end only much later)."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self._end_group()

    def _end_group(self, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.killpg(self.proc.pid, 0 if time.monotonic() < deadline else signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def wait_idle(self, timeout_s: float = 120.0) -> bool:
        """True once every busy gauge reads 0 (False if still busy at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            values = gauge_values(self.metrics_url, self.busy_gauges)
            if values is not None and not any(values):
                return True
            time.sleep(0.5)
        return False

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError:
        return None


def metrics_text(metrics_url: str) -> str | None:
    """A Prometheus endpoint's exposition text, or None if it does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def gauge_values(metrics_url: str, names: tuple[str, ...]) -> list[float] | None:
    """The sum over labels of each named gauge, or None if the endpoint does not answer."""
    if (text := metrics_text(metrics_url)) is None:
        return None
    sums = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[-1])
    return list(sums.values())


def free_ports(n: int) -> list[int]:
    """`n` ports free on the loopback now (the OS picks them)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def triton_server(http: int, grpc: int, metrics: int, log_path: Path, model_repository: Path | None = None,
                  host: str = "127.0.0.1") -> ServerProcess:
    argv, env = server_command(str(model_repository or PROJECT_ROOT / "model_repository"), http, grpc, metrics, host=host)
    return ServerProcess("adaserve (tritonserver)", argv, env, f"http://localhost:{http}/v2/health/ready",
                         f"http://localhost:{metrics}/metrics", ("adaserve_running_requests", "adaserve_waiting_requests"), log_path)


def openai_frontend(triton_grpc_url: str, port: int, log_path: Path, served_model_name: str = "adaserve") -> ServerProcess:
    """The OpenAI-compatible frontend as its own process in front of a running tritonserver."""
    argv = [sys.executable, "-m", "adaserve_backend.openai_frontend", "--triton-url", triton_grpc_url, "--port", str(port),
            "--served-model-name", served_model_name, "--model-repository", str(PROJECT_ROOT / "model_repository")]
    return ServerProcess("openai frontend", argv, None, f"http://localhost:{port}/health", "", (), log_path)
