"""The GGUF conversion cache: the converted config and tokenizer are the GGUF's own, a part is converted
once, a file's entry follows its contents (not its path or time), entries unused for a month go, and an
unwritable cache falls back to reading the GGUF. (The weights' equality is the greedy oracle's:
tests/model_fixtures.hf_reference reads the GGUF directly.)"""

from __future__ import annotations

import os
import time

import pytest

from adaserve_backend.config import EMBEDDED_DEFAULT
from adaserve_backend.models import gguf_cache
from adaserve_backend.models.checkpoint import load_hf_config, load_tokenizer, locate


@pytest.mark.slow
def test_the_converted_config_and_tokenizer_are_the_ggufs_own(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv("ADASERVE_CACHE_DIR", str(tmp_path))
    loc = locate(EMBEDDED_DEFAULT)
    direct_config = AutoConfig.from_pretrained(loc.directory, local_files_only=True, **loc.kwargs)
    direct_tokenizer = AutoTokenizer.from_pretrained(loc.directory, local_files_only=True, **loc.kwargs)

    config, tokenizer = load_hf_config(loc), load_tokenizer(loc)
    assert list(tmp_path.glob("gguf/*/config.done")) and list(tmp_path.glob("gguf/*/tokenizer.done"))
    keep = ("transformers_version", "_name_or_path")
    assert {k: v for k, v in config.to_dict().items() if k not in keep} == \
        {k: v for k, v in direct_config.to_dict().items() if k not in keep}
    text = "Héllo, wörld! def f(x):\n    return x ** 2  # 😀 <|im_start|>user"
    assert tokenizer(text).input_ids == direct_tokenizer(text).input_ids
    messages = [{"role": "user", "content": "hi"}]
    chat = tokenizer.apply_chat_template(messages, tokenize=False)
    assert chat == direct_tokenizer.apply_chat_template(messages, tokenize=False)
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id) == (direct_tokenizer.eos_token_id,
                                                                direct_tokenizer.bos_token_id)

    # Read from the cache, not converted again.
    done = next(tmp_path.glob("gguf/*/config.done"))
    before = done.stat().st_mtime_ns
    load_hf_config(loc)
    assert done.stat().st_mtime_ns == before
    assert (done.parent / gguf_cache.USED).exists()  # each use stamps the entry (what pruning reads)


def test_an_entry_follows_the_contents_and_an_unwritable_cache_reads_the_gguf(tmp_path, monkeypatch):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("ADASERVE_CACHE_DIR", str(tmp_path / "cache"))
    first = gguf_cache.entry(str(gguf))
    os.utime(gguf, ns=(0, 10**9))
    copy = tmp_path / "elsewhere" / "model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(b"GGUF")
    assert gguf_cache.entry(str(gguf)) == gguf_cache.entry(str(copy)) == first  # the same contents anywhere
    gguf.write_bytes(b"GGUF2")
    assert gguf_cache.entry(str(gguf)) != first

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("ADASERVE_CACHE_DIR", str(blocked))
    assert gguf_cache.converted(str(tmp_path), "model.gguf", "config") is None
    with pytest.raises(ValueError):
        gguf_cache.converted(str(tmp_path), "model.gguf", "everything")


def test_a_conversion_removes_entries_unused_for_a_month(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASERVE_CACHE_DIR", str(tmp_path))
    root = gguf_cache.cache_root()
    month = time.time() - (gguf_cache.UNUSED_DAYS + 1) * 86400
    entries = {name: root / name for name in ("new", "used-lately", "stale", "stale-never-stamped")}
    for name, entry in entries.items():
        entry.mkdir(parents=True)
        (entry / "weights.safetensors").write_bytes(b"w")
    os.utime(entries["used-lately"], (month, month))  # written long ago, used yesterday
    (entries["used-lately"] / gguf_cache.USED).touch()
    (entries["stale"] / gguf_cache.USED).touch()
    os.utime(entries["stale"] / gguf_cache.USED, (month, month))
    os.utime(entries["stale-never-stamped"], (month, month))
    os.utime(entries["new"], (month, month))  # kept whatever its age: the entry just converted

    removed = gguf_cache.prune(keep=entries["new"])
    assert sorted(p.name for p in removed) == ["stale", "stale-never-stamped"]
    assert sorted(p.name for p in root.iterdir()) == ["new", "used-lately"]
