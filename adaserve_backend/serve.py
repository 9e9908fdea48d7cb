"""`make serve`: tritonserver with the model repository, and the OpenAI-compatible frontend in front
of it; stopping this process (Ctrl-C, SIGTERM) stops both. The frontend drains (openai_frontend/drain.py)
for engine.json's drain.grace_s, or --drain-grace-s, and then stops tritonserver, which is started with
a grace of 0: it ends what is left at once rather than granting a second grace.

    python -m adaserve_backend.serve --http-port 8000 --grpc-port 8001 --metrics-port 8002 --openai-port 9000
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from . import PROJECT_ROOT
from .triton.launch import add_server_arguments, triton_server
from .triton.repository import served_drain_grace_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(ap)
    ap.add_argument("--openai-port", type=int, default=9000)
    ap.add_argument("--served-model-name", default="adaserve")
    ap.add_argument("--openai-host", default="127.0.0.1",
                    help="the OpenAI frontend's address (0.0.0.0: every interface)")
    ap.add_argument("--api-key",
                    help="the OpenAI frontend requires `Authorization: Bearer KEY` (default: $ADASERVE_API_KEY)")
    ap.add_argument("--api-keys-file",
                    help="the OpenAI frontend's tenants: hashed keys with their limits (docs/tenants.md)")
    ap.add_argument("--drain-grace-s", type=float,
                    help="on SIGTERM, how long generations in flight may still run (default: engine.json's drain)")
    ap.add_argument("--log", default=str(PROJECT_ROOT / "runs" / "tritonserver.log"), help="tritonserver's log file")
    args = ap.parse_args()
    if args.api_keys_file:  # a bad keys file stops us now, not after tritonserver has loaded the model
        from .openai_frontend.http_app import API_KEY_ENV
        from .openai_frontend.tenancy import repository_tenancy

        repository_tenancy(args.api_keys_file, args.api_key or os.environ.get(API_KEY_ENV), args.model_repository)
    grace_s = args.drain_grace_s if args.drain_grace_s is not None else served_drain_grace_s(args.model_repository)
    server = triton_server(args.http_port, args.grpc_port, args.metrics_port, Path(args.log),
                           Path(args.model_repository),
                           args.host, drain_grace_s=0.0)
    print(f"starting tritonserver (log: {args.log}) ...", flush=True)
    # SIGTERM while tritonserver starts ends this process through `finally` (Python's default would end
    # it at once and leave tritonserver running); once serving, the frontend handles it. Not while the
    # process is being spawned: an exit there would leave a child that `server` does not know of.
    stop_asked = []

    def on_sigterm(*_) -> None:
        if server.proc is None:
            stop_asked.append(True)
        else:
            sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server.spawn()
        if stop_asked:
            sys.exit(128 + signal.SIGTERM)
        server.wait_ready()
        print(f"Triton: HTTP :{args.http_port}, gRPC :{args.grpc_port}, metrics :{args.metrics_port}; "
              f"OpenAI API: http://localhost:{args.openai_port}/v1 (model {args.served_model_name!r})", flush=True)
        from .openai_frontend.http_app import main as frontend

        triton_host = "127.0.0.1" if args.host in ("0.0.0.0", "127.0.0.1") else args.host
        frontend(["--triton-url", f"{triton_host}:{args.grpc_port}",
                  "--triton-metrics-url", f"http://{triton_host}:{args.metrics_port}/metrics",
                  "--port", str(args.openai_port), "--host", args.openai_host,
                  "--served-model-name", args.served_model_name, "--model-repository", args.model_repository,
                  "--drain-grace-s", str(grace_s),
                  *(["--api-key", args.api_key] if args.api_key else []),
                  *(["--api-keys-file", args.api_keys_file] if args.api_keys_file else [])],
                 on_shutdown=server.signal_stop)
    except (RuntimeError, TimeoutError) as e:
        sys.exit(str(e))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
