"""FlashInfer's compiled kernels as files: built ahead on any machine with nvcc (`--prebuild`), found in the
JIT cache after a compile, packed as flashinfer-aot-<arch>.tar.gz (in parts small enough for the device
tool to bring back), and unpacked where flashinfer loads prebuilt kernels when carried to the next machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from tools.gpu.env import AOT_CARRIED, GPU_DIR, SITE, setup_env

DTYPES = ("bf16", "fp16")  # FlashInferBackend's kernels, one compiled module each
OUT_PART_BYTES = 15 * 2**20  # files back from the device tool: 16 MiB each at most


def jit_libraries() -> list[Path]:
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", GPU_DIR)) / ".cache" / "flashinfer"
    return sorted(base.glob("*/*/cached_ops/*/*.so"))


def pack_kernels(libs: list[Path], run_dir: Path, out_dir: Path | None, arch: str) -> dict:
    """The compiled libraries as <module>/<module>.so in one .tar.gz in the run folder, and in parts of at
    most 15 MiB in $OUT when that is set: unpacked into .gpu/aot/<arch>/ and carried, the next machine
    loads them instead of compiling (docs/gpu.md)."""
    if not libs:
        return {"libraries": 0}
    tar_path = run_dir / f"flashinfer-aot-{arch}.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for so in libs:
            tar.add(so, arcname=f"{so.parent.name}/{so.name}")
    size = tar_path.stat().st_size
    out = {"libraries": len(libs), "names": [so.parent.name for so in libs],
           "mb": round(sum(so.stat().st_size for so in libs) / 2**20, 1), "tar_mb": round(size / 2**20, 1),
           "tar": str(tar_path)}
    if out_dir is not None and size <= 3 * OUT_PART_BYTES:
        data = tar_path.read_bytes()
        parts = [data[i : i + OUT_PART_BYTES] for i in range(0, len(data), OUT_PART_BYTES)]
        for i, part in enumerate(parts):
            (out_dir / f"{tar_path.name}.{i:02d}").write_bytes(part)
        out["out_parts"] = len(parts)
    elif out_dir is not None:
        out["out_parts"] = 0
        out["out_note"] = "too large to bring back in at most 3 parts of 15 MiB"
    return out


def install_carried_kernels(arch: str, carried: Path = AOT_CARRIED, site: Path = SITE, only: str = "") -> list[str]:
    """Prebuilt kernels carried as .gpu/aot/flashinfer-aot-<arch>.tar.gz (what `--prebuild` or an earlier
    run packed: <module>/<module>.so each) go where flashinfer looks for prebuilt ones, which it loads
    without building; only for this device's architecture, and only modules whose name holds `only`."""
    tar_path = carried / f"flashinfer-aot-{arch}.tar.gz"
    if not tar_path.is_file() or not (site / "flashinfer").is_dir():
        return []
    return unpack_kernels(tar_path, site / "flashinfer" / "data" / "aot", only)


def unpack_kernels(tar_path: Path, aot_dir: Path, only: str = "") -> list[str]:
    """The <module>/<module>.so members of a packed tarball into aot_dir (flashinfer's data/aot), nothing
    else: a member named otherwise could land anywhere."""
    names = []
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 2 or parts[1] != f"{parts[0]}.so" or only not in parts[0]:
                continue
            (aot_dir / parts[0]).mkdir(parents=True, exist_ok=True)
            (aot_dir / parts[0] / parts[1]).write_bytes(tar.extractfile(member).read())
            names.append(parts[0])
    return sorted(names)


def prebuild(arch_list: str, head_dims: tuple[int, ...] = (128, 64)) -> dict:
    """`--prebuild 9.0a`: on any machine with nvcc (no GPU needed), build the kernels FlashInferBackend
    uses (FA2 batch prefill for bf16 and fp16, which tensor-core decode shares, at head_dim 128, Llama-3's,
    and 64, the embedded SmolLM2's; and the mask packing) for that architecture, packed as
    .gpu/aot/flashinfer-aot-<arch>.tar.gz to carry."""
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(GPU_DIR / "prebuild"))
    setup_env()
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not any((home / d / "libcuda.so").exists() for d in ("lib64", "lib64/stubs")) and not shutil.which(
            "nvidia-smi"):
        # no driver here, and no stub: link against an empty libcuda.so.1; the GPU machine's driver provides it
        stub = GPU_DIR / "stub"
        stub.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-Wl,-soname,libcuda.so.1", "-o",
                        str(stub / "libcuda.so")], check=True)
        os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
    import torch
    from flashinfer.jit import gen_batch_prefill_module
    from flashinfer.jit.quantization import gen_quantization_module

    specs = [gen_quantization_module()] + [
        gen_batch_prefill_module("fa2", dt, dt, dt, torch.int32, d, d, 0, False, False, False)
        for d in head_dims for dt in (torch.bfloat16, torch.float16)]
    out: dict = {"arch_list": arch_list, "modules": {}}
    for spec in specs:
        t = time.monotonic()
        print(f"[prebuild] {spec.name} ...", flush=True)
        spec.build(verbose=False)
        out["modules"][spec.name] = round(time.monotonic() - t, 1)
        print(f"[prebuild] {spec.name}: {out['modules'][spec.name]} s", flush=True)
    AOT_CARRIED.mkdir(parents=True, exist_ok=True)
    arch = "sm" + re.sub(r"[^0-9]", "", arch_list.split()[0])
    out["packed"] = pack_kernels([spec.jit_library_path for spec in specs], AOT_CARRIED, None, arch)
    return out


def installed_aot_dir() -> Path:
    """flashinfer's data/aot in the package this Python would import, found without importing it: the
    path is all this needs, and the import loads torch and flashinfer's JIT setup."""
    import importlib.util

    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("flashinfer is not installed for this Python")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "aot"


def main(argv: list[str] | None = None) -> int:
    """`python -m tools.gpu.kernels install TAR...`: prebuilt kernels (`tools.gpu_check --prebuild`) into
    the installed flashinfer, which then loads them without nvcc (docker/Dockerfile)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="unpack packed kernels into the installed flashinfer's data/aot")
    install.add_argument("tarballs", nargs="+", type=Path)
    install.add_argument("--aot-dir", type=Path, help="where to unpack (default: the installed flashinfer's)")
    args = ap.parse_args(argv)
    aot_dir = args.aot_dir or installed_aot_dir()
    for tar_path in args.tarballs:
        names = unpack_kernels(tar_path, aot_dir)
        if not names:
            raise SystemExit(f"{tar_path}: no <module>/<module>.so inside")
        print(f"{tar_path.name}: {len(names)} modules into {aot_dir}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
