"""Stop strings and stop ids: matched on text across tokens (multi-byte characters included),
stripped from the output, nothing sent that has to be taken back."""

from __future__ import annotations

import pytest

from adaserve_backend.request import FinishReason, Request
from adaserve_backend.stop_strings import StopScan, scan
from tests.engines import assert_all_blocks_free, make_engine, reference, workload
from tests.model_fixtures import tiny_checkpoint

E_ACUTE = "é".encode()  # two bytes: one token each below


class ByteTokenizer:
    """Token i is one piece of bytes: 'é' takes two tokens, so some characters span tokens."""

    PIECES = [E_ACUTE[:1], E_ACUTE[1:], b" ", b"a", b"b", b"c", b"\n"]

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.PIECES[i % len(self.PIECES)] for i in ids).decode("utf-8", "replace")


def text(ids):
    return ByteTokenizer().decode(ids)


def feed(ids, stops, min_tokens=0):
    """Drive `scan` one token at a time as the engine does; returns (tokens sent, matched)."""
    state, sent = StopScan(), 0
    for n in range(1, len(ids) + 1):
        safe, matched = scan(ByteTokenizer(), ids[:n], stops, state, n > min_tokens)
        assert safe >= sent, "never take back what was sent"
        sent = safe
        if matched:
            return ids[:safe], True
    return ids[:sent], False


def test_a_multibyte_stop_string_spanning_tokens_is_found_and_stripped():
    ids = [3, 4, 2, 0, 1, 0, 1, 5]  # "ab éé c"... as text: "ab ééc"
    assert text(ids) == "ab ééc"
    got, matched = feed(ids, ("éé",))  # four tokens, two characters: a one-char-per-token window misses it
    assert matched and text(got) == "ab "


def test_a_possible_match_is_held_back_then_released():
    state = StopScan()
    ids = [3, 2, 0]  # "a " + half of é
    assert scan(ByteTokenizer(), ids, ("é!",), state, True) == (2, False)  # the half character waits
    ids = [3, 2, 0, 1]  # "a é": could still become "é!"
    assert scan(ByteTokenizer(), ids, ("é!",), state, True) == (2, False)
    ids = [3, 2, 0, 1, 4]  # "a éb": no match can start before the end now
    assert scan(ByteTokenizer(), ids, ("é!",), state, True) == (5, False)


def test_min_tokens_holds_off_stop_strings():
    ids = [3, 4, 3, 4, 5]
    assert feed(ids, ("ab",), min_tokens=4) == (ids, False)  # both matches end within min_tokens
    assert feed(ids, ("ab",), min_tokens=3) == ([3, 4], True)  # the second ends after it
    assert feed(ids, ("ab",), min_tokens=0) == ([], True)


@pytest.mark.parametrize("policy", ["adaserve", "continuous"])
def test_engine_strips_stop_strings_and_stops_on_stop_ids(policy):
    target = tiny_checkpoint("llama")
    req = workload(target, n=1, seed=2)[0]
    req = Request("r", req.prompt_ids, max_tokens=16, ignore_eos=True)
    full = reference(target, req)
    assert len(full) == 16
    # a stop string made of the text of output tokens 5..8; what comes before it is what remains
    stop = text(full[5:9]).strip("\ufffd")
    at = text(full).find(stop)
    expected = next(full[:k] for k in range(len(full), -1, -1) if len(text(full[:k])) <= at)
    engine = make_engine(target, target, policy, tokenizer=ByteTokenizer())
    engine.add_request(Request("s", req.prompt_ids, max_tokens=16, ignore_eos=True, stop_strings=(stop, "never")))
    engine.add_request(Request("i", req.prompt_ids, max_tokens=16, ignore_eos=True, stop_token_ids=(full[6],)))
    outs = list(engine.drain())
    by_id = {r: [o for o in outs if o.request_id == r] for r in ("s", "i")}
    assert [t for o in by_id["s"] for t in o.new_token_ids] == expected
    assert by_id["s"][-1].finish_reason == FinishReason.STOP and by_id["s"][-1].num_output_tokens == len(expected)
    stop_id = full.index(full[6])
    assert [t for o in by_id["i"] for t in o.new_token_ids] == full[: stop_id + 1]
    assert by_id["i"][-1].finish_reason == FinishReason.STOP
    assert_all_blocks_free(engine)
