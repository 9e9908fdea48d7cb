"""Send one workload, in real time, to a target: the in-process engine, Triton over gRPC streaming, or
any OpenAI-compatible `/v1/completions` streaming endpoint. Every runner returns the same
RequestRecords (times on its own monotonic clock), so their scores compare directly."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence

from tqdm import tqdm

from adaserve_backend.slo import SLO

from .metrics import RequestRecord
from .workload import WorkItem


def _finite(ms: float) -> float | None:
    return ms if math.isfinite(ms) else None


def _record(item: WorkItem, start: float) -> RequestRecord:
    return RequestRecord(item.request_id, item.category, item.tpot_slo_ms, arrival=start + item.arrival_s,
                         ttft_slo_ms=item.ttft_slo_ms)


def run_inprocess(engine, encode, items: Sequence[WorkItem], time_limit_s: float,
                  desc: str = "in-process") -> tuple[list[RequestRecord], float]:
    """Drive `engine` from this thread: requests are added when their arrival time comes, the loop
    steps while there is work. `encode(item)` gives the prompt ids. Requests unfinished at the time
    limit count as errors."""
    from adaserve_backend.request import Request

    pending = sorted(items, key=lambda i: i.arrival_s)
    ids = {i.request_id: encode(i) for i in pending}
    records = {}
    start = time.monotonic()
    bar = tqdm(total=len(pending), desc=desc, leave=False)
    nxt = 0
    while time.monotonic() - start < time_limit_s and (nxt < len(pending) or engine.has_work()):
        now = time.monotonic()
        while nxt < len(pending) and start + pending[nxt].arrival_s <= now:
            item = pending[nxt]
            records[item.request_id] = _record(item, start)
            engine.add_request(Request(item.request_id, ids[item.request_id], max_tokens=item.max_tokens,
                                       slo=SLO(item.tpot_slo_ms, _finite(item.ttft_slo_ms)),
                                       arrival_time=start + item.arrival_s))
            nxt += 1
        if not engine.has_work():
            time.sleep(max(0.0, min(0.05, start + pending[nxt].arrival_s - time.monotonic()))
                       if nxt < len(pending) else 0)
            continue
        for out in engine.step():
            if records[out.request_id].take(out):
                bar.update(1)
    wall = time.monotonic() - start
    for item in pending[nxt:]:
        records[item.request_id] = _record(item, start)
        records[item.request_id].error = "not sent within the time limit"
    for request_id in {s.request.request_id for s in list(engine.running) + list(engine.waiting)}:
        records[request_id].error = "not finished within the time limit"
        engine.abort(request_id)
    while engine.has_work():  # let the aborts free every block before the engine is reused
        engine.step()
    bar.close()
    return list(records.values()), wall


async def _replay(items: Sequence[WorkItem], send, time_limit_s: float, desc: str) -> tuple[list[RequestRecord], float]:
    start = time.monotonic()
    bar = tqdm(total=len(items), desc=desc, leave=False)

    async def one(item: WorkItem) -> RequestRecord:
        rec = _record(item, start)
        await asyncio.sleep(max(0.0, rec.arrival - time.monotonic()))
        try:
            await asyncio.wait_for(send(item, rec), timeout=max(0.1, start + time_limit_s - time.monotonic()))
        except asyncio.TimeoutError:
            rec.error = "not finished within the time limit"
        except Exception as e:  # a failed request is scored as an error, the run goes on
            status = getattr(e, "status", "")  # gRPC's, so a refusal (UNAVAILABLE) reads as one
            rec.error = f"{type(e).__name__}: {status + ': ' if status else ''}{e}"
        bar.update(1)
        return rec

    records = await asyncio.gather(*(one(i) for i in items))
    bar.close()
    return list(records), time.monotonic() - start


def run_triton(url: str, items: Sequence[WorkItem], time_limit_s: float, model: str = "ensemble",
               exact_length: bool = False) -> tuple[list[RequestRecord], float]:
    """`exact_length`: ask for exactly max_tokens (min_tokens = max_tokens), so every system compared
    generates the same number of tokens whatever its numerics make of the end of sequence."""
    import numpy as np

    from adaserve_backend.request_fields import tensors as field_tensors
    from adaserve_backend.triton.grpc_client import EnsembleClient

    async def main():
        client = EnsembleClient(url, model)

        async def send(item: WorkItem, rec: RequestRecord) -> None:
            extra_inputs = {}  # the scheduler plans for both targets (none: its class's TTFT target)
            if math.isfinite(item.ttft_slo_ms):
                extra_inputs["ttft_slo_ms"] = np.array([item.ttft_slo_ms], dtype=np.float32)
            if exact_length:
                extra_inputs["min_tokens"] = np.array([item.max_tokens], dtype=np.int32)
            if item.schema is not None:
                extra_inputs |= field_tensors({"guided_decoding_guide_type": "json_schema",
                                               "guided_decoding_guide": json.dumps(item.schema)})
            async for text, extra in client.stream(item.prompt, item.max_tokens, tpot_slo_ms=item.tpot_slo_ms,
                                                   chat=item.chat, extra=extra_inputs):
                now = time.monotonic()
                if text:
                    rec.chunk(now)
                if "num_output_tokens" in extra:
                    rec.output_tokens = int(extra["num_output_tokens"])
                if extra.get("finish_reason"):
                    reason = extra["finish_reason"]
                    rec.finish_reason = reason.decode() if isinstance(reason, bytes) else str(reason)

        try:
            return await _replay(items, send, time_limit_s, "triton gRPC")
        finally:
            await client.close()

    return asyncio.run(main())


def run_openai(base_url: str, model: str, items: Sequence[WorkItem], time_limit_s: float, exact_length: bool = False,
               priority: dict[str, int] | None = None, slo_fields: bool = False) -> tuple[list[RequestRecord], float]:
    """`/v1/completions` with `stream: true` (vLLM, SGLang, Triton's OpenAI frontend), greedy. Items
    are sent as their plain prompt text (render chat items first for the same ids everywhere). Token
    counts come from the usage block when the server reports it (vLLM: stream_options.include_usage),
    else one per chunk. `exact_length`: min_tokens = max_tokens and ignore_eos (llama-server reads only
    the latter). `priority`: category -> vLLM request
    priority (lower is served first; the server must run `--scheduling-policy priority`). `slo_fields`:
    each item's targets as `tpot_slo_ms` / `ttft_slo_ms` body fields (our frontend; as run_triton sends)."""
    import aiohttp

    async def main():
        # no connection cap: a real client fleet opens as many streams as it has requests in flight (the gRPC
        # runner has none either); aiohttp's default of 100 would queue requests inside the client
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def send(item: WorkItem, rec: RequestRecord) -> None:
                body = {"model": model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0.0,
                        "stream": True, "stream_options": {"include_usage": True}}
                if exact_length:
                    body |= {"min_tokens": item.max_tokens, "ignore_eos": True}
                if priority is not None:
                    body["priority"] = priority[item.category]
                if slo_fields:
                    body |= {k: v for k, v in (("tpot_slo_ms", item.tpot_slo_ms),
                                               ("ttft_slo_ms", item.ttft_slo_ms)) if math.isfinite(v)}
                if item.schema is not None:  # OpenAI's field, which vLLM and our frontend both take
                    body["response_format"] = {"type": "json_schema",
                                               "json_schema": {"name": "answer", "schema": item.schema}}
                chunks = 0
                async with session.post(base_url.rstrip("/") + "/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
                    async for raw in resp.content:
                        line = raw.decode().strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        data = json.loads(line[5:])
                        now = time.monotonic()
                        choice = (data.get("choices") or [{}])[0]
                        if choice.get("text"):
                            chunks += 1
                            rec.chunk(now)
                        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
                        if data.get("usage"):
                            rec.output_tokens = data["usage"]["completion_tokens"]
                rec.output_tokens = rec.output_tokens or chunks

            return await _replay(items, send, time_limit_s, "openai endpoint")

    return asyncio.run(main())
