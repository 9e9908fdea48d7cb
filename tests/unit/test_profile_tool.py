"""tools.profile's whole-engine-step measurement, on a tiny engine: it runs, covers the requested
shapes and yields a usable fit (no timing is asserted)."""

from __future__ import annotations

import dataclasses
import json

from adaserve_backend.config import ModelConfig
from adaserve_backend.cost_model.cost_model import CostModel
from adaserve_backend.cost_model.roofline import Roofline
from adaserve_backend.cost_model.step_cost import EngineStepCost
from tests.engines import small_config
from tests.model_fixtures import our_model, tiny_checkpoint
from tools.profile import engine_step_cost


def test_engine_step_cost_measures_decode_prefill_and_speculative_steps():
    path = tiny_checkpoint("llama")
    cfg = dataclasses.replace(small_config("adaserve"), draft=ModelConfig(path=path))
    model = our_model(path)
    cost = CostModel(Roofline(1.0, 4, 0.1), Roofline(0.1, 1, 0.01), 8)
    out = engine_step_cost(cfg, cost, model, model, batches=[1, 3], contexts=[8, 40], depths=[1, 2])
    shapes = {(p["n"], p["new_tokens"] - p["n"], p["prefills"]) for p in out["points"]}
    assert shapes == {(n, prefill, int(prefill > 0)) for n in (1, 3) for prefill in (0, 16, 128)}  # two chunk sizes
    assert len(out["points"]) == 12
    assert all(p["ms"] > 0 and p["context"] >= p["n"] * 8 for p in out["points"])
    assert {p["depth"] for p in out["speculative_points"]} == {1, 2}
    step = EngineStepCost.from_dict(out)
    assert min(step.to_dict().values()) >= 0 and step.ms(3, 120, 3) > 0


def test_the_speed_probe_runs_on_an_engines_runner_and_gives_its_blocks_back():
    """The benchmark probes the engine it measures; that runner's blocks belong to the scheduler, so
    the probe reserves its own sequences' blocks as a scheduler would, and frees them."""
    from adaserve_backend.profiler import PROBE_TOKENS, probe_ms
    from tests.engines import assert_all_blocks_free, make_engine

    path = tiny_checkpoint("llama")
    engine = make_engine(path, path, "adaserve", num_blocks=1024)
    assert engine.target.blocks.scheduler_owned
    assert set(probe_ms(engine.target)) == {str(n) for n in PROBE_TOKENS}
    assert_all_blocks_free(engine)


def test_an_engine_that_calibrates_plans_with_what_it_measured_and_starts_warm(tmp_path, monkeypatch):
    """speculation.calibrate: the cost model comes from this machine (no profile file needed), B from
    its knee, the calibration kept in the machine's record (calibration_pool), and the warm-up's
    requests leave no trace: no work, no blocks held, counters reset."""
    from adaserve_backend.engine import Engine
    from adaserve_backend.profiler import CALIBRATION_TOKENS
    from tests.engines import EOS, assert_all_blocks_free

    path = tiny_checkpoint("llama")
    cfg = small_config("adaserve", num_blocks=1024)
    cfg = dataclasses.replace(cfg, speculation=dataclasses.replace(cfg.speculation, calibrate=True,
                                                                   profile_path="/no/such/file",
                                                                  calibration_pool=3))
    monkeypatch.setenv("ADASERVE_CACHE_DIR", str(tmp_path))
    engine = Engine(cfg, target=our_model(path), draft=our_model(path), eos_token_ids=[EOS])
    assert [n for n, _ in engine.cost.verify_points] == list(CALIBRATION_TOKENS)[:-1]  # 256: more than 1024 blocks
    (record,) = (tmp_path / "calibration").glob("*.json")  # the first start's: what it measured is what it fits
    (run,) = json.loads(record.read_text())["runs"]
    assert [(int(n), ms) for n, ms in run["verify"].items()] == list(engine.cost.verify_points)
    assert engine.budget == engine.cost.budget >= 1 and engine.scheduler.slo_admission
    assert not engine.has_work() and engine.decode_iterations > 0 and not engine.iteration_stats
    assert_all_blocks_free(engine)
    est = engine.estimator  # what random tokens yield is forgotten; what the steps cost is kept
    assert not est.tried and not est.by_load and est.scored == 0
    assert est.size.explore_every == est.__class__(None, 1, None).size.explore_every
    assert est.t_iter > 0 and est.kind_correction
    import gc  # the startup heap is frozen: no full collection walks it while requests are served

    assert gc.get_freeze_count() > 0
    gc.unfreeze()  # the rest of the test process collects as usual
