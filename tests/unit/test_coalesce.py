"""When held streamed tokens leave (serving/coalesce.py): the configured hold bounds the oldest held
token's age, and a request's TPOT target bounds the silence since its last response."""

from __future__ import annotations

from adaserve_backend.serving.coalesce import must_send


def test_the_hold_alone_sends_once_the_oldest_token_would_wait_past_it():
    assert not must_send(held_since=0.0, now=0.10, next_step_s=0.05, limit_s=0.25)
    assert must_send(held_since=0.0, now=0.21, next_step_s=0.05, limit_s=0.25)


def test_a_tpot_target_bounds_the_gap_since_the_last_response_not_the_tokens_age():
    # tokens made at 0.10, the last response at 0.0: one more 50-ms step would leave the stream silent
    # for 0.17 s, past a 150-ms target, though the held tokens are only 0.02 s old
    assert must_send(held_since=0.10, now=0.12, next_step_s=0.05, limit_s=0.25, last_sent=0.0, gap_s=0.15)
    assert not must_send(held_since=0.10, now=0.12, next_step_s=0.05, limit_s=0.25, last_sent=0.0, gap_s=0.2)


def test_before_any_response_only_the_hold_counts():
    assert not must_send(held_since=0.0, now=0.1, next_step_s=0.05, limit_s=0.25, last_sent=None, gap_s=0.01)
