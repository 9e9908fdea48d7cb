"""Start a real `tritonserver` (the one shipped in the nvidia-pytriton wheel) on a model repository,
in the foreground (`main`) or as a child process (`triton_server`, for `make serve` and the benchmarks).

    python -m adaserve_backend.triton.launch --model-repository model_repository \
        --http-port 8000 --grpc-port 8001 --metrics-port 8002

It puts the wheel's shared libraries on LD_LIBRARY_PATH, installs the Python backend stub that matches
this interpreter, and makes this project and its virtual environment importable by the Python models
(PYTHONPATH, read through stub_path.py since the stub's interpreter ignores the environment).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import site
import sys
from pathlib import Path

from .. import PROJECT_ROOT
from ..child_process import ServerProcess
from . import exit_watchdog
from .repository import DRAIN_GRACE_ENV, served_drain_grace_s


def pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("tritonserver comes from the nvidia-pytriton wheel: pip install nvidia-pytriton==0.7.0")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


STUB_PATH_MODULE = "adaserve_stub_path.py"  # see stub_path.py for why the models need it


def backend_directory() -> Path:
    """The wheel's backends, with the Python stub for this interpreter's version in place, and beside it
    the module through which every model finds this project and its virtual environment."""
    root = pytriton_root()
    backends = root / "backends"
    stub = backends / "python" / "triton_python_backend_stub"
    wanted = root / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / stub.name
    if not wanted.exists():
        raise FileNotFoundError(f"no Python backend stub for Python {sys.version_info.major}.{sys.version_info.minor}")
    if not stub.exists() or stub.stat().st_size != wanted.stat().st_size:
        shutil.copy2(wanted, stub)
    helper, source = backends / "python" / STUB_PATH_MODULE, Path(__file__).with_name("stub_path.py")
    if not helper.exists() or helper.read_bytes() != source.read_bytes():
        shutil.copyfile(source, helper)
    return backends


def server_environment() -> dict[str, str]:
    """This environment without an active virtual environment's `bin` on PATH. Why: the stub embeds the
    system's libpython and sets its prefix from the first `python3` on PATH; an activated venv's python3
    reads pyvenv.cfg and points the stub at another build's standard library, whose C modules fail to
    load against the system's libpython (the failure: `_ssl ... undefined symbol: _PyModule_Add`). The venv
    reaches the models through PYTHONPATH instead (stub_path.py)."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    # Two malloc arenas rather than glibc's 8 per core: each thread that allocates while another holds
    # an arena gets one of its own (64 MB regions), and what they free stays in them, so the engine
    # stub's memory climbed in steps under load (docs/benchmarking.md#a-soak-make-soak). A user's own value wins.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    if sys.prefix != sys.base_prefix:
        venv_bin = Path(sys.prefix).resolve() / "bin"
        path = [d for d in env.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != venv_bin]
        env["PATH"] = os.pathsep.join(path)
    return env


# Triton waits for in-flight requests once it is told to stop, up to its exit timeout, and then exits
# at once, cutting off what is still generating. So the timeout is the drain's grace (config/drain.py)
# plus this: the models end what is left within a serving check (shutdown_probe.CHECK_EVERY_S) and a
# step of the engine, and unload in a few seconds. Longer than the exit watchdog's margin, so that with
# streams held open the watchdog ends the process, not Triton's exit at once (which has crashed on its
# way out, SIGSEGV, when a starved CPU delayed the watchdog). Triton's own default of 30 s only
# prolonged a shutdown whose requests were already gone.
EXIT_MARGIN_S = math.ceil(exit_watchdog.EXIT_MARGIN_S) + 4  # whole seconds: Triton takes an integer


def exit_timeout_s(drain_grace_s: float) -> int:
    return math.ceil(drain_grace_s) + EXIT_MARGIN_S


def server_command(
    model_repository: str, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002, log_verbose: int = 0,
    host: str = "127.0.0.1", drain_grace_s: float | None = None,
) -> tuple[list[str], dict[str, str]]:
    """`host`: the address all three endpoints listen on (the loopback by default: the OpenAI frontend,
    with its API key, is what other machines should reach). `drain_grace_s`: instead of engine.json's
    drain.grace_s (`make serve` passes 0: its frontend drains)."""
    root = pytriton_root()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = server_environment()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None,
                                               [str(PROJECT_ROOT), *site.getsitepackages(), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if drain_grace_s is None:
        drain_grace_s = served_drain_grace_s(model_repository)
    else:
        env[DRAIN_GRACE_ENV] = str(drain_grace_s)
    argv = [
        str(root / "bin" / "tritonserver"),
        f"--model-repository={os.path.abspath(model_repository)}",
        f"--backend-directory={backend_directory()}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        f"--http-address={host}",
        f"--grpc-address={host}",
        f"--metrics-address={host}",
        f"--exit-timeout-secs={exit_timeout_s(drain_grace_s)}",
        "--allow-metrics=true",
        f"--log-verbose={log_verbose}",
    ]
    return argv, env


def add_server_arguments(ap: argparse.ArgumentParser) -> None:
    """The repository and ports, for every command that starts tritonserver."""
    ap.add_argument("--model-repository", default=str(PROJECT_ROOT / "model_repository"))
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--host", default="127.0.0.1", help="the address Triton's endpoints listen on")


def triton_server(http: int, grpc: int, metrics: int, log_path: Path, model_repository: Path | None = None,
                  host: str = "127.0.0.1", drain_grace_s: float | None = None) -> ServerProcess:
    argv, env = server_command(str(model_repository or PROJECT_ROOT / "model_repository"), http,
                               grpc, metrics, host=host, drain_grace_s=drain_grace_s)
    return ServerProcess("adaserve (tritonserver)", argv, env, f"http://localhost:{http}/v2/health/ready",
                         f"http://localhost:{metrics}/metrics",
                         ("adaserve_running_requests", "adaserve_waiting_requests"), log_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(ap)
    ap.add_argument("--log-verbose", type=int, default=0)
    args = ap.parse_args()
    argv, env = server_command(args.model_repository, args.http_port, args.grpc_port,
                               args.metrics_port, args.log_verbose,
                               args.host)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
