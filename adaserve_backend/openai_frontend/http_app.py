"""An OpenAI-compatible HTTP frontend: `/v1/completions` and `/v1/chat/completions` (streaming SSE and
not), `/v1/models`, `/health`, in front of a backend (backends.py): Triton's `adaserve` model, each request
one gRPC stream to it, or engine replicas on Ray Serve (adaserve_backend/ray_serve).

    python -m adaserve_backend.openai_frontend --triton-url localhost:8001 --port 9000

Why aiohttp: it is already installed with `tritonclient[all]`, streams responses natively on the same
asyncio loop as Triton's aio gRPC client, and with handler cancellation a client that disconnects
cancels its handler, which closes the backend's stream, which aborts the request and frees its KV
cache in the engine (streaming or not).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import logging
import os
from collections.abc import Callable

from aiohttp import web

from .backends import RETRY_AFTER_S, Backend, BackendError, http_error
from .bodies import DONE, Tally, sse
from .body_json import check_json_type, read_json
from .choices import Choices, choice_generation
from .drain import DEFAULT_GRACE_S, Drain, serve
from .field_readers import OpenAIError, shown
from .logprobs import Renderer, echo_text
from .params import Generation, parse
from .served_prompts import chat_prompt, chat_renderer, context_room, served_tokenizer
from .service_tiers import repository_tiers, served_tier, with_tier
from .tenancy import Tenancy, repository_tenancy

log = logging.getLogger("adaserve.openai")
MAX_BODY_BYTES = 4 * 2**20  # a prompt past the model's context is refused later anyway; aiohttp answers 413
API_KEY_ENV = "ADASERVE_API_KEY"
OPEN_PATHS = ("/health", "/metrics")  # answered without the API key (a load balancer's probe, a scraper)
IN_FLIGHT_GAUGE = "adaserve_frontend_requests_in_flight"
BODY_READ_S = 30.0  # a client that has not sent its whole body by then gets a 408 (slow-loris bodies)
WRITE_IDLE_S = 30.0  # a streaming client that takes no event for this long is gone: its request is aborted
IDLE_CONNECTION_S = 30.0  # a connection without a whole request's headers by then is closed (aiohttp's keep-alive)
MAX_IN_FLIGHT = 512  # generations at once; beyond, 503 (the engine's own caps answer well before this)


class Frontend:
    def __init__(self, backend: Backend, model_name: str, render_chat: Callable[[tuple[dict, ...]], str],
                 api_key: str | None = None, max_in_flight: int = MAX_IN_FLIGHT,
                 tenancy: Tenancy | None = None, context_room: Callable[[str], int] | None = None,
                 logprob_renderer: Renderer | None = None, tiers: dict[str, str] | None = None,
                 max_model_len: int | None = None) -> None:
        """`context_room`: tokens a rendered prompt leaves in the model's context (None: not known here);
        `logprob_renderer`: how token ids read in logprobs (None: requests for logprobs get a 400)."""
        self.max_model_len = max_model_len  # the model card's, as vLLM's names it
        self.backend, self.model_name, self.render_chat = backend, model_name, render_chat
        self.logprob_renderer, self.tiers = logprob_renderer, tiers or {}  # service_tiers.tier_classes
        self.context_room = context_room
        self.api_key, self.max_in_flight = api_key, max_in_flight
        self.tenancy = tenancy  # --api-keys-file: every key a tenant's (tenancy.py); not with api_key
        self.in_flight = 0
        self.drain = Drain()  # serve_frontend sets its grace

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=MAX_BODY_BYTES)
        app.add_routes([web.get("/health", self.health), web.get("/metrics", self.metrics),
                        web.get("/v1/models", self.models), web.get("/v1/models/{model:.+}", self.model),
                        web.post("/v1/completions", self.completions), web.post("/v1/chat/completions", self.chat)])
        app.on_startup.append(self._connect)
        app.on_cleanup.append(self._disconnect)
        return app

    async def _connect(self, app: web.Application) -> None:
        await self.backend.connect()

    async def _disconnect(self, app: web.Application) -> None:
        await self.backend.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """Every error in OpenAI's JSON shape: ours, aiohttp's own (404, 405, 413...), and a failure,
        which the client sees as a 500 without its internal text (the log keeps the traceback)."""
        try:
            return await handler(request)
        except OpenAIError as e:
            headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s is not None else None
            return web.json_response(e.body(), status=e.status, headers=headers)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            kind = {401: "authentication_error", 404: "not_found_error"}.get(e.status, "invalid_request_error")
            return web.json_response(OpenAIError(e.status, e.reason, kind=kind).body(), status=e.status,
                                     headers={k: v for k, v in e.headers.items() if k in ("Allow", "Retry-After")})
        except Exception:
            log.exception("request failed: %s %s", request.method, request.path)
            return web.json_response(OpenAIError(500, "internal error", kind="internal_error").body(), status=500)

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        """With an API key, every path but OPEN_PATHS needs `Authorization: Bearer <key>` (compared in
        constant time, as vLLM and llama.cpp do); with tenants, a key of theirs (tenancy.py)."""
        if self.tenancy is not None and request.path not in OPEN_PATHS:
            return await self.tenancy.guard(request, handler)
        if self.api_key and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                raise OpenAIError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                  kind="authentication_error")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        why = "shutting down" if self.drain.draining else await self.backend.unhealthy()
        return web.Response(status=503, text=why) if why else web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        """The frontend's own gauge (the engines' metrics are Triton's, :8002): generations in flight."""
        text = f"# TYPE {IN_FLIGHT_GAUGE} gauge\n{IN_FLIGHT_GAUGE} {self.in_flight}\n"
        return web.Response(text=text + (self.tenancy.metrics_text() if self.tenancy is not None else ""))

    def _model_card(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "adaserve", "root": self.model_name}
        return card | ({"max_model_len": self.max_model_len} if self.max_model_len else {})  # as vLLM's card

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        """`GET /v1/models/{id}`: the served model, or OpenAI's 404 for any other."""
        name = request.match_info["model"]
        if name != self.model_name:
            raise OpenAIError(404, f"The model {shown(name)} does not exist.", "model", kind="not_found_error")
        return web.json_response(self._model_card())

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.drain.refuse_new()
        self._check_room(1)
        self.in_flight += 1
        try:
            return await self._generate_one(request, endpoint)
        finally:
            self.in_flight -= 1

    def _check_room(self, generations: int) -> None:
        """503 with Retry-After unless `generations` more fit under --max-in-flight now."""
        if self.in_flight + generations > self.max_in_flight:
            raise OpenAIError(503, f"{self.in_flight} generations are in flight already", kind="server_overloaded",
                              retry_after_s=RETRY_AFTER_S)

    async def _generate_one(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        try:
            raw = await asyncio.wait_for(request.read(), BODY_READ_S)
        except TimeoutError:
            raise OpenAIError(408, f"the request body did not arrive within {BODY_READ_S:g} s") from None
        check_json_type(request.headers.get("Content-Type"))
        body = read_json(raw)
        gen = with_tier(parse(body, endpoint, request.headers), self.tiers)
        if gen.logprobs is not None and self.logprob_renderer is None:
            raise OpenAIError(400, "logprobs are not available from this frontend", "logprobs")
        if body.get("model") not in (None, self.model_name):
            raise OpenAIError(404, f"The model {shown(body['model'])} does not exist.", "model", kind="not_found_error")
        if gen.generations > self.max_in_flight:  # every choice is a generation: this one would never fit
            raise OpenAIError(400, f"this request's {gen.generations} generations (n choices of each prompt) are "
                              f"more than this server runs at once ({self.max_in_flight})", "n")
        self._check_room(gen.generations - 1)
        prompts = (chat_prompt(self.render_chat, gen),) if gen.messages is not None else gen.prompts
        if not gen.max_tokens_given and self.context_room is not None:
            # a chat that left its length open gets the default or what the context leaves, whichever is
            # less (as OpenAI and vLLM), not a 400 for a long prompt; no room at all is still the engine's 400
            room = self.context_room(prompts[0])
            if room >= 1:
                gen = dataclasses.replace(gen, **open_length(gen, room))
        tally = Tally(endpoint, self.model_name, gen.runs, len(prompts), include_usage=gen.stream and gen.include_usage,
                      continuous_usage=gen.stream and gen.continuous_usage,
                      logprobs=self.logprob_renderer if gen.logprobs is not None else None,
                      score_only=gen.max_tokens == 0, service_tier=served_tier(gen.service_tier), tools=gen.tools)
        if gen.echo:
            tally.echo([echo_text(p, self.logprob_renderer) for p in prompts])
        if self.tenancy is not None:  # the key's tenant, its SLO bounds and limits; its tokens charged at the end
            gen = self.tenancy.admit(request, gen, tally)
        ranked = dataclasses.replace(gen, logprobs=0) if gen.best_of > gen.n and gen.logprobs is None else gen
        choices = Choices([self.backend.stream(choice_generation(ranked, i), p) for p in prompts
                           for i in range(gen.runs)], self.drain.guard)  # nothing runs until the first `next`
        self.in_flight += gen.generations - 1
        try:
            first = await self._next(choices, tally)  # errors before any output become plain HTTP errors
            if not gen.stream:
                while first is not None:
                    first = await self._next(choices, tally)
                if gen.best_of > gen.n:
                    tally.keep_best(gen.n)
                return web.json_response(tally.whole())
            return await self._sse(request, gen, choices, tally, first)
        finally:
            self.in_flight -= gen.generations - 1
            await choices.aclose()  # a disconnected client lands here too: the backend then aborts the requests

    async def _next(self, choices: Choices, tally: Tally) -> tuple[int, str | None] | None:
        """The next (choice, text delta) ("" for a response without text, None once the choice ended),
        None once every choice has."""
        try:
            item = await choices.next()
        except BackendError as e:
            raise http_error(e) from None
        if item is None:
            return None
        index, text, extra = item
        return index, tally.take(index, text, extra)

    async def _sse(self, request: web.Request, gen: Generation, choices: Choices, tally: Tally,
                   item: tuple[int, str | None] | None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            try:
                while item is not None:
                    index, delta = item
                    reason = tally.choices[index].finish_reason or "stop" if delta is None else None  # None: ended
                    for chunk in tally.chunks(delta, reason, index):
                        await send(resp, sse(chunk))
                    item = await self._next(choices, tally)
                if gen.include_usage:
                    await send(resp, sse(tally.usage_chunk()))
            except OpenAIError as e:  # after the headers went out, an error travels as an event
                await send(resp, sse(e.body()))
            await send(resp, DONE)
            await resp.write_eof()
        except TimeoutError:  # the caller's finally aborts the requests in Triton, which frees their KV cache
            log.warning("a client took no event for %g s: dropping its stream", WRITE_IDLE_S)
            if request.transport is not None:
                request.transport.abort()
        except ConnectionResetError:  # the client closed its connection: nobody to tell, nothing failed here
            log.debug("a client closed its stream of %s", request.path)
        return resp


def open_length(gen: Generation, room: int) -> dict[str, int]:
    """A chat's open default cut to `room`. `ignore_eos` ties min_tokens to the length, so that shrinks
    with it; a min_tokens the client asked for is never lowered (past the room, the engine refuses it)."""
    max_tokens = min(gen.max_tokens, room)
    if gen.min_tokens == gen.max_tokens:
        return {"max_tokens": max_tokens, "min_tokens": max_tokens}
    return {"max_tokens": max(max_tokens, gen.min_tokens)}


async def send(resp: web.StreamResponse, data: bytes) -> None:
    """One event; TimeoutError if the client has not taken it within WRITE_IDLE_S (its socket buffers
    are full because it stopped reading, without closing the connection)."""
    await asyncio.wait_for(resp.write(data), WRITE_IDLE_S)


SHUTDOWN_TIMEOUT_S = 5.0  # what a stopping frontend waits for its handlers after the drain (aiohttp's: 60 s)


def main(argv: list[str] | None = None, on_shutdown: Callable[[], None] | None = None) -> None:
    """`on_shutdown`: called once the drain is over (drain.py), before the handlers are waited for
    (`make serve` stops tritonserver there: its models then end what is left, which ends the handlers)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--triton-url", default="localhost:8001", help="Triton gRPC host:port")
    ap.add_argument("--triton-model", default="adaserve",
                    help="the Triton model served: `adaserve` (one hop each way) or `ensemble` (the same inputs)")
    ap.add_argument("--triton-metrics-url", help="Triton's metrics, e.g. http://localhost:8002/metrics: /health then "
                    "also reports an engine that stopped running")
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                    help=f"require `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; none: no key)")
    ap.add_argument("--api-keys-file", help="tenants: hashed API keys, each with its SLO bounds and limits "
                    "(docs/tenants.md); not with --api-key")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT, help="generations at once; beyond, 503")
    ap.add_argument("--served-model-name", default="adaserve", help="the `model` clients name")
    ap.add_argument("--model-repository", default="model_repository", help="for the chat template")
    ap.add_argument("--drain-grace-s", type=float, default=DEFAULT_GRACE_S,
                    help="on SIGTERM, how long generations in flight may still run (new ones get 503)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from .triton_backend import TritonBackend  # here: the Ray app serves this module without Triton

    backend = TritonBackend(args.triton_url, args.triton_metrics_url, args.triton_model)
    tenancy = repository_tenancy(args.api_keys_file, args.api_key, args.model_repository)  # loudly, before serving
    tokenizer, max_model_len = served_tokenizer(args.model_repository)
    frontend = Frontend(backend, args.served_model_name, chat_renderer(tokenizer), args.api_key or None,
                        args.max_in_flight, tenancy, context_room(tokenizer, max_model_len), Renderer.of(tokenizer),
                        repository_tiers(args.model_repository), max_model_len)
    serve_frontend(frontend, args.host, args.port, on_shutdown, args.drain_grace_s)


def serve_frontend(frontend: Frontend, host: str, port: int, on_shutdown: Callable[[], None] | None = None,
                   drain_grace_s: float = DEFAULT_GRACE_S) -> None:
    """Run the frontend's application until stopped (SIGINT / SIGTERM), then drain (drain.py)."""
    frontend.drain = Drain(drain_grace_s)
    serve(frontend.app(), host, port, frontend.drain, lambda: frontend.in_flight, on_shutdown,
          handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S, keepalive_timeout=IDLE_CONNECTION_S)
