"""Calls to the `ensemble` model (or straight to the `adaserve` model, which takes the same text inputs)
over Triton's gRPC streaming API, in one place for every caller (the streaming CLI, the benchmark's
runner, the OpenAI frontend): the input tensors, and an asyncio client that yields text deltas and ends
a request when its consumer stops reading (closing the stream is how Triton learns a client went away;
the engine then frees the request's KV cache)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from ..request_fields import NUMPY
from ..request_fields import tensors as field_tensors
from ..serving.errors import ErrorKind
from .protocol import ERROR_OUTPUT, LOGPROB_OUTPUTS, PROMPT_LOGPROB_OUTPUTS, TEXT_OUTPUT, untag_error

ID_OUTPUTS = ("output_ids", "context_ids")
# The logprob outputs a response may carry, as extras for openai_frontend/logprobs.entries: (extra, outputs
# for its "ids", "logprobs", "top", "top_ids").
REPORTED_LOGPROBS = (("logprobs", ("output_ids", *LOGPROB_OUTPUTS)), ("prompt_logprobs", PROMPT_LOGPROB_OUTPUTS))
# Triton's client names a string tensor BYTES (its config calls it TYPE_STRING)
DTYPES = {np.dtype(dtype): "BYTES" if name == "STRING" else name for name, dtype in NUMPY.items()}


def ensemble_tensors(prompt: str, max_tokens: int, stream: bool = True, tpot_slo_ms: float | None = None,
                     slo_class: str | None = None, temperature: float = 0.0,
                     seed: int | None = None, chat: bool = False,
                     extra: dict | None = None, ttft_slo_ms: float | None = None) -> dict[str, np.ndarray]:
    """The named inputs, as sent (the server validates them: slo.SLO); `extra` maps further input names
    to numpy arrays. Token counts and the finish reason are always asked for (clients score with them)."""
    tensors = field_tensors({
        "text_input": prompt, "max_tokens": max_tokens, "stream": stream, "temperature": temperature,
        "apply_chat_template": chat, "return_num_output_tokens": True, "return_finish_reason": True,
        "tpot_slo_ms": tpot_slo_ms, "ttft_slo_ms": ttft_slo_ms, "slo_class": slo_class, "seed": seed,
    })
    tensors.update(extra or {})
    return tensors


def infer_inputs(grpcclient, tensors: dict[str, np.ndarray]) -> list:
    """`tritonclient.grpc` (or `.aio`) InferInputs for the tensors."""
    inputs = []
    for name, arr in tensors.items():
        t = grpcclient.InferInput(name, list(arr.shape), DTYPES[arr.dtype])
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


class EnsembleError(RuntimeError):
    """An error response, of its kind (serving/errors.py); `status` is its gRPC status name."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INTERNAL) -> None:
        super().__init__(message)
        self.message, self.kind = message, kind

    @property
    def status(self) -> str:
        return self.kind.grpc


class EnsembleClient:
    """One gRPC bidirectional stream per request, so a request can be cancelled by closing it."""

    def __init__(self, url: str = "localhost:8001", model: str = "ensemble") -> None:
        import tritonclient.grpc.aio as grpcclient

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(url)
        self.model = model

    async def close(self) -> None:
        await self.client.close()

    async def is_ready(self) -> bool:
        try:
            return bool(await self.client.is_model_ready(self.model))
        except Exception:  # unreachable or starting: not ready
            return False

    async def input_names(self) -> set[str]:
        meta = await self.client.get_model_metadata(self.model, as_json=True)
        return {i["name"] for i in meta.get("inputs", [])}

    async def stream(self, prompt: str, max_tokens: int = 64, **kwargs) -> AsyncIterator[tuple[str, dict]]:
        async for item in self.stream_tensors(ensemble_tensors(prompt, max_tokens, stream=True, **kwargs)):
            yield item

    async def stream_tensors(self, tensors: dict[str, np.ndarray]) -> AsyncIterator[tuple[str, dict]]:
        """Yields (text delta, other outputs) per response; raises EnsembleError on an error response.

        The stream is opened in Triton's `triton_grpc_error` mode: an error then ends the stream with its
        gRPC status (INVALID_ARGUMENT, UNAVAILABLE, ...), where the default mode sends only a message
        inside the stream. One stream per request, so ending it on an error loses nothing."""
        import grpc

        inputs = infer_inputs(self.grpc, tensors)

        async def requests():
            yield {"model_name": self.model, "inputs": inputs, "request_id": "0", "enable_empty_final_response": True}

        try:
            async for item in self._responses(requests()):
                yield item
        except grpc.RpcError as e:
            raise EnsembleError(e.details() or str(e), ErrorKind.from_grpc(e.code().name)) from None

    async def _responses(self, requests) -> AsyncIterator[tuple[str, dict]]:
        async for result, error in self.client.stream_infer(requests, headers={"triton_grpc_error": "true"}):
            if error is not None:
                status = str(error.status() or "").removeprefix("StatusCode.") if hasattr(error, "status") else ""
                raise EnsembleError(error.message() if hasattr(error, "message") else str(error),
                                    ErrorKind.from_grpc(status))
            response = result.get_response()
            names = {o.name for o in response.outputs}
            if ERROR_OUTPUT in names:  # the `adaserve` model called directly: its error output, the kind in a tag
                kind, message = untag_error(result.as_numpy(ERROR_OUTPUT).reshape(-1)[0].decode("utf-8", "replace"))
                raise EnsembleError(message, kind)
            arrays = {TEXT_OUTPUT, *ID_OUTPUTS, *LOGPROB_OUTPUTS, *PROMPT_LOGPROB_OUTPUTS}
            extra = {n: result.as_numpy(n).reshape(-1)[0] for n in names - arrays}
            for key, outputs in REPORTED_LOGPROBS:  # whole arrays, one entry per token
                if all(n in names for n in outputs):
                    extra[key] = dict(zip(("ids", "logprobs", "top", "top_ids"), map(result.as_numpy, outputs)))
            text = "".join(t.decode("utf-8")
                           for t in result.as_numpy(TEXT_OUTPUT).reshape(-1)) if TEXT_OUTPUT in names else ""
            if text or extra:
                yield text, extra
            if response.parameters["triton_final_response"].bool_param:
                return

