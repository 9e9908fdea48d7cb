"""A replica's engine driver (ray_serve/async_engine.py over serving/engine_thread.py) over a tiny
engine, no Ray: outputs equal the engine's own, a consumer that leaves aborts its request and frees
its blocks, a failing step fails only what was in flight, a dead engine and a full queue refuse at
once."""

from __future__ import annotations

import asyncio

import pytest

from adaserve_backend.ray_serve.async_engine import AsyncEngine
from adaserve_backend.request import FinishReason, Overloaded, Request
from adaserve_backend.serving.engine_thread import MAX_FAILURES
from tests.engines import assert_all_blocks_free, make_engine
from tests.model_fixtures import tiny_checkpoint


def request(i: int, max_tokens: int = 12) -> Request:
    return Request(f"r{i}", [3 + (7 * i + j) % 300 for j in range(10 + i)], max_tokens=max_tokens, ignore_eos=True)


def engine():
    return make_engine(tiny_checkpoint("llama"), None, "continuous")


async def collect(driver: AsyncEngine, req: Request) -> tuple[list[int], FinishReason | None]:
    ids, reason = [], None
    async for out in driver.generate(req):
        ids += out.new_token_ids
        reason = out.finish_reason
    return ids, reason


def test_outputs_equal_the_engines_own():
    expected = engine()  # a second engine, driven directly
    for i in range(3):
        expected.add_request(request(i))
    want = expected.run_until_done()
    driver = AsyncEngine(engine)
    try:
        async def all_three():
            return await asyncio.gather(*(collect(driver, request(i)) for i in range(3)))

        got = asyncio.run(asyncio.wait_for(all_three(), 60))
    finally:
        driver.stop()
    assert [ids for ids, _ in got] == [want[f"r{i}"] for i in range(3)]
    assert {reason for _, reason in got} == {FinishReason.LENGTH}


def test_a_consumer_that_leaves_aborts_its_request_and_frees_its_blocks():
    driver = AsyncEngine(engine)

    async def leave_after_one():
        stream = driver.generate(request(0, max_tokens=200))
        await anext(stream)
        await stream.aclose()
        for _ in range(200):
            if not driver.engine.has_work():
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(asyncio.wait_for(leave_after_one(), 30))
        assert not driver.engine.running and not driver.engine.waiting
        assert_all_blocks_free(driver.engine)
    finally:
        driver.stop()


def test_a_failing_step_fails_what_was_in_flight_and_then_the_engine_is_dead(monkeypatch):
    driver = AsyncEngine(engine)
    real_step, fail = driver.engine.step, {"on": True}

    def step():
        if fail["on"] and driver.engine.running:
            raise RuntimeError("a fault")
        return real_step()

    monkeypatch.setattr(driver.engine, "step", step)
    try:
        for i in range(MAX_FAILURES):
            outs = asyncio.run(asyncio.wait_for(_all(driver, request(i)), 30))
            assert outs[-1].finish_reason == FinishReason.ERROR and outs[-1].error and "fault" not in outs[-1].error
        assert driver.dead and not driver.load.healthy
        with pytest.raises(Overloaded, match="not running"):
            asyncio.run(_all(driver, request(9)))
    finally:
        driver.stop()


def test_one_failure_leaves_the_engine_serving(monkeypatch):
    driver = AsyncEngine(engine)
    real_step, failed = driver.engine.step, []

    def step():
        if not failed and driver.engine.running:
            failed.append(1)
            raise RuntimeError("once")
        return real_step()

    monkeypatch.setattr(driver.engine, "step", step)
    try:
        assert asyncio.run(_all(driver, request(0)))[-1].finish_reason == FinishReason.ERROR
        assert asyncio.run(_all(driver, request(1)))[-1].finish_reason == FinishReason.LENGTH
        assert not driver.dead
    finally:
        driver.stop()


def test_a_full_queue_refuses_at_once(monkeypatch):
    driver = AsyncEngine(engine)
    monkeypatch.setattr(driver.engine, "num_waiting", lambda: driver.engine.config.scheduler.max_waiting)
    try:
        with pytest.raises(Overloaded, match="waiting"):
            asyncio.run(_all(driver, request(0)))
    finally:
        driver.stop()


async def _all(driver: AsyncEngine, req: Request) -> list:
    return [out async for out in driver.generate(req)]
