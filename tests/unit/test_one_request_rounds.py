"""benchmarks.one_request_rounds' report: per-round medians and the per-prompt ratio to llama-server."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks.one_request_rounds import REFERENCE, report


def test_report_gives_round_medians_and_per_prompt_ratios(tmp_path, capsys):
    tpots = {"adaserve:q4_1_int8": [5.0, 6.0, 4.0, 8.0], REFERENCE: [10.0, 10.0, 8.0, 8.0]}
    out = tmp_path / "rounds"
    report(tpots, SimpleNamespace(prompts=2, rounds=2, tokens=64, out=str(out)))
    summary = json.loads((tmp_path / "rounds.json").read_text())["summary"]
    ours = summary["adaserve:q4_1_int8"]
    assert ours["round_medians_ms"] == [5.5, 6.0] and ours["median_ms"] == 5.5
    assert ours["ratio_to_reference"] == 0.55  # median of 0.5, 0.6, 0.5, 1.0
    assert summary[REFERENCE]["ratio_to_reference"] == 1.0
    assert (tmp_path / "rounds.png").exists() and "ratio to llama-server q4_1: median 0.55" in capsys.readouterr().out
