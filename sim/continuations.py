"""The served target's greedy output for each prompt of a validated bench, so simulated requests carry
their true tokens and the engine's copies (prompt lookup, the suffix index: speculation/copies.py) hit
or miss in the simulator as they do in the engine. The bench decodes greedily, so a prompt's output is
the same in every run and policy (speculation is lossless).

Generated once per prompt with the engine in-process (continuous batching, max_tokens, end of sequence
ignored: where a request stops is the measured runs' to say) and cached under ADASERVE_CACHE_DIR
(default ~/.cache/adaserve)/sim-continuations, one file per target model; a few hundred prompts take
a minute or two on a 2-core CPU the first time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from adaserve_backend.config import EngineConfig
from adaserve_backend.models import locate
from adaserve_backend.models.gguf_cache import adaserve_cache
from adaserve_backend.request import Request

from .workload import SimRequest

FORMAT = 1  # bump when how a continuation is made changes


def cache_file(config: EngineConfig) -> Path:
    """One file per target model: its path, dtype and its files' sizes and times name it."""
    where = locate(config.target.path)
    files = [Path(where.directory, where.gguf_file)] if where.gguf_file else sorted(Path(where.directory).rglob("*"))
    stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
    key = hashlib.sha1(json.dumps([FORMAT, config.target.path, config.target.dtype, stamp]).encode()).hexdigest()[:16]
    return adaserve_cache() / "sim-continuations" / f"{key}.json"


def prompt_key(ids: Iterable[int]) -> str:
    return hashlib.sha1(json.dumps(list(ids)).encode()).hexdigest()


def greedy_continuations(config: EngineConfig, prompts: Iterable[tuple[int, ...]],
                         max_tokens: int) -> dict[tuple[int, ...], tuple[int, ...]]:
    """prompt ids -> its first `max_tokens` greedy output tokens, from the cache or generated now."""
    path = cache_file(config)
    cached: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
    prompts = list(dict.fromkeys(prompts))
    missing = [p for p in prompts if len(cached.get(prompt_key(p), ())) < max_tokens]
    if missing:
        cached.update(_generate(config, missing, max_tokens))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(path)
    return {p: tuple(cached[prompt_key(p)][:max_tokens]) for p in prompts}


def _generate(config: EngineConfig, prompts: list[tuple[int, ...]], max_tokens: int) -> dict[str, list[int]]:
    from harness.bench import InProcess  # loads the models

    engine = InProcess(config).engine("continuous")
    for i, ids in enumerate(prompts):
        engine.add_request(Request(str(i), list(ids), max_tokens=max_tokens, ignore_eos=True))
    out: dict[str, list[int]] = {}
    with tqdm(total=len(prompts), desc="greedy continuations", unit="prompt") as bar:
        for o in engine.drain():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
            bar.update(int(o.finished))
    return {prompt_key(prompts[int(rid)]): tokens for rid, tokens in out.items()}


def with_continuations(config: EngineConfig, workloads: dict[str, list[SimRequest]]) -> dict[str, list[SimRequest]]:
    """Every request of `workloads` (prompt ids known) with its prompt's greedy continuation."""
    requests = [r for rs in workloads.values() for r in rs]
    found = greedy_continuations(config, [r.prompt_ids for r in requests], max(r.max_tokens for r in requests))
    return {k: [dataclasses.replace(r, continuation=found[r.prompt_ids]) for r in rs] for k, rs in workloads.items()}
