"""The OpenAI frontend's backend for engine replicas on Ray Serve: the prompt is tokenized here, as
Triton's preprocessing model does it, so the router knows its length; each request is one streaming
call through the deployment's handle, which the router (router.py) sends to a replica. Closing the
stream cancels the call, which aborts the request in its replica and frees its KV blocks."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

from ..chat import encode_prompt
from ..config import SchedulerConfig
from ..kv_cache.block_pool import scope_root
from ..openai_frontend.backends import BackendError
from ..openai_frontend.params import Generation, Prompt
from ..replica_routing import Job, prefix_hints
from ..request import Request, SamplingParams
from ..serving.errors import SHUTTING_DOWN, ErrorKind

APP_NAME = "adaserve"
REPLICA_FAILED = "the replica serving this request failed; retry"


def engine_request(gen: Generation, prompt_ids: list[int]) -> Request:
    return Request(uuid.uuid4().hex, prompt_ids, max_tokens=max(1, gen.max_tokens), min_tokens=gen.min_tokens,
                   sampling=SamplingParams(gen.temperature, gen.top_p, gen.top_k, gen.seed, gen.frequency_penalty,
                                           gen.presence_penalty, gen.logit_bias), stop_strings=gen.stop,
                   stop_token_ids=gen.stop_token_ids,
                   slo=gen.slo, tenant=gen.tenant, cache_scope=gen.cache_scope, logprobs=gen.logprobs,
                   prompt_logprobs=gen.logprobs if gen.echo else None, grammar=gen.grammar)


class RayBackend:
    def __init__(self, handle, tokenizer, scheduler: SchedulerConfig, block_size: int = 0) -> None:
        """`block_size`: the replicas' target cache's, for the prompt's prefix hints (0: none sent)."""
        self.handle, self.tokenizer, self.scheduler, self.block_size = handle, tokenizer, scheduler, block_size
        self.calls: set = set()  # the streaming calls in flight
        self.stopped: asyncio.Event | None = None

    def stop(self) -> None:
        """A stop began: every call in flight ends now with SHUTTING_DOWN (503), new ones get it at once;
        the calls are cancelled, which aborts their requests in the replicas."""
        self.stopped.set()
        for call in list(self.calls):
            call.cancel()

    async def connect(self) -> None:
        self.stopped = asyncio.Event()  # on the frontend's loop

    async def close(self) -> None:
        pass

    async def unhealthy(self) -> str | None:
        from ray import serve

        app = (await asyncio.to_thread(serve.status)).applications.get(APP_NAME)
        if app is None or app.status != "RUNNING":
            return f"the Ray Serve application is {app.status.lower() if app else 'not deployed'}"
        return None

    async def stream(self, gen: Generation, prompt: Prompt) -> AsyncIterator[tuple[str, dict]]:
        from ray.exceptions import RayActorError, RayError

        if self.stopped.is_set():
            raise BackendError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
        try:
            ids = ([int(i) for i in encode_prompt(self.tokenizer, prompt, False)] if isinstance(prompt, str)
                   else list(prompt))  # token ids as the client sent them
            prompt = prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)  # the router reads text
            request = engine_request(gen, ids)
            if gen.prediction:
                request = dataclasses.replace(request, prediction=tuple(
                    self.tokenizer(gen.prediction, add_special_tokens=False)["input_ids"]))
            slo = self.scheduler.resolve_slo(gen.slo)
        except ValueError as e:
            raise BackendError(str(e), ErrorKind.INVALID_ARG) from None
        hints = prefix_hints(ids, self.block_size, root=scope_root(gen.cache_scope)) if self.block_size else ()
        job = Job(len(ids), slo.tpot_s if slo.tpot_ms else None, slo.ttft_s if slo.ttft_ms else None,
                  prompt, hints, self.block_size)
        responses = self.handle.options(stream=True).generate.remote(request, job)
        self.calls.add(responses)
        stopped = asyncio.ensure_future(self.stopped.wait())
        try:
            while True:
                item = asyncio.ensure_future(anext(responses))
                await asyncio.wait({item, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not item.done():  # a stop: answer now, not when the replica acknowledges the cancel
                    item.cancel()
                    raise BackendError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
                try:
                    item = item.result()
                except StopAsyncIteration:
                    return
                if "error" in item:
                    raise BackendError(item["error"], ErrorKind[item["kind"]])
                yield item.get("text", ""), item
        except RayActorError:
            raise BackendError(REPLICA_FAILED, ErrorKind.UNAVAILABLE) from None
        except RayError as e:
            if self.stopped.is_set():
                raise BackendError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE) from None
            raise BackendError(f"the replica call failed: {type(e).__name__}", ErrorKind.INTERNAL) from None
        finally:
            stopped.cancel()
            self.calls.discard(responses)
            responses.cancel()
