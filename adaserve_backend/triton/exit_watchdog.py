"""Ends a stopping tritonserver that cannot end itself, within a bound, however it was started.

Why: Triton's gRPC frontend stops without a deadline, and its per-stream state keeps each request (and
so the model that served it) alive until the client closes the stream. A client that holds its stream
open, as one that multiplexes requests over a stream does, therefore keeps a SIGTERMed tritonserver
alive forever: every model has answered ("the server is shutting down") and unloaded, Triton logs that
its exit timeout expired, and the process stays (docs/triton.md#shutdown). `docker stop`
and Kubernetes then kill it after their own grace period, with no say in when.

What: once the scheduler model sees the *server* stopping (shutdown_probe: "Server not ready", never a
model unload, when the server goes on serving), it arms this watchdog. A detached process holds a pidfd
of tritonserver (so a recycled pid is never hit) and waits the drain's grace (config/drain.py: the
requests in flight may still finish) and then EXIT_MARGIN_S, both counted from the last check that
still saw the server serving (`kill_after_s`); if the server is still there it
kills it (SIGKILL: SIGTERM is what it is already ignoring), then removes the shared-memory regions of
the server's Python backend stubs, which a killed server leaves in /dev/shm. A server that exits in
time is left alone. A server that is its PID namespace's init (a container's PID 1) cannot be killed
from inside the namespace (pid_namespaces(7)): the Docker image runs it under docker/entrypoint.sh.
"""

from __future__ import annotations

import glob
import logging
import os
import select
import signal
import time

log = logging.getLogger("adaserve")

# From the end of the drain's grace: every stream has had its final response within a serving check
# (shutdown_probe.CHECK_EVERY_S) and a step, and Triton's own orderly exit (unloading the models, then its
# once-a-second check for live ones) takes a few seconds, so a server still there after this is one
# that waits on clients. With the default grace, the kill comes inside `docker stop`'s 10 s.
EXIT_MARGIN_S = 4.0
# The least time between the end of the grace, as the scheduler model counts it (from when it noticed
# the stop), and the kill: the requests the grace ends send their final responses in it.
FINAL_ANSWERS_S = 1.0
STUB_EXIT_S = 2.0  # how long the stubs take to notice their parent is gone and exit
SHM_DIR = "/dev/shm"
REGION_PREFIX = "triton_python_backend_shm_region"


def tritonserver_pid(pid: int) -> int | None:
    """`pid` if it is a tritonserver (this stub's parent), else None."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return pid if f.read().strip() == "tritonserver" else None
    except OSError:
        return None


def _parent_of(stat_path: str) -> int | None:
    try:
        with open(stat_path) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
    except (OSError, ValueError, IndexError):
        return None


def stub_regions(server: int) -> list[str]:
    """The shared-memory regions of the server's Python backend stubs: each stub is started with its
    region's name on its command line."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        if _parent_of(stat) != server:
            continue
        try:
            with open(stat[: -len("stat")] + "cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        out += [a.decode() for a in args if a.startswith(REGION_PREFIX.encode()) and b"/" not in a]
    return out


def _watch(pidfd: int, server: int, grace_s: float) -> None:
    """The watchdog's body (in the detached process): only system calls, no locks another thread of
    the forked stub might have held."""
    if select.select([pidfd], [], [], grace_s)[0]:
        return  # the server exited by itself
    regions = stub_regions(server)
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    select.select([pidfd], [], [], STUB_EXIT_S)
    time.sleep(STUB_EXIT_S)
    for name in regions:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass  # the stub removed it, or it was never there


def kill_after_s(drain_grace_s: float, noticed_late_s: float) -> float:
    """Seconds from now to the kill: the drain's grace and EXIT_MARGIN_S counted from when the stop could
    first have happened, `noticed_late_s` ago (the last check that still saw the server serving), so a
    slow step or a busy CPU between the signal and the notice does not push the exit past them; but
    never less than the grace plus FINAL_ANSWERS_S from now (the grace the requests get runs from now)."""
    return max(drain_grace_s + EXIT_MARGIN_S - max(noticed_late_s, 0.0), drain_grace_s + FINAL_ANSWERS_S)


def arm(grace_s: float = EXIT_MARGIN_S) -> bool:
    """Start the watchdog for this stub's tritonserver, to kill it `grace_s` from now; False where there
    is none to watch (the engine runs outside Triton, or on a system without pidfds)."""
    server = tritonserver_pid(os.getppid())
    if server is None or not hasattr(os, "pidfd_open"):
        return False
    try:
        pidfd = os.pidfd_open(server)
    except OSError:
        return False
    child = os.fork()
    if child == 0:  # double fork: the watchdog is nobody's child to reap, in its own session
        try:
            os.setsid()
            if os.fork() == 0:
                _watch(pidfd, server, grace_s)
        finally:
            os._exit(0)
    os.close(pidfd)
    os.waitpid(child, 0)
    log.info("exit watchdog armed: tritonserver %d is killed if still running %.1f s from now", server, grace_s)
    return True
