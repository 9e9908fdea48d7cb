"""The exit watchdog ends a stopping tritonserver that hangs (here a stand-in named tritonserver that
ignores SIGTERM) and removes its stubs' shared-memory regions; outside Triton it arms nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.triton import exit_watchdog

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's (5.3 and later)")

# The stand-in server: ignores SIGTERM, as a tritonserver waiting on held gRPC streams does, and starts
# one "stub" (with a region name on its command line, as Triton's stubs have) that arms the watchdog.
SERVER = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", STUB, *sys.argv[1:]])
    time.sleep(60)
""")
STUB = textwrap.dedent("""
    import os, sys, time
    from adaserve_backend.triton import exit_watchdog
    print("armed" if exit_watchdog.arm(grace_s=float(sys.argv[2])) else "not armed", os.getpid(), flush=True)
    time.sleep(30)  # alive when the server is killed, as the stub serving held streams is
""")


def stand_in(tmp_path: Path, region: str, grace_s: float) -> subprocess.Popen:
    exe = tmp_path / "tritonserver"  # the process name is the executable's file name
    exe.symlink_to(sys.executable)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    code = f"STUB = {STUB!r}\n{SERVER}"
    return subprocess.Popen([str(exe), "-c", code, region, str(grace_s)], env=env, stdout=subprocess.PIPE, text=True)


def test_a_hanging_server_is_killed_after_the_grace_and_its_regions_removed(tmp_path):
    region = f"{exit_watchdog.REGION_PREFIX}_{uuid.uuid4()}"
    shm = Path(exit_watchdog.SHM_DIR, region)
    shm.write_bytes(b"x")
    server = stand_in(tmp_path, region, grace_s=0.5)
    stub = None
    try:
        armed, stub = server.stdout.readline().split()
        assert armed == "armed"
        server.send_signal(signal.SIGTERM)  # ignored, as the hanging server ignores it
        assert server.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while shm.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not shm.exists()
    finally:
        server.kill()
        if stub:
            os.kill(int(stub), signal.SIGKILL)
        shm.unlink(missing_ok=True)


def test_outside_triton_nothing_is_armed():
    assert exit_watchdog.tritonserver_pid(os.getppid()) is None
    assert exit_watchdog.arm() is False


def test_the_kill_counts_from_the_last_check_that_saw_the_server_serving():
    """A stop noticed late (a slow step, a busy CPU) does not push the exit past the grace and margin from
    the signal, yet the requests the grace ends always get FINAL_ANSWERS_S for their final responses."""
    margin, answers = exit_watchdog.EXIT_MARGIN_S, exit_watchdog.FINAL_ANSWERS_S
    assert exit_watchdog.kill_after_s(0.0, 0.0) == margin
    assert exit_watchdog.kill_after_s(0.0, 1.0) == margin - 1.0
    assert exit_watchdog.kill_after_s(5.0, 1.0) == 5.0 + margin - 1.0
    assert exit_watchdog.kill_after_s(0.0, 60.0) == answers  # noticed very late: the final answers first
    assert exit_watchdog.kill_after_s(5.0, 60.0) == 5.0 + answers
    assert exit_watchdog.kill_after_s(0.0, -1.0) == margin  # a clock step back counts as no delay


def test_the_probe_remembers_when_it_last_saw_the_server_serving(monkeypatch):
    from adaserve_backend.triton import shutdown_probe
    from tests import fake_pb

    monkeypatch.setattr(shutdown_probe, "CHECK_EVERY_S", 0.0)
    probe = shutdown_probe.ShutdownProbe(fake_pb, "adaserve")
    assert probe.noticed_late_s() == 0.0  # never seen serving
    assert not probe.stopping()
    seen = probe.last_served_at
    assert seen is not None and 0.0 <= probe.noticed_late_s() < 5.0
    monkeypatch.setattr(fake_pb, "SERVER_READY", False)
    assert probe.stopping() and probe.server_stopped
    assert probe.last_served_at == seen  # the stop came after the last check that saw it serving
