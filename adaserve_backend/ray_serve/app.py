"""`make serve-ray REPLICAS=N`: N engine replicas on Ray Serve behind an SLO-aware router, and the
OpenAI frontend (the same one `make serve` runs) in this process, their only ingress.

    python -m adaserve_backend.ray_serve --replicas 2 --threads 1 --router slo --port 9000
    python -m adaserve_backend.ray_serve --address auto ...     # replicas on a running Ray cluster

docs/ray-serve.md has the multi-node and Kubernetes (KubeRay) recipes.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from ..config import EngineConfig
from ..models import load_tokenizer, locate
from ..openai_frontend.http_app import API_KEY_ENV, MAX_IN_FLIGHT, Frontend, serve_frontend
from ..openai_frontend.logprobs import Renderer
from ..openai_frontend.served_prompts import chat_renderer, context_room
from ..openai_frontend.service_tiers import tier_classes
from ..openai_frontend.tenancy import load_tenancy
from .backend import APP_NAME, RayBackend
from .replica import EngineReplica
from .router import ROUTERS

log = logging.getLogger("adaserve.ray")
SERVED_ENGINE_CONFIG = "model_repository/adaserve/1/engine.json"
MAX_ONGOING = 512  # calls a replica takes at once: its engine's own admission (max_waiting) answers first
STATS_PERIOD_S = 0.25  # how often replicas publish their load; the router charges its own sends in between
HEALTH_PERIOD_S = 2.0


def deploy(engine_config: str, replicas: int, threads: int | None, router: str, stats_period_s: float = STATS_PERIOD_S,
           record_routing: str | None = None):
    """Start Serve without an HTTP proxy (the frontend is the ingress) and the engine deployment;
    returns its handle once every replica is up."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    serve.start(proxy_location="Disabled")
    deployment = serve.deployment(EngineReplica, name="engine").options(
        num_replicas=replicas, max_ongoing_requests=MAX_ONGOING, health_check_period_s=HEALTH_PERIOD_S,
        graceful_shutdown_timeout_s=5, ray_actor_options={"num_cpus": threads or 1},
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTERS[router], request_routing_stats_period_s=stats_period_s,
            request_router_kwargs={"record": os.path.abspath(record_routing)} if record_routing else {}))
    return serve.run(deployment.bind(os.path.abspath(engine_config), threads), name=APP_NAME, route_prefix=None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (and Ray CPUs) per replica")
    ap.add_argument("--router", choices=sorted(ROUTERS), default="slo")
    ap.add_argument("--engine-config", default=SERVED_ENGINE_CONFIG)
    ap.add_argument("--address", default=None,
                    help="a running Ray cluster (auto, or ray://host:port); default: start one here")
    ap.add_argument("--host", default="127.0.0.1", help="the frontend's address (0.0.0.0: every interface)")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                    help=f"as the OpenAI frontend's (default: ${API_KEY_ENV})")
    ap.add_argument("--api-keys-file", help="as the OpenAI frontend's: tenants with their limits (docs/tenants.md)")
    ap.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT)
    ap.add_argument("--served-model-name", default="adaserve")
    ap.add_argument("--record-routing", default=None, metavar="PATH",
                    help="append each routing decision and the loads it was made from to PATH (JSON lines; slo router)")
    args = ap.parse_args(argv)
    if args.replicas < 1 or (args.threads is not None and args.threads < 1):
        ap.error("--replicas and --threads must be >= 1")
    if args.record_routing and args.router != "slo":
        ap.error("--record-routing records the slo router's decisions")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import ray
    from ray import serve

    config = EngineConfig.from_json(args.engine_config)  # loudly, before any replica starts
    tenancy = load_tenancy(args.api_keys_file, args.api_key, config.scheduler)
    tokenizer = load_tokenizer(locate(config.target.path))
    # Ray starts its workers at niceness 15, behind everything else on the machine; an engine replica
    # is the server's foreground work (a cluster started elsewhere sets this itself).
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address=args.address, include_dashboard=False, log_to_driver=True)
    try:
        handle = deploy(args.engine_config, args.replicas, args.threads, args.router,
                        record_routing=args.record_routing)
        backend = RayBackend(handle, tokenizer, config.scheduler, config.target_cache.block_size)
        frontend = Frontend(backend, args.served_model_name, chat_renderer(tokenizer), args.api_key or None,
                            args.max_in_flight, tenancy, context_room(tokenizer, config.target.max_model_len),
                            Renderer.of(tokenizer), tier_classes(config.scheduler.slo_classes,
                                                                        config.scheduler.service_tiers),
                            config.target.max_model_len)
        serve_frontend(frontend, args.host, args.port, on_shutdown=backend.stop, drain_grace_s=config.drain.grace_s)
    finally:
        started = time.monotonic()
        if args.address is not None:  # a cluster that outlives us: take our application off it
            serve.delete(APP_NAME)
        ray.shutdown()  # a cluster started here goes with it, replicas included
        log.info("Ray stopped in %.1f s", time.monotonic() - started)
