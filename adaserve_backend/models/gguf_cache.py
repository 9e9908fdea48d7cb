"""A GGUF file converted once into a Hugging Face directory (config, tokenizer, float32 weights) on local
disk, so each later process reads safetensors and JSON instead of parsing and dequantising the GGUF.

Reading the shipped GGUF through `transformers` parses its whole metadata for each of the config, the
tokenizer and the weights, and every process does it again: the server's three Python models, the
frontend, every engine a test builds. The converted files hold exactly what `transformers` made of the
GGUF (float32 weights, Q/K rows already un-permuted), so loading from them gives the same tensors.

The cache lives under ADASERVE_CACHE_DIR (default ~/.cache/adaserve), keyed by the file's contents and
by the `transformers` version that converts it. Each part is converted under a file lock and marked done
only once written whole, so processes starting together convert it once and none reads a half-written
part. Where the cache cannot be written, the GGUF is read directly.

Each use stamps its entry; a conversion removes the entries no process has used for UNUSED_DAYS (a GGUF
replaced or a `transformers` upgraded leaves its old entry behind, some hundreds of MB each), so the
cache holds what is in use and nothing an idle checkout still reads is taken from under it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what a part holds changes
PARTS = ("config", "tokenizer", "weights")
UNUSED_DAYS = 30
USED = ".used"  # its modification time: the entry's last use


def adaserve_cache() -> Path:
    """Where the project keeps what it derives once per machine: ADASERVE_CACHE_DIR, default ~/.cache/adaserve."""
    return Path(os.environ.get("ADASERVE_CACHE_DIR") or Path.home() / ".cache" / "adaserve")


def cache_root() -> Path:
    return adaserve_cache() / "gguf"


def entry(gguf_path: str) -> Path:
    """The cache directory of one GGUF file's contents: every checkout and venv holding the same file
    shares it (hashing the shipped file costs a fraction of a second; converting it, tens of seconds)."""
    st = os.stat(gguf_path)
    return cache_root() / f"{Path(gguf_path).stem}-{_key(os.path.realpath(gguf_path), st.st_size, st.st_mtime_ns)}"


@functools.cache
def _key(path: str, size: int, mtime_ns: int) -> str:
    """Hashed once per process and file version: one engine asks for the config, tokenizer and weights
    of the target and of the draft's base."""
    import transformers

    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha1")
    digest.update(f"|{FORMAT}|{transformers.__version__}".encode())
    return digest.hexdigest()[:12]


@contextmanager
def locked(directory: Path):
    """A lock on `directory` (created if missing) held for the block: one process at a time."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def converted(directory: str, gguf_file: str, part: str) -> str | None:
    """A directory holding `part` of the GGUF in Hugging Face form (converting it first if needed), or
    None where the cache cannot be written (the caller then reads the GGUF itself)."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; one of {PARTS}")
    gguf_path = os.path.join(directory, gguf_file)
    target = entry(gguf_path)
    done = target / f"{part}.done"
    try:
        if not done.exists():
            with locked(target):
                if not done.exists():  # another process may have converted it while this one waited
                    _convert(directory, gguf_file, part, target)
                    done.touch()
            prune(keep=target)
        (target / USED).touch()
    except OSError as e:
        log.warning("cannot cache the converted %s of %s (%s); reading the GGUF directly", part, gguf_path, e)
        return None
    return str(target)


def prune(keep: Path, unused_days: float = UNUSED_DAYS) -> list[Path]:
    """Remove the entries other than `keep` whose last use is more than `unused_days` old (an entry
    never stamped counts from when its directory last changed); returns those removed."""
    cutoff, removed = time.time() - unused_days * 86400, []
    for other in cache_root().iterdir():
        if other == keep or not other.is_dir():
            continue
        stamp = other / USED
        try:
            last = (stamp if stamp.exists() else other).stat().st_mtime
        except OSError:
            continue  # removed meanwhile by another process
        if last < cutoff:
            log.info("removing %s, unused for %.0f days", other, (time.time() - last) / 86400)
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def _convert(directory: str, gguf_file: str, part: str, target: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting the %s of %s once into %s", part, gguf_file, target)
    if part == "config":
        AutoConfig.from_pretrained(directory, gguf_file=gguf_file, local_files_only=True).save_pretrained(target)
    elif part == "tokenizer":
        AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file, local_files_only=True).save_pretrained(target)
    else:
        import torch
        from safetensors.torch import save_file

        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32,
                                                     local_files_only=True)
        # Tied tensors (the head and the embeddings) are stored once each under their own names.
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        partial = target / "weights.safetensors.partial"
        save_file(state, str(partial))
        os.replace(partial, target / "weights.safetensors")
