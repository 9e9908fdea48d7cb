"""An OpenAI-compatible HTTP frontend in front of the Triton `ensemble`: `/v1/completions` and
`/v1/chat/completions` (streaming SSE and not), `/v1/models`, `/health`. The engine stays inside
Triton; each request becomes one gRPC stream to the ensemble.

    python -m adaserve_backend.openai_frontend --triton-url localhost:8001 --port 9000

Why aiohttp: it is already installed with `tritonclient[all]`, streams responses natively on the same
asyncio loop as Triton's aio gRPC client, and with handler cancellation a client that disconnects
cancels its handler, which closes the gRPC stream, which makes Triton abort the request and the engine
free its KV cache (streaming or not).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable

import numpy as np
from aiohttp import web

from ..triton.grpc_client import EnsembleClient, EnsembleError, ensemble_tensors
from .params import Generation, OpenAIError, parse
from .responses import DONE, Tally, sse

log = logging.getLogger("adaserve.openai")
RETRY_AFTER_S = 1


def error_from_ensemble(e: EnsembleError) -> OpenAIError:
    """By the gRPC status alone (the models send each error with its code): bad input -> 400, the
    scheduler's overload answer or a stopping server -> 503 with Retry-After, anything else -> 500."""
    if e.status == "INVALID_ARGUMENT":
        return OpenAIError(400, e.message)
    if e.status in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"):
        return OpenAIError(503, e.message, kind="server_overloaded", retry_after_s=RETRY_AFTER_S)
    if e.status == "NOT_FOUND":
        return OpenAIError(404, e.message, kind="not_found_error")
    return OpenAIError(500, e.message, kind="internal_error")


def ensemble_request(gen: Generation, prompt: str, supported: set[str]) -> dict[str, np.ndarray]:
    extra = {"top_p": np.array([gen.top_p], dtype=np.float32), "top_k": np.array([gen.top_k], dtype=np.int32),
             "min_tokens": np.array([gen.min_tokens], dtype=np.int32), "return_num_input_tokens": np.array([True])}
    if gen.stop:
        extra["stop_words"] = np.array([s.encode() for s in gen.stop], dtype=object)
    if gen.slo.ttft_ms is not None and "ttft_slo_ms" not in supported:  # an older model repository: never ignore a target
        raise OpenAIError(400, "ttft_slo_ms is not supported by this server's scheduler", "ttft_slo_ms")
    return ensemble_tensors(prompt, gen.max_tokens, stream=True, tpot_slo_ms=gen.slo.tpot_ms, ttft_slo_ms=gen.slo.ttft_ms,
                            slo_class=gen.slo.slo_class, temperature=gen.temperature, seed=gen.seed, chat=False, extra=extra)


class Frontend:
    def __init__(self, triton_url: str, model_name: str, render_chat: Callable[[tuple[dict, ...]], str]) -> None:
        self.triton_url, self.model_name, self.render_chat = triton_url, model_name, render_chat
        self.ensemble: EnsembleClient | None = None
        self.inputs: set[str] | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors])
        app.add_routes([web.get("/health", self.health), web.get("/v1/models", self.models),
                        web.post("/v1/completions", self.completions), web.post("/v1/chat/completions", self.chat)])
        app.on_startup.append(self._connect)
        app.on_cleanup.append(self._disconnect)
        return app

    async def _connect(self, app: web.Application) -> None:
        # grpc.aio channels belong to the event loop they are made on: make it on the server's loop.
        self.ensemble = EnsembleClient(self.triton_url)

    async def _disconnect(self, app: web.Application) -> None:
        await self.ensemble.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except OpenAIError as e:
            headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s is not None else None
            return web.json_response(e.body(), status=e.status, headers=headers)

    async def health(self, request: web.Request) -> web.Response:
        ok = await self.ensemble.is_ready()
        return web.Response(status=200 if ok else 503, text="ok" if ok else "the Triton ensemble is not ready")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "adaserve"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OpenAIError(400, "the request body is not valid JSON") from None
        gen = parse(body, endpoint, request.headers)
        if body.get("model") not in (None, self.model_name):
            raise OpenAIError(404, f"The model `{body['model']}` does not exist.", "model", kind="not_found_error")
        if self.inputs is None:
            self.inputs = await self.ensemble.input_names()
        prompt = self.render_chat(gen.messages) if gen.messages is not None else gen.prompt
        tally = Tally(endpoint, self.model_name)
        stream = self.ensemble.stream_tensors(ensemble_request(gen, prompt, self.inputs))
        try:
            first = await self._next(stream, tally)  # errors before any output become plain HTTP errors
            if not gen.stream:
                while first is not None:
                    first = await self._next(stream, tally)
                return web.json_response(tally.whole())
            return await self._sse(request, gen, stream, tally, first)
        finally:
            await stream.aclose()  # a disconnected client lands here too: Triton then aborts the request

    async def _next(self, stream, tally: Tally) -> str | None:
        """The next text delta ("" for a response without text), None at the end."""
        try:
            text, extra = await anext(stream)
        except StopAsyncIteration:
            return None
        except EnsembleError as e:
            raise error_from_ensemble(e) from None
        tally.text += text
        if "num_input_tokens" in extra:
            tally.prompt_tokens = int(extra["num_input_tokens"])
        if "num_output_tokens" in extra:
            tally.completion_tokens = int(extra["num_output_tokens"])
        if "finish_reason" in extra:
            reason = extra["finish_reason"]
            tally.finish_reason = (reason.decode() if isinstance(reason, bytes) else str(reason)) or None
        return text

    async def _sse(self, request: web.Request, gen: Generation, stream, tally: Tally, delta: str | None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        first = True
        try:
            while delta is not None:
                if delta or (first and tally.chat):
                    await resp.write(sse(tally.chunk(delta, first=first)))
                    first = False
                delta = await self._next(stream, tally)
            await resp.write(sse(tally.chunk(finish_reason=tally.finish_reason or "stop")))
            if gen.include_usage:
                await resp.write(sse(tally.usage_chunk()))
        except OpenAIError as e:  # after the headers went out, an error travels as an event
            await resp.write(sse(e.body()))
        await resp.write(DONE)
        await resp.write_eof()
        return resp


def tokenizer_chat_renderer(model_repository: str) -> Callable[[tuple[dict, ...]], str]:
    """Chat messages -> prompt text with the served model's own chat template (the tokenizer the
    ensemble's preprocessing uses)."""
    import os

    from ..triton.repository import load_repository_tokenizer

    tokenizer = load_repository_tokenizer(os.path.join(model_repository, "preprocessing"))
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit("the served model has no chat template: /v1/chat/completions cannot work")

    def render(messages: tuple[dict, ...]) -> str:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    return render


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--triton-url", default="localhost:8001", help="Triton gRPC host:port")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--served-model-name", default="adaserve", help="the `model` clients name")
    ap.add_argument("--model-repository", default="model_repository", help="for the chat template")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    frontend = Frontend(args.triton_url, args.served_model_name, tokenizer_chat_renderer(args.model_repository))
    web.run_app(frontend.app(), host=args.host, port=args.port, handler_cancellation=True, print=None)
