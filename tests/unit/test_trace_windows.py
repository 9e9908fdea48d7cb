"""Real-trace arrival windows (harness/trace_windows.py): on small synthetic traces, and on the Azure
traces where this machine has them."""

from __future__ import annotations

import pytest

from harness.trace_windows import (
    NAMED_TRACES,
    TRACES_ENV,
    TraceMissing,
    is_trace,
    load_trace,
    peak_arrivals,
    trace_path,
    trace_window,
    traces_dir,
)
from harness.workload import TraceRow


def rows_at(times: list[float]) -> list[TraceRow]:
    return [TraceRow(t, 100, 10) for t in times]


def write_trace(path, times: list[float]) -> None:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in times:
        minutes, seconds = divmod(t, 60)
        lines.append(f"2023-11-16 18:{int(minutes):02d}:{seconds:010.7f},100,10")
    path.write_text("\n".join(lines) + "\n")


def test_a_window_is_n_consecutive_arrivals_at_the_rate_from_zero():
    times = [i * 0.5 + (0.3 if i % 7 == 0 else 0.0) for i in range(200)]  # a little uneven
    window = trace_window(rows_at(times), rps=4.0, n=50, seed=3)
    assert len(window) == 50 and window[0] == 0.0
    assert (len(window) - 1) / window[-1] == pytest.approx(4.0)  # mean rate over its n-1 gaps
    assert window == sorted(window)
    # some stretch of consecutive rows, its times shifted to 0 and scaled by one factor
    def stretch(start: int) -> list[float]:
        c = window[-1] / (times[start + 49] - times[start])
        return [(t - times[start]) * c for t in times[start:start + 50]]

    assert any(window == pytest.approx(stretch(s)) for s in range(151))


def test_windows_are_deterministic_per_seed_and_differ_between_seeds():
    times = [i + (i % 5) * 0.17 + (i % 3) * 0.05 for i in range(500)]
    rows = rows_at(times)
    assert trace_window(rows, 2.0, 40, seed=1) == trace_window(rows, 2.0, 40, seed=1)
    windows = {tuple(trace_window(rows, 2.0, 40, seed=s)) for s in range(6)}
    assert len(windows) > 1


def test_window_edges():
    rows = rows_at([0.0, 1.0, 3.0])
    assert trace_window(rows, 1.0, 3, seed=0) == pytest.approx([0.0, 2 / 3, 2.0])  # the whole trace, 2 gaps in 2 s
    assert trace_window(rows, 5.0, 1, seed=0) == [0.0]
    assert trace_window(rows, 5.0, 0, seed=0) == []
    with pytest.raises(ValueError, match="longer than the trace"):
        trace_window(rows, 1.0, 4, seed=0)


def test_peak_arrivals_counts_the_densest_five_seconds():
    assert peak_arrivals([]) == 0
    assert peak_arrivals([0.0]) == 1
    assert peak_arrivals([0.0, 1.0, 4.99, 5.0, 9.0]) == 3  # [0, 5) holds 0, 1, 4.99; 5.0 starts the next
    assert peak_arrivals([10.0, 1.0, 2.0, 2.5, 30.0]) == 3  # order does not matter
    assert peak_arrivals([0.0, 0.5, 0.9], window_s=0.5) == 2


def test_named_traces_resolve_under_the_override_and_are_read_once(tmp_path, monkeypatch):
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert traces_dir() == tmp_path
    with pytest.raises(TraceMissing, match=f"no trace file at .*{NAMED_TRACES['azure-code']}.*{TRACES_ENV}"):
        load_trace("azure-code")
    write_trace(tmp_path / NAMED_TRACES["azure-code"], [0.0, 2.0, 1.0, 3.5])
    rows = load_trace("azure-code")
    assert [r.time_s - rows[0].time_s for r in rows] == pytest.approx([0.0, 1.0, 2.0, 3.5])  # in time order
    assert load_trace("azure-code") is rows  # parsed once
    other = tmp_path / "other.csv"
    write_trace(other, [0.0, 1.0])
    assert trace_path(f"azure:{other}") == other and len(load_trace(f"azure:{other}")) == 2
    write_trace(other, [0.0, 1.0, 2.0])  # replaced in place: read again
    assert len(load_trace(f"azure:{other}")) == 3
    assert is_trace("azure-conv") and is_trace("azure:x.csv") and not is_trace("poisson")
    with pytest.raises(ValueError, match="names no trace"):
        trace_path("poisson")
    with pytest.raises(TraceMissing):
        load_trace(f"azure:{tmp_path / 'none.csv'}")


def test_the_default_folder_is_shared_traces_beside_the_checkout(monkeypatch):
    from adaserve_backend import PROJECT_ROOT

    monkeypatch.delenv(TRACES_ENV, raising=False)
    assert traces_dir() == PROJECT_ROOT.parent / "shared" / "traces"


@pytest.mark.parametrize("name", sorted(NAMED_TRACES))
def test_the_azure_traces_have_bursts(name, monkeypatch):
    monkeypatch.delenv(TRACES_ENV, raising=False)
    try:
        rows = load_trace(name)
    except TraceMissing as e:
        pytest.skip(f"the trace is not on this machine: {e}")
    assert len(rows) > 5000
    windows = [trace_window(rows, 4.0, 240, seed=s) for s in range(5)]
    assert all(len(w) == 240 and w[0] == 0.0 and w[-1] == pytest.approx(239 / 4.0) for w in windows)
    # 20 arrivals in 5 s on average; the code trace's bursts reach several times that
    peaks = [peak_arrivals(w) for w in windows]
    assert max(peaks) >= {"azure-code": 60, "azure-conv": 25}[name] and len(set(map(tuple, windows))) == 5
