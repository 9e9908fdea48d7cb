"""config.py: the engine JSON and its checks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from adaserve_backend.config import EngineConfig, SchedulerConfig
from adaserve_backend.slo import BEST_EFFORT, SLO


def test_engine_json_profile_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "engine.json").write_text(json.dumps({"speculation": {"profile_path": "profile.json"}, "draft": None}))
    cfg = EngineConfig.from_json(str(tmp_path / "engine.json"))
    assert cfg.speculation.profile_path == str(tmp_path / "profile.json") and cfg.draft is None
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"scheduler": {"polcy": "adaserve"}})


def test_a_request_slo_is_its_own_then_its_class_then_the_default_and_a_bad_class_is_an_error():
    sched = dataclasses.replace(EngineConfig().scheduler, default_slo_class="chat")
    default = sched.slo_class(sched.default_slo_class)
    cls = sched.slo_classes[0]
    assert sched.resolve_slo(SLO()) == SLO(default.tpot_ms, default.ttft_ms, default.name)
    assert sched.resolve_slo(SLO(slo_class=cls.name)) == SLO(cls.tpot_ms, cls.ttft_ms, cls.name)
    assert sched.resolve_slo(SLO(42.0, slo_class=cls.name)) == SLO(42.0, cls.ttft_ms, cls.name)
    assert sched.resolve_slo(SLO(42.0)) == SLO(42.0, default.ttft_ms, "custom")  # counted apart in the metrics
    with pytest.raises(ValueError, match="slo_class"):
        sched.resolve_slo(SLO(42.0, 100.0, "no-such-class"))  # unused, still checked
    assert sched.resolve_slo(SLO(slo_class=BEST_EFFORT)).best_effort  # asked for by name


def test_without_a_default_class_a_request_without_targets_is_best_effort():
    sched = EngineConfig().scheduler
    assert sched.default_slo_class is None
    assert sched.resolve_slo(SLO()) == SLO(slo_class=BEST_EFFORT) and SLO().best_effort
    assert sched.resolve_slo(SLO(42.0)) == SLO(42.0, None, "custom")  # no first-token deadline
    assert sched.resolve_slo(SLO(ttft_ms=900.0)) == SLO(None, 900.0, "custom")
    assert SLO(slo_class=BEST_EFFORT).tpot_s == SLO().ttft_s == float("inf")
    with pytest.raises(ValueError, match="best_effort"):
        SchedulerConfig(slo_classes=({"name": BEST_EFFORT, "tpot_ms": 50.0},))


@pytest.mark.parametrize("fields", [dict(tpot_ms=-5.0), dict(tpot_ms=float("nan")), dict(ttft_ms=0.0),
                                    dict(ttft_ms=float("inf")), dict(tpot_ms=True),
                                    dict(slo_class=""), dict(tpot_ms="50")])
def test_an_slo_is_validated_where_it_is_made(fields):
    with pytest.raises(ValueError, match=r"^(tpot_slo_ms|ttft_slo_ms|slo_class) must be"):
        SLO(**fields)


def test_ttft_targets_resolve_like_tpot_ones_and_the_served_classes_match_the_benchmark():
    from adaserve_backend.config import SLOClass
    from harness.slo_targets import DEFAULT_TPOT_SLO_MS, DEFAULT_TTFT_SLO_MS

    sched = SchedulerConfig()
    assert {c.name: (c.tpot_ms, c.ttft_ms) for c in sched.slo_classes} == {
        "coding": (65.0, 2000.0), "chat": (80.0, 2000.0), "summary": (150.0, 5000.0)}  # what the server has served
    assert sched.resolve_slo(SLO(slo_class="summary")).ttft_ms == 5000.0
    assert sched.resolve_slo(SLO(ttft_ms=300.0, slo_class="summary")).ttft_ms == 300.0
    with pytest.raises(ValueError, match="ttft_ms"):
        SLOClass("x", 50.0, 0.0)
    with pytest.raises(ValueError, match="overload"):
        SchedulerConfig(overload="drop")
    served = EngineConfig.from_json("model_repository/adaserve/1/engine.json").scheduler
    assert served.slo_classes == sched.slo_classes and served.overload == "reject"
    assert {c.name: c.tpot_ms for c in served.slo_classes} == DEFAULT_TPOT_SLO_MS
    assert {c.name: c.ttft_ms for c in served.slo_classes} == DEFAULT_TTFT_SLO_MS


def test_engine_threads_is_optional_and_checked():
    assert EngineConfig.from_dict({}).threads is None
    assert EngineConfig.from_dict({"threads": 1}).threads == 1
    with pytest.raises(ValueError, match="threads"):
        EngineConfig.from_dict({"threads": 0})


def test_streaming_hold_is_optional_and_checked():
    assert EngineConfig.from_dict({}).streaming.max_hold_ms == 0.0
    assert EngineConfig.from_dict({"streaming": {"max_hold_ms": 80}}).streaming.max_hold_ms == 80
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="max_hold_ms"):
            EngineConfig.from_dict({"streaming": {"max_hold_ms": bad}})
    assert EngineConfig.from_dict({}).streaming.pace is False
    with pytest.raises(ValueError, match="streaming.pace"):
        EngineConfig.from_dict({"streaming": {"pace": "yes"}})


def test_the_calibration_pool_is_checked_and_the_served_engine_pools():
    assert EngineConfig.from_dict({}).speculation.calibration_pool == 1
    with pytest.raises(ValueError, match="calibration_pool"):
        EngineConfig.from_dict({"speculation": {"calibration_pool": 0}})
    served = EngineConfig.from_json("model_repository/adaserve/1/engine.json").speculation
    assert served.calibrate and served.calibration_pool > 1
