"""Paced streams (serving/pacing.py): one response per token, spaced at the pace the request's tokens
are made, never held past a share of its TPOT target; and the send thread that holds each until its
time without letting a later response of the same request overtake it."""

from __future__ import annotations

import threading
import time

import pytest

from adaserve_backend.serving.pacing import HOLD_SHARE, StreamPace
from adaserve_backend.triton.send_thread import SendThread
from tests import fake_pb


def test_the_first_output_leaves_at_once_and_later_ones_at_the_measured_time_per_token():
    pace = StreamPace(hold_s=1.0)
    assert pace.release_times(made=0.0, pieces=1, tokens=1) == [0.0]
    # 3 tokens 0.03 s after the first: 10 ms a token, so the burst leaves over the next 30 ms
    assert pace.release_times(made=0.03, pieces=3, tokens=3) == pytest.approx([0.03, 0.04, 0.05])


def test_what_a_burst_holds_back_carries_the_stream_through_a_long_step():
    pace = StreamPace(hold_s=1.0)
    pace.release_times(0.0, 1, 1)
    pace.release_times(0.02, 2, 2)  # 10 ms a token
    later = pace.release_times(0.06, 4, 4)  # a 40-ms step of 4 tokens: still 10 ms a token
    assert later == pytest.approx([0.06, 0.07, 0.08, 0.09])
    # the next step is long (a prefill chunk rode along); its tokens come 0.1 s later, yet the stream's
    # widest gap is the step less what the burst held back
    after = pace.release_times(0.16, 2, 2)
    gaps = [b - a for a, b in zip([0.09, *after], after)]
    assert max(gaps) < 0.1


def test_no_token_waits_past_the_hold_and_times_never_go_back():
    pace = StreamPace.for_target(0.05)
    assert pace.hold_s == pytest.approx(HOLD_SHARE * 0.05)
    pace.release_times(0.0, 1, 1)
    pace.release_times(1.0, 1, 1)  # one token a second, as measured
    times = pace.release_times(1.01, 8, 8)
    assert times == sorted(times) and times[0] >= 1.01 and max(times) <= 1.01 + pace.hold_s + 1e-12


def test_pieces_that_merge_tokens_share_the_output_s_time():
    pace = StreamPace(hold_s=1.0)
    pace.release_times(0.0, 1, 1)
    # 4 tokens in 2 pieces (two tokens made half a character each): 20 ms a piece at 10 ms a token
    assert pace.release_times(0.04, 2, 4) == pytest.approx([0.04, 0.06])


class Sender:
    """Records what left and when; `finished` set by the FINAL flag."""

    def __init__(self):
        self.sent, self.times, self.finished = [], [], threading.Event()

    def send(self, response=None, flags=0):
        self.sent.append(response)
        self.times.append(time.monotonic())
        if flags & fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.finished.set()


def test_a_timed_response_waits_for_its_time_and_an_untimed_one_of_the_same_request_goes_after_it():
    thread = SendThread(fake_pb)
    paced, other = Sender(), Sender()
    start = time.monotonic()
    thread.send(paced, "early", final=False, at=start + 0.2)
    thread.send(paced, "late", final=False, at=start + 0.4)
    thread.send(other, "now", final=False)
    thread.send(paced, "last", final=True)  # untimed: after both timed ones, at once
    assert paced.finished.wait(5) and other.times[0] - start < 0.15
    assert paced.sent == ["early", "late", "last"] and paced.times[-1] - start < 0.15
    thread.close(timeout=5)


def test_timed_responses_leave_on_time_while_nothing_else_is_queued_and_closing_sends_the_rest():
    thread = SendThread(fake_pb)
    sender = Sender()
    times = sender.times
    start = time.monotonic()
    thread.send(sender, "a", final=False, at=start + 0.1)
    thread.send(sender, "b", final=False, at=start + 0.2)
    deadline = time.monotonic() + 5
    while len(times) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert times[0] - start >= 0.1 and times[1] - start >= 0.2
    thread.send(sender, "c", final=False, at=time.monotonic() + 60)
    done = threading.Event()
    threading.Thread(target=lambda: (thread.close(timeout=5), done.set())).start()
    assert done.wait(5) and sender.sent == ["a", "b", "c"]
