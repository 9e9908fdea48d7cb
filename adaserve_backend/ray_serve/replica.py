"""One engine replica on Ray Serve: the same Engine the Triton model wraps (its startup calibration,
prefix cache, SLO admission), stepped by AsyncEngine, streaming each request's text as it is made.
Ray Serve polls `record_routing_stats` for the router (router.py, replica_routing.py) and `check_health` to restart a
replica whose engine died. The class is plain Python; app.py deploys it."""

from __future__ import annotations

import dataclasses
import logging

from ..config import EngineConfig
from ..engine import Engine
from ..request import Overloaded, Request
from ..serving.detokenize import StreamState
from ..serving.errors import ENGINE_DEAD, ErrorKind, output_error
from .async_engine import AsyncEngine

log = logging.getLogger("adaserve.ray")


def error_item(message: str, kind: ErrorKind) -> dict:
    """A request's last item when it failed: the frontend raises it as BackendError(message, kind)."""
    return {"error": message, "kind": kind.name}


class EngineReplica:
    def __init__(self, engine_config: str, threads: int | None = None) -> None:
        config = EngineConfig.from_json(engine_config)
        if threads is not None:
            config = dataclasses.replace(config, threads=threads)
        self.engine = AsyncEngine(lambda: Engine.from_config(config))
        self.tokenizer = self.engine.engine.tokenizer

    async def generate(self, request: Request, job=None):
        """Dicts of text deltas; the first carries num_input_tokens, the last num_output_tokens and
        finish_reason; a failure is one error_item. `job` is the router's view of it (replica_routing.Job)."""
        stream, first = StreamState(), True
        try:
            async for out in self.engine.generate(request):
                if (error := output_error(out)) is not None:
                    yield error_item(error[1], error[0])
                    return
                rendered = stream.push(self.tokenizer, out.new_token_ids, final=out.finished)
                item = {"text": rendered.text if rendered else ""}
                if first:
                    item["num_input_tokens"], first = out.num_prompt_tokens, False
                    item["num_cached_tokens"] = out.num_cached_tokens
                if out.finished:
                    item.update(num_output_tokens=out.num_output_tokens, finish_reason=out.finish_reason.value)
                    if request.prediction:
                        item.update(accepted_prediction_tokens=out.stats.accepted_prediction_tokens,
                                    rejected_prediction_tokens=out.stats.rejected_prediction_tokens)
                if out.new_logprobs:
                    item["logprobs"] = logprob_arrays(out.new_logprobs)
                if out.prompt_logprobs is not None:
                    item["prompt_logprobs"] = logprob_arrays(out.prompt_logprobs[1:]) | {"ids": request.prompt_ids}
                if rendered or out.finished or len(item) > 1:
                    yield item
        except ValueError as e:
            yield error_item(str(e), ErrorKind.INVALID_ARG)
        except Overloaded as e:
            yield error_item(str(e), ErrorKind.UNAVAILABLE)

    def record_routing_stats(self) -> dict:
        return self.engine.load.as_dict()

    def check_health(self) -> None:
        if self.engine.dead:
            raise RuntimeError(ENGINE_DEAD)

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def logprob_arrays(logprobs) -> dict:
    """What the OpenAI frontend reads (openai_frontend/logprobs.entries), as the Triton model sends it."""
    return {"ids": [lp.token for lp in logprobs], "logprobs": [lp.logprob for lp in logprobs],
            "top": [v for lp in logprobs for _, v in lp.top], "top_ids": [i for lp in logprobs for i, _ in lp.top]}
