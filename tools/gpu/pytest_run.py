"""The `tests` step: pytest tests/gpu (FlashInfer and SDPA on CUDA against the torch reference, the engine on
cuda against transformers) and the CPU tests of the plan inputs, in a subprocess told which FlashInfer kernels
to leave out, summarized from its JUnit XML (with what tests report through record_property, such as bf16's
agreement with float32); the log is copied out with the results."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tools.gpu.env import ROOT, child_env


def run_tests(ctx) -> dict:
    xml = ctx.run_dir / "pytest.xml"
    log = ctx.run_dir / "gpu-tests.log"
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "tests/unit/test_flashinfer_plan.py", "-q", "-ra",
           "-p", "no:cacheprovider", "--confcutdir=tests/gpu", "-o", "addopts=",
           "-o", "junit_family=xunit1", f"--junitxml={xml}"]  # xunit1: it keeps record_property's values
    extra = {"GPU_CHECK_NO_FLASHINFER": ctx.no_flashinfer} if ctx.no_flashinfer else {}
    if ctx.flashinfer_dtypes is not None:  # kernels that did not compile are not tried again there
        extra["GPU_CHECK_FLASHINFER_DTYPES"] = ",".join(ctx.flashinfer_dtypes) or "none"
    limit = max(30.0, min(300.0, ctx.left() - 150))
    t = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=child_env(extra), capture_output=True, text=True, timeout=limit)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        said = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        text, code = "".join(said) + f"\n(timed out after {limit:.0f} s)", None
    log.write_text(text)
    ctx.copy_out(log)
    out = {"returncode": code, "seconds": round(time.monotonic() - t, 1), "log": str(log.relative_to(ROOT))}
    out.update(junit_summary(xml) if xml.exists() else {"summary": text.strip().splitlines()[-1:] or None})
    if code != 0:
        raise RuntimeError(f"pytest exited {code}: {out.get('failed', '?')} failed, {out.get('errors', '?')} errors")
    return out


def junit_summary(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failures = []
    skips: dict[str, int] = {}
    reported: dict[str, dict[str, str]] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for prop in case.iter("property"):
            reported.setdefault(name, {})[prop.get("name", "")] = prop.get("value", "")
        for tag in ("failure", "error"):
            for f in case.findall(tag):
                failures.append({"test": name, "kind": tag, "message": (f.get("message") or "")[:500]})
        for s in case.findall("skipped"):
            reason = (s.get("message") or "")[:200]
            skips[reason] = skips.get(reason, 0) + 1
    return {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
            "skip_reasons": skips, "failures": failures, "reported": reported}
