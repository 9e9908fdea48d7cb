"""config.py: the engine JSON and its checks."""

from __future__ import annotations

import json

import pytest

from adaserve_backend.config import EngineConfig


def test_engine_json_profile_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "engine.json").write_text(json.dumps({"speculation": {"profile_path": "profile.json"}, "draft": None}))
    cfg = EngineConfig.from_json(str(tmp_path / "engine.json"))
    assert cfg.speculation.profile_path == str(tmp_path / "profile.json") and cfg.draft is None
    with pytest.raises(ValueError, match="unknown keys"):
        EngineConfig.from_dict({"scheduler": {"polcy": "adaserve"}})


def test_a_request_slo_is_its_own_then_its_class_then_the_default_and_a_bad_class_is_an_error():
    sched = EngineConfig().scheduler
    default = sched.slo_ms(sched.default_slo_class)
    name, ms = sched.slo_classes[0].name, sched.slo_classes[0].tpot_ms
    assert sched.request_slo_ms(None, None) == default
    assert sched.request_slo_ms(None, name) == ms
    assert sched.request_slo_ms(42.0, name) == 42.0
    with pytest.raises(ValueError, match="slo_class"):
        sched.request_slo_ms(42.0, "no-such-class")  # unused, still checked


def test_ttft_targets_resolve_like_tpot_ones_and_the_served_classes_match_the_benchmark():
    from adaserve_backend.config import SchedulerConfig, SLOClass
    from harness.slo_targets import DEFAULT_TTFT_SLO_MS

    sched = SchedulerConfig()
    assert {c.name: c.ttft_ms for c in sched.slo_classes} == DEFAULT_TTFT_SLO_MS
    assert sched.request_ttft_ms(None, None) == sched.slo_class(sched.default_slo_class).ttft_ms
    assert sched.request_ttft_ms(None, "summary") == 5000.0 and sched.request_ttft_ms(300.0, "summary") == 300.0
    with pytest.raises(ValueError, match="slo_class"):
        sched.request_ttft_ms(300.0, "no-such-class")
    with pytest.raises(ValueError, match="ttft_ms"):
        SLOClass("x", 50.0, 0.0)
    with pytest.raises(ValueError, match="overload"):
        SchedulerConfig(overload="drop")
    served = EngineConfig.from_json("model_repository/adaserve/1/engine.json").scheduler
    assert {c.name: c.ttft_ms for c in served.slo_classes} == DEFAULT_TTFT_SLO_MS and served.overload == "reject"


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
