"""benchmarks/llama_bench.py goes on past a llama-bench that crashes on one GGUF (it segfaulted on the
Q4_1 and Q8_0 files on an AMX Xeon)."""

import json
import subprocess

from benchmarks import llama_bench


def test_a_crash_on_one_file_is_reported_and_the_others_measured(monkeypatch, tmp_path, capsys):
    files = {w: tmp_path / f"{w}.gguf" for w in ("bf16", "q4_1")}
    for f in files.values():
        f.write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-bench").write_text("")
    monkeypatch.setattr(llama_bench, "LLAMACPP_DIR", tmp_path)
    monkeypatch.setattr(llama_bench, "llamacpp_gguf", lambda w: files[w])
    rows = [{"n_prompt": 512, "avg_ts": 400.0, "stddev_ts": 4.0}, {"n_prompt": 0, "avg_ts": 50.0, "stddev_ts": 1.0}]

    def run(argv, **_):
        if str(files["q4_1"]) in argv:
            return subprocess.CompletedProcess(argv, -11, "", "")
        return subprocess.CompletedProcess(argv, 0, json.dumps(rows), "")

    monkeypatch.setattr(llama_bench.subprocess, "run", run)
    out = llama_bench.llama_bench(weights=("bf16", "q4_1"))
    assert set(out) == {"bf16"} and out["bf16"]["decode_ms"] == 20.0 and out["bf16"]["prefill_tok_s"] == 400.0
    assert "llama-bench failed on q4_1 (signal 11)" in capsys.readouterr().out
