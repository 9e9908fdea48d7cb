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
