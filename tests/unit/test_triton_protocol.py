"""The adaserve model's wire protocol and the streaming detokenizer, without a server."""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
import pytest

from adaserve_backend.chat import encode_prompt
from adaserve_backend.config import EMBEDDED_DEFAULT
from adaserve_backend.models import load_tokenizer, locate
from adaserve_backend.request import FinishReason, RequestOutput, RequestStats
from adaserve_backend.serving.detokenize import Rendered, StreamState, text_delta
from adaserve_backend.triton.protocol import ResponseOptions, parse_request, prompt_ids, response_tensors


@functools.cache
def tokenizer():
    return load_tokenizer(locate(EMBEDDED_DEFAULT))


TEXTS = [
    " leading space, then café, naïve, 日本語のテキスト, emoji 🎉🚀 and 中文字符。",
    "def f(x):\n    return x ** 2  # ünïcödé\n",
    "🙂" * 5 + " done",
]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_equal_decoding_everything_at_once(text):
    tok = tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for step in (1, 2, 3):  # tokens split across responses in different ways
        state, pieces = StreamState(), []
        chunks = [ids[i : i + step] for i in range(0, len(ids), step)]
        for i, chunk in enumerate(chunks):
            pushed = state.push(tok, chunk, final=i == len(chunks) - 1)
            if pushed is not None:
                delta = pushed.text
                assert delta == text_delta(tok, pushed.context_ids, pushed.ids)  # what the detokenizer model renders
                assert delta, "never an empty chunk"
                assert "\ufffd" not in delta
                pieces.append(delta)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


def test_parse_request_accepts_the_vllm_style_inputs():
    req, opts = parse_request(
        "r",
        {
            "input_ids": np.array([5, 6, 7], dtype=np.int32),
            "max_tokens": np.array([9], dtype=np.int32),
            "stream": np.array([True]),
            "temperature": np.array([0.7], dtype=np.float32),
            "top_k": np.array([20], dtype=np.int32),
            "min_length": np.array([2], dtype=np.int32),
            "seed": np.array([3], dtype=np.uint64),
            "stop_words": np.array([b"\n\n", b""], dtype=object),
            "slo_class": np.array([b"coding"], dtype=object),
            "tenant": np.array([b"team-a"], dtype=object),
            "ttft_slo_ms": np.array([1500.0], dtype=np.float32),
            "return_finish_reason": np.array([True]),
        },
    )
    assert req.slo.ttft_ms == 1500.0 and req.tenant == "team-a"
    assert req.prompt_ids == [5, 6, 7] and req.max_tokens == 9 and req.min_tokens == 2
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.top_k == 20 and req.sampling.seed == 3
    assert req.stop_strings == ("\n\n",) and req.slo.slo_class == "coding" and req.slo.tpot_ms is None
    assert opts.stream and opts.return_finish_reason and not opts.return_perf_metrics


def test_an_arrival_stamped_in_front_moves_the_deadline_base_back_never_forward():
    ids = {"input_ids": np.array([1, 2], dtype=np.int32)}
    stamp = lambda ns: {**ids, "arrival_time_ns": np.array([ns], dtype=np.int64)}  # noqa: E731
    before = time.monotonic()
    assert parse_request("r", ids)[0].arrival_time is None  # the engine takes its own receipt
    two_s_ago = parse_request("r", stamp(time.time_ns() - 2_000_000_000))[0].arrival_time
    assert before - 2.1 < two_s_ago < time.monotonic() - 1.9
    assert parse_request("r", stamp(time.time_ns() + 10**12))[0].arrival_time <= time.monotonic()  # a clock ahead: now
    with pytest.raises(ValueError, match="arrival_time_ns"):
        parse_request("r", stamp(-1))


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({}, "exactly one of 'input_ids' and 'text_input'"),
        ({"input_ids": np.array([1], dtype=np.int32), "text_input": np.array([b"hi"], dtype=object)}, "exactly one of"),
        ({"apply_chat_template": np.array([True])}, "applies to text_input"),
        ({"input_ids": np.array([], dtype=np.int32)}, "empty"),
        ({"max_tokens": np.array([1, 2], dtype=np.int32)}, "exactly one"),
        ({"temperature": np.array([-1.0], dtype=np.float32)}, "temperature"),
        ({"temperature": np.array([np.inf], dtype=np.float32)}, "finite"),
        ({"tpot_slo_ms": np.array([-5.0], dtype=np.float32)}, "positive"),
        ({"tpot_slo_ms": np.array([np.nan], dtype=np.float32)}, "finite"),
        ({"ttft_slo_ms": np.array([0.0], dtype=np.float32)}, "ttft_slo_ms must be a positive"),
        ({"ttft_slo_ms": np.array([np.inf], dtype=np.float32)}, "finite"),
        ({"slo_class": np.array([b"\xff\xfe"], dtype=object)}, "UTF-8"),
        ({"top_p": np.array([0.0], dtype=np.float32)}, "top_p"),
        # unused because another input wins, still validated
        ({"min_tokens": np.array([1], dtype=np.int32), "min_length": np.array([1, 2], dtype=np.int32)}, "min_length"),
        ({"tpot_slo_ms": np.array([50.0], dtype=np.float32), "slo_class": np.array([b"\xff"], dtype=object)}, "UTF-8"),
    ],
)
def test_parse_request_rejects_bad_input_clearly(tensors, message):
    base = {"input_ids": np.array([1, 2], dtype=np.int32)} if tensors and "input_ids" not in tensors else {}
    with pytest.raises(ValueError, match=message):
        parse_request("r", {**base, **tensors})


def test_response_carries_only_what_was_asked():
    out = RequestOutput("r", [1], finished=True, finish_reason=FinishReason.STOP,
                        arrival_time=1.0, first_token_time=1.5,
                        emit_time=2.0, num_prompt_tokens=3, num_output_tokens=4, stats=RequestStats(3, 8, 2))
    plain = response_tensors(out, ResponseOptions(), Rendered([7], [1], "é"), 0)
    assert set(plain) == {"output_ids", "context_ids", "text_output", "is_final"} and plain["is_final"][0]
    assert plain["text_output"][0].decode() == "é"
    full = response_tensors(out, ResponseOptions(True, False, True, True, True, True), Rendered([], [1], ""), 10)
    assert type(full["finish_reason"][0]) is str and full["finish_reason"][0] == "stop"
    assert full["num_output_tokens"][0] == 4
    assert full["acceptance_rate"][0] == pytest.approx(0.25) and full["emit_time_ns"][0] == 2_000_000_010


def test_a_prompt_may_come_as_text_and_is_tokenized_as_the_preprocessing_model_does():
    tok = tokenizer()
    for chat in (False, True):
        tensors = {"text_input": np.array(["Hi there".encode()], dtype=object), "apply_chat_template": np.array([chat])}
        req, _ = parse_request("r", tensors, tok)
        assert req.prompt_ids == encode_prompt(tok, "Hi there", chat)
    with pytest.raises(ValueError, match="exactly one string"):
        prompt_ids({"text_input": np.array([b"a", b"b"], dtype=object)}, tok)
    with pytest.raises(ValueError, match="empty"):
        prompt_ids({"text_input": np.array([b""], dtype=object)}, tok)


def test_a_text_prompt_is_validated():
    tok = tokenizer()
    with pytest.raises(ValueError, match="UTF-8"):
        prompt_ids({"text_input": np.array([b"\xff\xfe"], dtype=object)}, tok)
    with pytest.raises(ValueError, match="empty"):
        encode_prompt(tok, "", False)
    assert len(encode_prompt(tok, "Hi", True)) > len(encode_prompt(tok, "Hi", False))


def test_the_front_model_imports_neither_torch_nor_the_engine():
    import subprocess
    import sys

    code = ("import sys, adaserve_backend.triton.pipeline; "
            "print(sorted(m for m in ('torch', 'adaserve_backend.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_serving_process_imports_no_offline_tools():
    import subprocess
    import sys

    code = ("import sys, adaserve_backend.triton.engine_loop; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tools'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_tokenizer_models_run_without_torch_and_encode_as_the_engine():
    """The preprocessing and postprocessing models load no torch (they start sooner and exit within
    the server's shutdown), and their tokenizer gives the engine's token ids and chat template."""
    import subprocess
    import sys

    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate
    from adaserve_backend.triton.repository import load_repository_tokenizer

    code = ("import sys; import adaserve_backend.serving.detokenize, adaserve_backend.triton.protocol; "
            "from adaserve_backend.triton.repository import load_repository_tokenizer as load; "
            "load('model_repository/preprocessing'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    light = load_repository_tokenizer("model_repository/preprocessing")
    engine = load_tokenizer(locate(EMBEDDED_DEFAULT))
    for text in ("def f(x):\n\treturn x ** 2  ", "Ünïcödé 🤖", "<|im_start|>user\nhi<|im_end|>", ""):
        assert light(text).input_ids == engine(text).input_ids
    chat = [{"role": "user", "content": "hello"}]
    assert (light.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == engine.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    assert light.eos_token_id == engine.eos_token_id


def test_logprobs_are_parsed_and_bounded():
    from adaserve_backend.triton.protocol import parse_request

    ids = {"input_ids": np.asarray([1, 2], dtype=np.int32)}
    assert parse_request("r", ids)[0].logprobs is None
    req, _ = parse_request("r", {**ids, "logprobs": np.asarray([3], dtype=np.int32)})
    assert req.logprobs == 3
    with pytest.raises(ValueError, match="logprobs must be in"):
        dataclasses.replace(req, logprobs=99).validate(100, 100)


def test_stop_token_ids_and_a_grammar_travel_as_their_inputs():
    tensors = {"input_ids": np.array([5, 6], dtype=np.int32), "stop_token_ids": np.array([7, 9], dtype=np.int32),
               "guided_decoding_guide_type": np.array([b"regex"], dtype=object),
               "guided_decoding_guide": np.array([b"[0-9]+"], dtype=object)}
    request, _ = parse_request("r", tensors)
    assert request.stop_token_ids == (7, 9) and request.grammar.kind == "regex" and request.grammar.guide == "[0-9]+"
    with pytest.raises(ValueError, match="guided_decoding_guide_type"):
        parse_request("r", {k: tensors[k] for k in ("input_ids", "guided_decoding_guide")})
