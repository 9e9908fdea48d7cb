"""The side-by-side benchmark's own pieces, without vLLM or llama.cpp: request priorities, arrivals,
the peers' command lines, the server process lifecycle (ready, idle, always stopped) and the report."""

from __future__ import annotations

import contextlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from benchmarks.vs_peers import LLAMACPP_SYSTEMS, SYSTEMS, priorities
from benchmarks.vs_peers_levels import arrivals_for
from benchmarks.vs_peers_report import best_of_each, markdown_table, paired, plot, plot_repeats
from harness.servers import ServerProcess, free_ports, gauge_values, llamacpp_server, wait_idle
from harness.slo_targets import SloTargets


def test_vllm_priority_follows_the_tpot_targets():
    assert priorities(SloTargets()) == {"coding": 0, "chat": 1, "summary": 2}
    assert priorities(SloTargets(tpot_ms={"coding": 300.0, "chat": 20.0,
                                          "summary": 100.0})) == {"chat": 0, "summary": 1, "coding": 2}


def test_arrivals_are_reproducible_and_at_rate():
    a = arrivals_for("poisson", 4.0, 2000, seed=3)
    assert a == arrivals_for("poisson", 4.0, 2000, seed=3) != arrivals_for("poisson", 4.0, 2000, seed=4)
    assert len(a) / a[-1] == pytest.approx(4.0, rel=0.1)
    with pytest.raises(ValueError, match="unknown arrivals"):
        arrivals_for("uniform", 1.0, 10, 0)


def test_llama_server_runs_as_each_system_asks_and_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make peers"):
        llamacpp_server(1, tmp_path / "log", "bf16", directory=tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").touch()
    (tmp_path / "smollm2-bf16.gguf").touch()
    server = llamacpp_server(18100, tmp_path / "log", "bf16", slots=4, spec_type="ngram-mod", directory=tmp_path)
    argv = " ".join(server.argv)
    assert "-np 4 -c 8192" in argv and "--spec-type ngram-mod" in argv and "--host 127.0.0.1 --port 18100" in argv
    assert "--spec-type" not in " ".join(llamacpp_server(18100, tmp_path / "log", "bf16", directory=tmp_path).argv)
    assert set(LLAMACPP_SYSTEMS) <= set(SYSTEMS) and LLAMACPP_SYSTEMS["llamacpp-q4_1-spec"] == ("q4_1", True, False)
    # our draft as llama.cpp's EAGLE-3 draft, beside a model-free type or alone
    with pytest.raises(FileNotFoundError, match="make peers"):
        llamacpp_server(1, tmp_path / "log", "bf16", directory=tmp_path, draft=tmp_path / "draft.gguf")
    (tmp_path / "draft.gguf").touch()
    drafted = llamacpp_server(1, tmp_path / "log", "bf16", directory=tmp_path, draft=tmp_path / "draft.gguf")
    argv = " ".join(drafted.argv)
    assert f"-md {tmp_path / 'draft.gguf'}" in argv and "--spec-type draft-eagle3" in argv
    with pytest.raises(ValueError, match="weights"):
        llamacpp_server(1, tmp_path / "log", "q2_k", directory=tmp_path)


@contextlib.contextmanager
def metrics_endpoint(*texts: str):
    """A /metrics URL answering with each of `texts` in turn, the last one from then on."""
    answers = list(texts)

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write((answers.pop(0) if len(answers) > 1 else answers[0]).encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()


def test_gauges_sum_over_labels():
    with metrics_endpoint('# HELP x\nbusy{model="a"} 2\nbusy{model="b"} 1\nwaiting 0\nother 7\n') as url:
        assert gauge_values(url, ("busy", "waiting")) == [3.0, 0.0]
    assert gauge_values("http://127.0.0.1:1/metrics", ("busy",)) is None


def test_a_server_process_is_ready_when_healthy_and_always_stopped(tmp_path):
    (port,) = free_ports(1)
    # the child starts a grandchild: stopping must end the whole process group
    script = ("import subprocess, sys, http.server; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
              f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), "
              f"http.server.SimpleHTTPRequestHandler).serve_forever()")
    proc = ServerProcess("toy", [sys.executable, "-c", script], {}, f"http://127.0.0.1:{port}/",
                         f"http://127.0.0.1:{port}/none",
                         ("busy",), tmp_path / "toy.log")
    with proc:
        assert proc.proc.poll() is None
        assert wait_idle(proc, timeout_s=1.0) is False  # no metrics endpoint: never known to be idle
    assert proc.proc.poll() is not None


def test_a_server_that_dies_at_start_reports_its_log(tmp_path):
    proc = ServerProcess("broken", [sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"],
                         {}, "http://127.0.0.1:1/",
                         "http://127.0.0.1:1/", (), tmp_path / "broken.log")
    with pytest.raises(RuntimeError, match="exited with 2(.|\n)*bad flag"):
        proc.start(timeout_s=30)


def test_report_table_and_plot(tmp_path):
    row = dict(slo_attainment=0.5, tpot_slo_attainment=0.75, goodput_tok_s=12.3, ttft_ms_p50=250.0, ttft_ms_p99=2500.0,
               tpot_ms_p50=40.0, tpot_ms_p99=None, errors=1, requests=8)
    rows = [{"system": s, "rps": r, **row} for s in ("adaserve", "vllm") for r in (0.5, 1.0)]
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + 4
    assert "| adaserve | 0.5 | 0.50 | 0.75 | 12.3 | 250 ms | 2.5 s | 40 ms | - | - | 1/8 |" in table
    rows[0] |= {"output_tokens_mean": 41.6, "stopped_at_eos": 0.25}
    assert "| 42 (25%) | 1/8 |" in markdown_table(rows)
    plot(rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_each_project_is_reported_at_its_best_configuration():
    rows = [{"system": s, "rps": 1.0, "slo_attainment": a, "goodput_tok_s": g}
            for s, a, g in (("adaserve", 0.9, 10), ("vllm", 0.5, 9), ("vllm-ngram", 0.6, 8), ("llamacpp-bf16", 0.3, 5),
                            ("llamacpp-bf16-spec", 0.3, 6))]
    assert {r["system"] for r in best_of_each(rows)} == {"adaserve", "vllm-ngram", "llamacpp-bf16-spec"}


def test_repeated_runs_are_compared_run_by_run(tmp_path):
    def run(ours: float, theirs: float, levels=(6.0, 8.0)):
        return [{"system": s, "rps": r, "slo_attainment": v} for r in levels
                for s, v in (("ours", ours), ("pow2", theirs))]
    runs = [run(0.9, 0.8), run(0.7, 0.75), run(1.0, 1.0, levels=(4.0,))]
    diffs = paired(runs, "pow2")
    assert set(diffs) == {("ours", 6.0), ("ours", 8.0), ("ours", 4.0)}
    assert diffs[("ours", 8.0)] == pytest.approx([0.1, -0.05]) and diffs[("ours", 4.0)] == [0.0]
    plot_repeats(runs, str(tmp_path / "r.png"), "three runs")
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_first_token_prediction_error_reads_off_the_histogram():
    """The share within each error is exact at the bucket edges; the median error interpolates."""
    from adaserve_backend.triton.metrics import RATIO_BUCKETS
    from benchmarks.prediction_error import HISTOGRAM, histogram_buckets, prediction_error

    def exposition(ratios):
        lines = [f'{HISTOGRAM}_bucket{{le="{le}"}} {sum(r <= le for r in ratios)}' for le in RATIO_BUCKETS]
        return "\n".join(lines + [f'{HISTOGRAM}_bucket{{le="+Inf"}} {len(ratios)}', f"{HISTOGRAM}_count {len(ratios)}"])

    earlier = [0.3, 1.0]
    now = earlier + [0.92, 0.97, 1.02, 1.12, 1.12, 1.3, 1.7, 2.5]  # the 8 requests between the scrapes
    with metrics_endpoint(exposition(earlier), exposition(now)) as url:
        err = prediction_error(histogram_buckets(url), histogram_buckets(url))
    assert err["n"] == 8
    assert err["within"]["5%"] == pytest.approx(2 / 8) and err["within"]["15%"] == pytest.approx(5 / 8)
    assert err["within"]["50%"] == pytest.approx(6 / 8)
    assert err["median_abs_error"] == pytest.approx(0.125)  # 3/8 within 10%, 5/8 within 15%
    assert err["median_ratio"] == pytest.approx(1.125)
    assert prediction_error(None, {}) is None and prediction_error({}, {}) is None


def test_output_length_errors_read_per_class_off_the_histogram():
    from adaserve_backend.triton.metrics import LENGTH_ERROR_BUCKETS
    from benchmarks.prediction_error import LENGTH_HISTOGRAM, class_buckets, describe_lengths, length_errors

    def exposition(errors: dict[str, list[int]]):
        lines = []
        for cls, errs in errors.items():
            lines += [f'{LENGTH_HISTOGRAM}_bucket{{le="{le}",slo_class="{cls}"}} {sum(e <= le for e in errs)}'
                      for le in LENGTH_ERROR_BUCKETS]
            lines.append(f'{LENGTH_HISTOGRAM}_bucket{{le="+Inf",slo_class="{cls}"}} {len(errs)}')
        return "\n".join(lines)

    with metrics_endpoint(exposition({"chat": [3]}), exposition({"chat": [3, 4, 4, 4], "coding": [0, 20]})) as url:
        err = length_errors(class_buckets(url), class_buckets(url))
    assert err["chat"] == {"n": 3, "median_abs_error_tokens": pytest.approx(3.0)}  # 1.5 of 3 in (2, 4]
    assert err["coding"]["n"] == 2
    assert "chat 3 of 3" in describe_lengths(err) and length_errors(None, {}) is None
