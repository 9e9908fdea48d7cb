"""The SLO-aware router's choice (replica_routing.py) from made-up replica loads, and the load a real
(tiny) engine publishes. No Ray here."""

from __future__ import annotations

import math

from adaserve_backend.replica_routing import Job, ReplicaLoad, measure_load, prefix_hints, rank, slack
from adaserve_backend.request import Request
from adaserve_backend.slo import SLO
from tests.engines import make_engine
from tests.model_fixtures import tiny_checkpoint

PROFILE = "model_repository/adaserve/1/profile-cpu.json"  # a cost model to predict with (its machine's)


def load(running=2, waiting=0, first=0.2, per_token=0.001, tpot=0.03, tightest=None, healthy=True, at=100.0):
    return ReplicaLoad(running, waiting, 16, running, first, per_token, tpot, tightest, healthy, at)


def test_the_replica_with_most_slack_on_both_targets_goes_first():
    job = Job(prompt_tokens=500, tpot_s=0.05, ttft_s=1.0)
    loads = {"busy": load(first=0.4), "idle": load(first=0.1), "slow": load(tpot=0.06)}
    assert rank(job, loads) == [["idle"], ["busy"], ["slow"]]  # slow's TPOT would miss: last
    assert slack(job, loads["slow"]) < 0 <= slack(job, loads["busy"]) < slack(job, loads["idle"])


def test_a_best_effort_request_goes_to_the_least_occupied_replica():
    loads = {"a": load(running=6), "b": load(running=1, waiting=1), "c": load(running=3)}
    assert rank(Job(100), loads) == [["b"], ["c"], ["a"]]


def test_requests_sent_since_a_replica_published_count_against_it():
    """Between two loads published at the same moment, the one just sent three long prompts loses."""
    job = Job(prompt_tokens=200, tpot_s=0.05, ttft_s=2.0)
    loads = {"a": load(), "b": load()}
    assert rank(job, loads, {"a": [800, 800, 800]})[0] == ["b"]
    assert rank(job, loads, {"b": [800]})[0] == ["a"]
    # and enough of them push it past the first-token target
    assert slack(job, loads["a"], [800] * 3) < 0.5 * slack(job, loads["a"])


def test_a_running_request_with_a_tight_tpot_target_is_not_pushed_past_it():
    job = Job(prompt_tokens=10)  # best effort itself, but it would decode beside the tight one
    loads = {"tight": load(running=1, tpot=0.030, tightest=0.025), "loose": load(running=5, tpot=0.040, tightest=0.1)}
    assert rank(job, loads) == [["loose"], ["tight"]]


def test_unpublished_replicas_come_after_those_that_meet_and_unhealthy_ones_never():
    job = Job(prompt_tokens=10, tpot_s=0.05, ttft_s=1.0)
    loads = {"meets": load(), "new": None, "misses": load(first=2.0), "dead": load(healthy=False)}
    assert rank(job, loads) == [["meets"], ["new"], ["misses"]]


def test_without_a_cost_model_there_is_nothing_to_miss():
    blind = ReplicaLoad(1, 0, 16, 1)
    assert math.isinf(slack(Job(10, 0.05, 1.0), blind))


def test_the_load_a_real_engine_publishes_grows_with_its_backlog():
    engine = make_engine(tiny_checkpoint("llama"), None, "continuous", profile_path=PROFILE)
    idle = measure_load(engine.scheduler, engine.num_waiting())
    assert idle.running == idle.waiting == 0 and idle.healthy and idle.first_token_s > 0
    for i in range(3):
        engine.add_request(Request(f"r{i}", list(range(3, 43)), max_tokens=8, slo=SLO(tpot_ms=40.0)))
    engine.step()
    busy = measure_load(engine.scheduler, engine.num_waiting())
    assert busy.running + busy.waiting == 3 and busy.tightest_tpot_s is not None and busy.tightest_tpot_s <= 0.040
    assert busy.first_token_s >= idle.first_token_s and busy.first_token_s_per_token > 0
    assert ReplicaLoad.from_dict(busy.as_dict()) == busy


def test_a_replica_holding_the_prompts_prefix_gives_the_earlier_first_token():
    ids = list(range(3, 3 + 1000))
    hints = prefix_hints(ids, 16)
    assert len(hints) == 62 and hints == prefix_hints(ids + [7], 16)[:62]  # the last token's block is never reused
    job = Job(1000, 0.05, 1.0, prefix_blocks=hints, block_size=16)
    cold, warm = load(first=0.10), ReplicaLoad(2, 0, 16, 2, 0.15, 0.001, 0.03, at=100.0,
                                               cached_blocks=("x",) + hints[:40])
    assert warm.holds(job) == 640 and cold.holds(job) == 0
    assert rank(job, {"cold": cold, "warm": warm}) == [["warm"], ["cold"]]  # 0.15 + 0.36 s against 0.10 + 1.0 s
    assert ReplicaLoad.from_dict(warm.as_dict()) == warm


def test_a_replica_names_the_blocks_its_prefix_cache_took():
    engine = make_engine(tiny_checkpoint("llama"), None, "continuous", profile_path=PROFILE)
    prompt = list(range(3, 3 + 200))
    engine.add_request(Request("a", prompt, max_tokens=4))
    while engine.has_work():
        engine.step()
    published = measure_load(engine.scheduler, engine.num_waiting())
    bs = engine.scheduler.target_blocks.block_size
    job = Job(len(prompt), prefix_blocks=prefix_hints(prompt, bs), block_size=bs)
    assert engine.scheduler.target_blocks.prefix_caching and published.holds(job) == (len(prompt) - 1) // bs * bs > 0
