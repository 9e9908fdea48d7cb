"""The soak (benchmarks/soak.py) without a server: its plan, its statistics and verdicts, and its
clients' behaviours against a small aiohttp server that streams as the OpenAI frontend does."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter

import psutil
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks.soak_clients import run_load
from benchmarks.soak_hostile import HOSTILE_CASES
from benchmarks.soak_judge import (
    growth_by_process,
    hostile_misses,
    judge,
    memory_growth,
    outcome_counts,
    soak_stats,
    ttft_ms,
    ttft_timeline,
    window_s,
)
from benchmarks.soak_plan import FramedDeck, PlannedRequest, Shares, build_plan
from benchmarks.soak_records import (
    ANSWERED,
    CANCEL,
    COMPLETE,
    DISCONNECT,
    DONE,
    FAILED,
    HOSTILE,
    LEFT,
    REFUSED,
    STALLED,
    UNTERMINATED,
    ServerSample,
    SoakRecord,
)
from benchmarks.soak_sampler import process_label, tree_rss
from harness.workload import PromptsExhausted

PROMPTS = {"coding": [(f"def f{i}(x):\n    '''Return x.'''\n", False) for i in range(40)],
           "chat": [(f"What is question {i}?", True) for i in range(20)],
           "summary": [(f"Summarize text {i}.", True) for i in range(20)]}


# ---- the plan ---------------------------------------------------------------------------------------
def test_the_deck_never_deals_a_text_twice_and_says_when_it_runs_out():
    deck = FramedDeck({"chat": PROMPTS["chat"]}, seed=1)
    texts = [deck.deal("chat")[0] for _ in range(20 * 16)]
    assert len(set(texts)) == len(texts)
    assert deck.framings_used() == {"chat": 16}
    with pytest.raises(PromptsExhausted):
        deck.deal("chat")


def test_framings_are_mixed_over_the_run_not_used_one_after_another():
    deck = FramedDeck({"coding": PROMPTS["coding"]}, seed=2)
    first = [deck.deal("coding")[0] for _ in range(80)]  # an eighth of the deck
    plain = sum(t.startswith("def ") for t in first)
    assert 0 < plain < 20  # about one in 16 is unframed, not the first 40 in a row
    assert all(t.endswith("'''Return x.'''\n") for t in first)


def test_the_plan_draws_the_shares_asked_for_and_stays_within_the_run():
    deck = FramedDeck({c: p * 30 for c, p in PROMPTS.items()}, seed=0)  # repeats in the pool are fine here
    plan = build_plan(20.0, 300.0, Shares(0.3, 0.1, 0.05), seed=3, deck=deck)
    assert 5000 < len(plan) < 7000 and all(0 < p.arrival_s < 300 for p in plan)
    assert [p.arrival_s for p in plan] == sorted(p.arrival_s for p in plan)
    kinds = Counter(p.kind for p in plan)
    streamed = len(plan) - kinds[HOSTILE]
    assert kinds[HOSTILE] / len(plan) == pytest.approx(0.05, abs=0.01)
    assert kinds[CANCEL] / streamed == pytest.approx(0.3, abs=0.03)
    assert kinds[DISCONNECT] / streamed == pytest.approx(0.1, abs=0.02)
    assert {p.category for p in plan if p.kind == HOSTILE} == {c.name for c in HOSTILE_CASES}  # every case
    for p in plan:
        if p.kind in (CANCEL, DISCONNECT):
            assert 1 <= p.leave_after < p.max_tokens
    again = build_plan(20.0, 300.0, Shares(0.3, 0.1, 0.05), seed=3,
                       deck=FramedDeck({c: p * 30 for c, p in PROMPTS.items()}, seed=0))
    assert again == plan


@pytest.mark.parametrize("shares", [(0.8, 0.3, 0.0), (-0.1, 0.0, 0.0), (0.3, 0.1, 1.5)])
def test_shares_are_checked(shares):
    with pytest.raises(ValueError):
        Shares(*shares)


def test_hostile_cases_have_distinct_names():
    names = [c.name for c in HOSTILE_CASES]
    assert len(set(names)) == len(names)


# ---- statistics and verdicts --------------------------------------------------------------------------
def test_the_window_is_five_minutes_or_a_fifth_of_a_short_run():
    assert window_s(1800) == 300 and window_s(3600) == 300
    assert window_s(180) == 36 and window_s(1200) == 240
    assert window_s(1800, 120) == 120
    with pytest.raises(ValueError):
        window_s(180, 100)


def done(arrival: float, ttft: float, kind: str = COMPLETE, outcome: str = DONE) -> SoakRecord:
    return SoakRecord(f"r{arrival}", kind, "chat", arrival, first_token_s=arrival + ttft, end_s=arrival + 1,
                      outcome=outcome)


def test_ttft_counts_only_completed_requests_that_arrived_in_the_window():
    records = [done(1, 0.1), done(2, 0.2), done(3, 9.0, kind=CANCEL, outcome=LEFT), done(4, 0.4, outcome=FAILED),
               done(11, 0.5), SoakRecord("r", COMPLETE, "chat", 5, outcome=REFUSED, status=503)]
    assert ttft_ms(records, 0, 10) == pytest.approx([100, 200])
    assert ttft_ms(records, 10, 20) == pytest.approx([500])


def sample(t: float, rss: float, kv: float | None = 0) -> ServerSample:
    return ServerSample(t, rss, {"tritonserver": rss}, 200.0, kv, 0, 0)


def test_memory_growth_is_read_from_the_end_of_the_warm_up():
    samples = [sample(0, 1000), sample(30, 2000), sample(60, 2900), sample(90, 2950), sample(120, 2958)]
    start, end, growth = memory_growth(samples, 60)
    assert (start, end) == (2900, 2958) and growth == pytest.approx(0.02)
    assert memory_growth(samples[:3], 60) == (None, None, None)  # one sample after the warm-up: no growth


def test_growth_is_told_per_process():
    def at(t, engine):
        return ServerSample(t, 1000 + engine, {"tritonserver": 1000, "stub:adaserve": engine}, 100, 0, 0, 0)

    growth = growth_by_process([at(0, 100), at(60, 500), at(120, 530)], 60)
    assert growth["stub:adaserve"] == {"start_mib": 500, "end_mib": 530, "growth_mib": 30}
    assert growth["tritonserver"]["growth_mib"] == 0


class FakeProcess:
    def __init__(self, argv, name="python3", pid=7):
        self.argv, self._name, self.pid = argv, name, pid

    def cmdline(self):
        return self.argv

    def name(self):
        return self._name


def test_stubs_are_named_by_their_model():
    stub = "/x/backends/python/triton_python_backend_stub"
    assert process_label(FakeProcess([stub, "/repo/model_repository/adaserve/1/model.py", "shm"])) == "stub:adaserve"
    assert process_label(FakeProcess([stub])) == "stub:7"
    assert process_label(FakeProcess(["/bin/tritonserver", "--x"], "tritonserver")) == "tritonserver"


def stats_of(records, samples, kv=0, duration=100.0, window=20.0):
    return soak_stats(records, samples, kv, duration, window)


def healthy() -> tuple[list[SoakRecord], list[ServerSample]]:
    records = [done(t, 0.1 + 0.001 * (t % 7)) for t in range(100)]
    records.append(SoakRecord("h", HOSTILE, "wrong model", 50, status=404, explained=True, outcome=ANSWERED))
    return records, [sample(t, 3000 + t / 100) for t in range(0, 101, 10)]


def test_a_healthy_run_passes_every_target():
    records, samples = healthy()
    stats = stats_of(records, samples)
    verdicts = judge(stats)
    assert [v.passed for v in verdicts] == [True] * 5, verdicts
    assert stats.ttft_first_n == 20 and stats.ttft_last_n == 20 and stats.hostile_sent == 1


def test_each_target_fails_on_its_own():
    records, samples = healthy()
    hung = [*records, SoakRecord("x", COMPLETE, "chat", 30, outcome=STALLED)]
    assert [v.passed for v in judge(stats_of(hung, samples))] == [False, True, True, True, True]
    assert [v.passed for v in judge(stats_of(records, samples, kv=3))] == [True, False, True, True, True]
    grown = [*samples, sample(110, 3200)]
    assert [v.passed for v in judge(stats_of(records, grown))] == [True, True, False, True, True]
    slow_end = [done(r.arrival_s, 0.5) if r.arrival_s >= 80 and r.kind == COMPLETE else r for r in records]
    assert [v.passed for v in judge(stats_of(slow_end, samples))] == [True, True, True, False, True]
    bad = [*records, SoakRecord("h2", HOSTILE, "n of 2", 60, status=200, outcome=ANSWERED)]
    assert [v.passed for v in judge(stats_of(bad, samples))] == [True, True, True, True, False]


def test_what_was_not_measured_fails_its_target():
    records, _ = healthy()
    verdicts = judge(stats_of([r for r in records if r.arrival_s < 50], [], kv=None))
    assert [v.passed for v in verdicts] == [True, False, False, False, True]
    assert "n/a" in verdicts[1].value and "n/a" in verdicts[2].value


def test_hostile_answers_must_be_a_4xx_in_openais_shape():
    def hostile(status, explained, outcome=ANSWERED):
        return SoakRecord("h", HOSTILE, "case", 1, status=status, explained=explained, outcome=outcome)

    records = [hostile(400, True), hostile(413, True), hostile(400, False), hostile(200, False),
               hostile(500, True), hostile(None, False, STALLED)]
    assert [r.status for r in hostile_misses(records)] == [400, 200, 500, None]


def test_timeline_and_counts():
    records, _ = healthy()
    line = ttft_timeline(records, 100, 25)
    assert [w["n"] for w in line] == [25, 25, 25, 25] and all(w["ttft_p99_ms"] > 100 for w in line)
    assert outcome_counts(records) == {COMPLETE: {DONE: 100}, HOSTILE: {ANSWERED: 1}}


def test_tree_rss_reads_this_process():
    rss, each = tree_rss(os.getpid())  # in a whole suite this process may have children (servers) too
    assert rss > 10 and list(each)[0] == psutil.Process().name()
    assert tree_rss(2**22 + 12345) == (0.0, {})


# ---- the clients ------------------------------------------------------------------------------------
def sse(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def fake_frontend() -> web.Application:
    """Streams ten events a prompt asks for, or misbehaves as the prompt says."""

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "not JSON"}}, status=400)
        if body.get("model") != "adaserve":
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        prompt = body.get("prompt") or body["messages"][0]["content"]
        if prompt == "refuse":
            return web.json_response({"error": {"message": "busy"}}, status=503, headers={"Retry-After": "1"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(10):
            if prompt == "stall" and i == 2:
                await asyncio.sleep(3)
            if prompt == "cut" and i == 3:
                request.transport.abort()
                return resp
            chunk = {"choices": [{"delta": {"content": f"t{i}"}}]} if "messages" in body else \
                {"choices": [{"text": f"t{i}"}]}
            await resp.write(sse(chunk))
            await asyncio.sleep(0.01)
        await resp.write(sse({"choices": [{"text": "", "finish_reason": "length"}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 10}}))
        await resp.write(sse(b"[DONE]"))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.post("/v1/chat/completions", completions)])
    return app


def planned(rid: str, kind: str, prompt: str = "hi", chat: bool = False, leave: int = 0,
            category: str = "chat") -> PlannedRequest:
    return PlannedRequest(rid, kind, 0.01, category, prompt, chat, 10, leave)


def test_each_client_behaviour_ends_as_planned():
    plan = [planned("done", COMPLETE), planned("chat", COMPLETE, chat=True), planned("cancel", CANCEL, leave=3),
            planned("drop", DISCONNECT, leave=2), planned("refused", COMPLETE, "refuse"),
            planned("stall", COMPLETE, "stall"), planned("cut", COMPLETE, "cut"),
            PlannedRequest("wrong", HOSTILE, 0.01, "wrong model"),
            PlannedRequest("json", HOSTILE, 0.01, "malformed json")]

    async def main():
        async with TestServer(fake_frontend()) as server:
            base = str(server.make_url("")).rstrip("/")
            return await run_load(plan, base, "adaserve", hang_s=1.0, t0=time.monotonic(),
                                  on_record=lambda r: None, in_flight=lambda n: None)

    records = {r.request_id: r for r in asyncio.run(main())}
    assert (records["done"].outcome, records["done"].events, records["done"].output_tokens) == (DONE, 10, 10)
    assert records["done"].ttft_s is not None and records["done"].ttft_s >= 0
    assert (records["chat"].outcome, records["chat"].events) == (DONE, 10)
    assert (records["cancel"].outcome, records["cancel"].events) == (LEFT, 3)
    assert (records["drop"].outcome, records["drop"].events) == (LEFT, 2)
    assert (records["refused"].outcome, records["refused"].status, records["refused"].explained) == (REFUSED, 503, True)
    assert records["stall"].outcome == STALLED and records["stall"].hung
    assert records["cut"].outcome == UNTERMINATED and records["cut"].hung
    assert (records["wrong"].status, records["wrong"].explained) == (404, True)
    assert (records["json"].status, records["json"].explained) == (400, True)
    assert not hostile_misses(list(records.values()))
