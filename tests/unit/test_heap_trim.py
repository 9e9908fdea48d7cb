"""The heap trimmer: paced by its interval, off at 0, loud on a bad setting, a no-op without glibc."""

import pytest

from adaserve_backend.serving import heap_trim
from adaserve_backend.serving.heap_trim import HeapTrimmer, interval_from_env


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_trims_at_most_once_per_interval(monkeypatch):
    calls = []
    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: calls.append)
    clock = Clock()
    trimmer = HeapTrimmer(10.0, clock=clock)
    trimmer.maybe_trim()
    assert calls == []  # not before the first interval has passed
    clock.t += 10.0
    trimmer.maybe_trim()
    trimmer.maybe_trim()
    assert calls == [0] and trimmer.trims == 1
    clock.t += 9.9
    trimmer.maybe_trim()
    assert trimmer.trims == 1
    clock.t += 0.1
    trimmer.maybe_trim()
    assert trimmer.trims == 2


def test_interval_zero_never_trims(monkeypatch):
    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: pytest.fail("looked up though off"))
    trimmer = HeapTrimmer(0.0)
    trimmer.maybe_trim()
    assert not trimmer.active


def test_without_glibc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(heap_trim, "_malloc_trim", lambda: None)
    clock = Clock()
    trimmer = HeapTrimmer(1.0, clock=clock)
    clock.t += 5
    trimmer.maybe_trim()
    assert not trimmer.active and trimmer.trims == 0


def test_the_environment_sets_the_interval_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv("ADASERVE_HEAP_TRIM_S", "2.5")
    assert interval_from_env() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("ADASERVE_HEAP_TRIM_S", bad)
        with pytest.raises(ValueError, match="ADASERVE_HEAP_TRIM_S"):
            interval_from_env()


def test_the_real_call_runs_here():
    """This machine's libc (glibc in CI) has malloc_trim; one call returns."""
    trimmer = HeapTrimmer(1e-9)
    if not trimmer.active:
        pytest.skip("no malloc_trim in this C library")
    trimmer.maybe_trim()
    assert trimmer.trims == 1
