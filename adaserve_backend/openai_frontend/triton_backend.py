"""The OpenAI frontend's backend for Triton: the `adaserve` scheduler model itself over gRPC, one
bidirectional stream per request (`make serve`). One hop each way: frontend -> tritonserver -> the
model's stub in, and back the same way per delta. The frontend renders the chat template; `adaserve`
tokenizes the text and renders each response's text, so nothing is tokenized or rendered twice. The
`ensemble` (tokenizer -> scheduler -> detokenizer) stays what gRPC clients and perf_analyzer call."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from ..request_fields import tensors as field_tensors
from ..triton.grpc_client import EnsembleClient, EnsembleError, ensemble_tensors
from ..triton.metrics import ENGINE_UP
from .backends import BackendError
from .field_readers import OpenAIError
from .params import Generation, Prompt

MODEL = "adaserve"


def ensemble_request(gen: Generation, prompt: Prompt, supported: set[str]) -> dict[str, np.ndarray]:
    extra = {"top_p": gen.top_p, "top_k": gen.top_k, "min_tokens": gen.min_tokens, "return_num_input_tokens": True,
             "stop_words": gen.stop or None}
    if gen.stop_token_ids:
        if "stop_token_ids" not in supported:
            raise OpenAIError(400, "'stop_token_ids' is not supported by this server's model", "stop_token_ids")
        extra["stop_token_ids"] = list(gen.stop_token_ids)
    adjusts = {"frequency_penalty": gen.frequency_penalty or None, "presence_penalty": gen.presence_penalty or None,
               "logit_bias_token_ids": [t for t, _ in gen.logit_bias] or None,
               "logit_bias_values": [b for _, b in gen.logit_bias] or None}
    for name, value in adjusts.items():
        if value is not None:
            if name not in supported:  # an older model repository: never ignore a setting
                raise OpenAIError(400, f"{name} is not supported by this server's model", name.split("_token")[0])
            extra[name] = value
    # an older model repository: never ignore a target
    if gen.slo.ttft_ms is not None and "ttft_slo_ms" not in supported:
        raise OpenAIError(400, "ttft_slo_ms is not supported by this server's scheduler", "ttft_slo_ms")
    if gen.logprobs is not None:  # the ensemble reports no token ids to name the tokens by
        if "logprobs" not in supported or "input_ids" not in supported:
            raise OpenAIError(400, "logprobs need the `adaserve` model (this frontend serves one without them)",
                              "logprobs")
        extra["logprobs"] = gen.logprobs
        if gen.echo:
            extra["prompt_logprobs"] = gen.logprobs
    if gen.prediction is not None:
        if "prediction" not in supported:
            raise OpenAIError(400, "'prediction' is not supported by this server's model", "prediction")
        extra |= {"prediction": gen.prediction, "return_perf_metrics": True}  # the counts come with the metrics
    if gen.grammar is not None:
        if "guided_decoding_guide_type" not in supported:
            raise OpenAIError(400, "structured output is not supported by this server's model", "response_format")
        extra |= {"guided_decoding_guide_type": gen.grammar.kind, "guided_decoding_guide": gen.grammar.guide or None}
    if gen.tenant is not None and "tenant" in supported:  # an older repository has no suffix index to scope
        extra["tenant"] = gen.tenant
    if gen.cache_scope is not None:  # isolation is never dropped: a repository without it cannot serve the tenant
        if "cache_scope" not in supported:
            raise OpenAIError(500, "this server's model repository cannot isolate tenants (no cache_scope input)",
                              kind="internal_error")
        extra["cache_scope"] = gen.cache_scope
    if not isinstance(prompt, str):  # token ids: sent as the model's input_ids, never as text
        if "input_ids" not in supported:
            raise OpenAIError(400, "token-id prompts need the `adaserve` model (this frontend serves one without "
                              "them)", "prompt")
        extra["input_ids"] = list(prompt)
    # max_tokens 0 (echo, scoring the prompt): one token is made, and the frontend drops it
    tensors = ensemble_tensors(prompt if isinstance(prompt, str) else "", max(1, gen.max_tokens), stream=True,
                               tpot_slo_ms=gen.slo.tpot_ms, ttft_slo_ms=gen.slo.ttft_ms, slo_class=gen.slo.slo_class,
                               temperature=gen.temperature, seed=gen.seed, chat=False, extra=field_tensors(extra))
    if not isinstance(prompt, str):
        del tensors["text_input"], tensors["apply_chat_template"]
    return tensors


class TritonBackend:
    """A Triton model over gRPC (`adaserve` by default; `ensemble` takes the same inputs): one
    bidirectional stream per request; closing it cancels the request in Triton, which the model's
    cancellation watch sees, and the engine frees its KV cache."""

    def __init__(self, triton_url: str, metrics_url: str | None = None, model: str = MODEL) -> None:
        self.triton_url, self.metrics_url, self.model = triton_url, metrics_url, model
        self.ensemble: EnsembleClient | None = None
        self.inputs: set[str] | None = None

    async def connect(self) -> None:
        # grpc.aio channels belong to the event loop they are made on: made on the server's loop.
        self.ensemble = EnsembleClient(self.triton_url, self.model)

    async def close(self) -> None:
        await self.ensemble.close()

    async def unhealthy(self) -> str | None:
        """Triton's readiness of the model, and (with Triton's metrics URL) whether the engine loop
        still runs: Triton keeps a model ready whose engine failed for good."""
        if not await self.ensemble.is_ready():
            return f"the Triton model {self.model!r} is not ready"
        if self.metrics_url and not await engine_up(self.metrics_url):
            return "the engine is not running"
        return None

    async def stream(self, gen: Generation, prompt: Prompt) -> AsyncIterator[tuple[str, dict]]:
        if self.inputs is None:
            self.inputs = await self.ensemble.input_names()
        responses = self.ensemble.stream_tensors(ensemble_request(gen, prompt, self.inputs))
        try:
            while True:
                try:
                    item = await anext(responses)
                except StopAsyncIteration:
                    return
                except EnsembleError as e:
                    raise BackendError(e.message, e.kind) from None
                yield item
        finally:
            await responses.aclose()


async def engine_up(metrics_url: str) -> bool:
    """adaserve_engine_up from Triton's metrics (unreachable or absent: not up)."""
    from aiohttp import ClientError, ClientSession, ClientTimeout

    try:
        async with ClientSession(timeout=ClientTimeout(total=2)) as session, session.get(metrics_url) as resp:
            text = await resp.text()
    except (ClientError, TimeoutError):
        return False
    values = [line.rsplit(" ", 1)[-1] for line in text.splitlines() if line.startswith(ENGINE_UP)]
    return bool(values) and all(float(v) == 1 for v in values)
