"""A server child process that is ready when its health URL answers and is always stopped with its
whole process group: tritonserver for `make serve` (triton/launch.py), and every server a benchmark
starts (harness/servers.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import PROJECT_ROOT


@dataclass
class ServerProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    metrics_url: str
    busy_gauges: tuple[str, ...]  # gauges that are 0 when the server is idle (harness.servers.wait_idle)
    log_path: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, timeout_s: float = 900.0) -> ServerProcess:
        self.spawn()
        return self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the process, in a process group of its own (what stop() ends)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=PROJECT_ROOT)

    def wait_ready(self, timeout_s: float = 900.0) -> ServerProcess:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log "
                                   f"{self.log_path}:\n{self.log_tail()}")
            if _status(self.ready_url) == 200:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; log "
                                   f"{self.log_path}:\n{self.log_tail()}")
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
