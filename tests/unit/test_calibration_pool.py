"""Startup calibrations pooled per machine: the rooflines are fitted to the per-size medians of the
last few, a different machine (threads, models, CPU) keeps its own record, and a cache that cannot be
written leaves this start's calibration alone."""

from __future__ import annotations

import json
from types import SimpleNamespace

from adaserve_backend import calibration_pool
from adaserve_backend.calibration_pool import engine_parts, key_of, pooled

PARTS = {"machine": {"model name": "some CPU"}, "threads": 2, "target": {"path": "m", "dtype": "bfloat16"}}


def test_the_fit_sees_the_median_of_the_last_few_per_size(tmp_path):
    ms = [10.0, 30.0, 20.0, 50.0, 40.0]
    for i, m in enumerate(ms):
        verify, steps = pooled(PARTS, {1: m, 8: 2 * m}, {1: m / 10}, keep=3, root=tmp_path)
    assert verify == {1: 40.0, 8: 80.0} and steps == {1: 4.0}  # median of 20, 50, 40: the oldest two dropped
    (record,) = (tmp_path / "calibration").glob("*.json")
    assert [r["verify"]["1"] for r in json.loads(record.read_text())["runs"]] == [20.0, 50.0, 40.0]


def test_sizes_not_measured_every_time_are_left_out(tmp_path):
    pooled(PARTS, {1: 10.0, 256: 90.0}, {1: 1.0}, keep=5, root=tmp_path)
    verify, _ = pooled(PARTS, {1: 12.0}, {1: 1.0}, keep=5, root=tmp_path)  # less cache room this time
    assert verify == {1: 11.0}


def test_another_machine_keeps_its_own_record_and_one_means_this_start_alone(tmp_path):
    pooled(PARTS, {1: 10.0}, {1: 1.0}, keep=5, root=tmp_path)
    other = {**PARTS, "threads": 4}
    assert key_of(other) != key_of(PARTS)
    assert pooled(other, {1: 30.0}, {1: 3.0}, keep=5, root=tmp_path) == ({1: 30.0}, {1: 3.0})
    assert pooled(PARTS, {1: 50.0}, {1: 5.0}, keep=1, root=tmp_path) == ({1: 50.0}, {1: 5.0})
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 2  # keep=1 reads and writes nothing


def test_an_unwritable_cache_uses_this_calibration_alone(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    assert pooled(PARTS, {1: 10.0}, {1: 1.0}, keep=5, root=blocked) == ({1: 10.0}, {1: 1.0})


def test_the_machine_is_named_by_the_cpu_the_kernel_reports():
    info = calibration_pool.machine()
    assert isinstance(info, dict) and all(isinstance(v, str) for v in info.values())


def test_a_change_to_the_kernels_starts_a_new_record(monkeypatch):
    """Calibrations of slower kernels would outvote a faster build's first starts: the kernels' code
    (and whether they are off) is part of the machine."""
    config = SimpleNamespace(target={"path": "m"}, draft=None, target_cache=SimpleNamespace(block_size=128))
    with_kernels = engine_parts(config, None, None, threads=2)
    monkeypatch.setenv("ADASERVE_NO_CPU_KERNEL", "1")
    without = engine_parts(config, None, None, threads=2)
    assert with_kernels["kernels"] != without["kernels"] and key_of(with_kernels) != key_of(without)
