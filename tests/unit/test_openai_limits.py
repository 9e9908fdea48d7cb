"""The OpenAI frontend's limits on clients that hold resources without using them: a body that never
finishes arriving (408), a streaming client that stops reading without closing (its request is aborted,
which frees its KV cache in the engine), and more generations at once than the frontend takes (503 with
Retry-After). The real aiohttp application with the ensemble faked, as in test_openai_hostile."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestServer

from adaserve_backend.openai_frontend import http_app
from adaserve_backend.openai_frontend.http_app import Frontend
from tests.unit.test_openai_hostile import FakeEnsemble, frontend_without_triton


class EndlessEnsemble(FakeEnsemble):
    """Streams large deltas until the frontend closes the stream; `closed` is set when it does."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.closed, self.release = asyncio.Event(), asyncio.Event()

    async def stream_tensors(self, tensors):
        try:
            await self.release.wait()
            while True:
                yield "x" * 65536, {}
                await asyncio.sleep(0)
        finally:
            self.closed.set()


def frontend_with(ensemble_cls, tokenizer, **kwargs) -> Frontend:
    return frontend_without_triton(tokenizer, lambda messages: "", ensemble_cls=ensemble_cls, **kwargs)


def request_bytes(body: dict, content_length: int | None = None) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {content_length or len(data)}\r\n\r\n")
    return head.encode() + data


async def status_line(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readline(), 10)


def test_a_body_that_never_finishes_arriving_gets_a_408(tokenizer, monkeypatch):
    monkeypatch.setattr(http_app, "BODY_READ_S", 0.5)

    async def main():
        async with TestServer(frontend_with(FakeEnsemble, tokenizer).app()) as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(request_bytes({"prompt": "hi"}, content_length=1000))  # 986 bytes short, forever
            await writer.drain()
            line = await status_line(reader)
            rest = await asyncio.wait_for(reader.read(4096), 10)
            writer.close()
            return line, rest

    line, rest = asyncio.run(main())
    assert b" 408 " in line and b'"error"' in rest, (line, rest)


def test_a_client_that_stops_reading_has_its_request_aborted(tokenizer, monkeypatch):
    monkeypatch.setattr(http_app, "WRITE_IDLE_S", 0.5)

    async def main():
        frontend = frontend_with(EndlessEnsemble, tokenizer)
        async with TestServer(frontend.app()) as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.transport.set_write_buffer_limits(0)
            writer.write(request_bytes({"prompt": "hi", "stream": True, "max_tokens": 10}))
            await writer.drain()
            while frontend.backend.ensemble is None:
                await asyncio.sleep(0.01)
            reader._transport.pause_reading()  # the client reads nothing more but keeps the connection
            frontend.backend.ensemble.release.set()
            await asyncio.wait_for(frontend.backend.ensemble.closed.wait(), 30)
            in_flight = frontend.in_flight
            writer.close()
            return in_flight

    assert asyncio.run(main()) == 0


def test_a_stream_whose_client_went_away_is_aborted_quietly(tokenizer, caplog, monkeypatch):
    from aiohttp.client_exceptions import ClientConnectionResetError

    sent = []
    real_send = http_app.send

    async def send(resp, data):  # what aiohttp raises when a write meets the closed connection
        sent.append(data)
        if len(sent) > 2:
            raise ClientConnectionResetError("Cannot write to closing transport")
        await real_send(resp, data)

    monkeypatch.setattr(http_app, "send", send)

    async def main():
        frontend = frontend_with(EndlessEnsemble, tokenizer)
        async with TestServer(frontend.app()) as srv:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(request_bytes({"prompt": "hi", "stream": True, "max_tokens": 10}))
            await writer.drain()
            while frontend.backend.ensemble is None:
                await asyncio.sleep(0.01)
            frontend.backend.ensemble.release.set()
            await status_line(reader)
            await asyncio.wait_for(frontend.backend.ensemble.closed.wait(), 30)
            while frontend.in_flight:
                await asyncio.sleep(0.01)
            writer.transport.abort()
            return frontend.in_flight

    assert asyncio.run(main()) == 0
    failures = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not failures, [r.getMessage() for r in failures]  # a client's leaving is no server failure


def test_more_generations_than_the_frontend_takes_get_a_503_with_retry_after(tokenizer):
    async def main():
        frontend = frontend_with(EndlessEnsemble, tokenizer, max_in_flight=1)
        async with TestServer(frontend.app()) as srv:
            _, first = await asyncio.open_connection(srv.host, srv.port)
            first.write(request_bytes({"prompt": "hi", "stream": True}))  # held: its stream never starts
            await first.drain()
            while frontend.in_flight < 1:
                await asyncio.sleep(0.01)
            reader, second = await asyncio.open_connection(srv.host, srv.port)
            second.write(request_bytes({"prompt": "hi"}))
            await second.drain()
            answer = await asyncio.wait_for(reader.read(4096), 10)
            first.close()
            second.close()
            return answer

    answer = asyncio.run(main())
    assert b" 503 " in answer.split(b"\r\n")[0], answer
    assert b"Retry-After: 1" in answer and b"server_overloaded" in answer, answer


@pytest.fixture(scope="module")
def tokenizer():
    from adaserve_backend import PROJECT_ROOT
    from adaserve_backend.triton.repository import load_repository_tokenizer

    return load_repository_tokenizer(str(PROJECT_ROOT / "model_repository" / "preprocessing"))


def test_a_connection_that_never_finishes_its_headers_is_closed(tokenizer):
    """aiohttp's keep-alive timer runs from the connection's start (main() sets it to IDLE_CONNECTION_S)."""
    async def main():
        app = frontend_with(FakeEnsemble, tokenizer).app()
        srv = TestServer(app)
        await srv.start_server(keepalive_timeout=0.5)
        try:
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 10)  # b"" once the server closes
            writer.close()
            return rest
        finally:
            await srv.close()

    assert asyncio.run(main()) == b""
