"""The soak's clients against an OpenAI endpoint, open loop: each planned request is sent at its
arrival time on its own connection and behaves as planned (benchmarks/soak_plan.py). A client that
reads its stream to the end, one that closes it after some events (a clean close: what a cancelling
SDK does), one that drops its socket with a reset and no goodbye (a crashed client, a lost network),
and a hostile one. Every wait is bounded by the hang timeout: no byte for that long is a hang."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable, Sequence

import aiohttp

from .soak_hostile import HOSTILE_CASES
from .soak_plan import PlannedRequest
from .soak_records import (
    ANSWERED,
    CANCEL,
    DISCONNECT,
    DONE,
    FAILED,
    HOSTILE,
    LEFT,
    REFUSED,
    STALLED,
    UNTERMINATED,
    SoakRecord,
)

CASES = {c.name: c for c in HOSTILE_CASES}
REFUSAL_STATUSES = (429, 503)


def request_body(p: PlannedRequest, model: str) -> tuple[str, dict]:
    """(path, body): greedy, streamed with the usage block, the class named as the served SLO class;
    chat-shaped prompts go to the chat endpoint as one user message."""
    body = {"model": model, "max_tokens": p.max_tokens, "temperature": 0.0, "stream": True, "slo_class": p.category,
            "stream_options": {"include_usage": True}}
    if p.chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": p.prompt}]}
    return "/v1/completions", {**body, "prompt": p.prompt}


def event_text(data: dict) -> str:
    choice = (data.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def drop_connection(resp: aiohttp.ClientResponse) -> None:
    """Reset the connection under `resp` (SO_LINGER 0, then close): the server sees the socket die
    without a FIN, as with a client that crashed."""
    transport = resp.connection.transport if resp.connection is not None else None
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def explained(resp: aiohttp.ClientResponse, hang_s: float) -> tuple[bool, str]:
    """Whether an error answer is OpenAI's shape (JSON, error.message), and its message shortened."""
    text = await asyncio.wait_for(resp.text(errors="replace"), hang_s)
    try:
        message = json.loads(text)["error"]["message"]
        return bool(message), str(message)[:160]
    except (ValueError, KeyError, TypeError):
        return False, text[:160]


async def stream(session: aiohttp.ClientSession, base_url: str, model: str, p: PlannedRequest, t0: float,
                 hang_s: float) -> SoakRecord:
    rec = SoakRecord(p.request_id, p.kind, p.category, p.arrival_s)
    path, body = request_body(p, model)
    try:
        resp = await asyncio.wait_for(session.post(base_url + path, json=body), hang_s)
    except TimeoutError:
        rec.outcome, rec.detail = STALLED, f"no response headers within {hang_s:g} s"
        return rec
    except aiohttp.ClientConnectorError as e:
        rec.outcome, rec.detail = FAILED, f"could not connect: {e}"
        return rec
    except aiohttp.ClientError as e:  # sent, and the connection ended with no answer
        rec.outcome, rec.detail = UNTERMINATED, f"{type(e).__name__}: {e}"
        return rec
    rec.status = resp.status
    try:
        if resp.status != 200:
            rec.explained, rec.detail = await explained(resp, hang_s)
            rec.outcome = REFUSED if resp.status in REFUSAL_STATUSES else FAILED
            return rec
        while True:
            line = await asyncio.wait_for(resp.content.readline(), hang_s)
            if not line:
                rec.outcome, rec.detail = UNTERMINATED, "the stream ended without its final event"
                return rec
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            if line == b"data: [DONE]":
                rec.outcome = rec.outcome or DONE
                return rec
            data = json.loads(line[5:])
            if "error" in data:
                rec.outcome, rec.detail = FAILED, str(data["error"].get("message", data["error"]))[:160]
                continue  # [DONE] follows
            if data.get("usage"):  # the last chunk before [DONE]: the token count TPOT needs
                rec.output_tokens = data["usage"].get("completion_tokens")
            if event_text(data):
                rec.events += 1
                rec.first_token_s = rec.first_token_s or time.monotonic() - t0
                if p.kind in (CANCEL, DISCONNECT) and rec.events >= p.leave_after:
                    if p.kind == DISCONNECT:
                        drop_connection(resp)
                    else:
                        resp.close()
                    rec.outcome = LEFT
                    return rec
    except TimeoutError:
        rec.outcome, rec.detail = STALLED, f"no event for {hang_s:g} s after {rec.events} events"
        return rec
    except (aiohttp.ClientError, ValueError) as e:  # a connection cut mid-stream, or an event that is not JSON
        rec.outcome, rec.detail = UNTERMINATED, f"{type(e).__name__}: {e}"[:160]
        return rec
    finally:
        rec.end_s = time.monotonic() - t0
        resp.close()


async def hostile(session: aiohttp.ClientSession, base_url: str, p: PlannedRequest, t0: float,
                  hang_s: float) -> SoakRecord:
    """Send the case; judge only the answer's status and shape (a 2xx stream is closed at once)."""
    case = CASES[p.category]
    rec = SoakRecord(p.request_id, HOSTILE, p.category, p.arrival_s)
    try:
        resp = await asyncio.wait_for(session.request(case.method, base_url + case.path, data=case.body,
                                                      headers=case.headers), hang_s)
    except TimeoutError:
        rec.outcome, rec.detail = STALLED, f"no answer within {hang_s:g} s"
        return rec
    except aiohttp.ClientError as e:
        rec.outcome, rec.detail = UNTERMINATED, f"{type(e).__name__}: {e}"[:160]
        return rec
    try:
        rec.status, rec.outcome = resp.status, ANSWERED
        if resp.status >= 400:
            rec.explained, rec.detail = await explained(resp, hang_s)
    except TimeoutError:
        rec.outcome, rec.detail = STALLED, f"status {resp.status}, then no body within {hang_s:g} s"
    except aiohttp.ClientError as e:
        rec.outcome, rec.detail = UNTERMINATED, f"{type(e).__name__}: {e}"[:160]
    finally:
        rec.end_s = time.monotonic() - t0
        resp.close()
    return rec


async def run_load(plan: Sequence[PlannedRequest], base_url: str, model: str, hang_s: float, t0: float,
                   on_record: Callable[[SoakRecord], None], in_flight: Callable[[int], None]) -> list[SoakRecord]:
    """Send every planned request at `t0` + its arrival time; wait for all of them. `on_record` is
    called as each ends, `in_flight` with the number of requests open after each change."""
    records: list[SoakRecord] = []
    open_now = 0

    async def one(p: PlannedRequest) -> None:
        nonlocal open_now
        open_now += 1
        in_flight(open_now)
        try:
            rec = await (hostile(session, base_url, p, t0, hang_s) if p.kind == HOSTILE
                         else stream(session, base_url, model, p, t0, hang_s))
        except Exception as e:  # a client bug must not end the soak: record it as a failure
            rec = SoakRecord(p.request_id, p.kind, p.category, p.arrival_s, outcome=FAILED,
                             detail=f"client error {type(e).__name__}: {e}"[:160])
        records.append(rec)
        on_record(rec)
        open_now -= 1
        in_flight(open_now)

    # no connection cap (each client has its own connection); force_close: a dropped or cancelled
    # connection is never handed to the next request
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = []
        for p in plan:
            await asyncio.sleep(max(0.0, t0 + p.arrival_s - time.monotonic()))
            tasks.append(asyncio.create_task(one(p)))
        await asyncio.gather(*tasks)
    return records
