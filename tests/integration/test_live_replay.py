"""A small live replay: the simulator's queries on real processes answer in the same shape.

A few hundred queries at one load: every one answers 200 over real HTTP from emulated
servers packed into processes, and the live report has the simulator's rows (classes,
fanout types) with the same sample counts; on a fast and a 2x slower pool, the gateway
picks each query's servers (least-wait) and every task runs on one of them. How close the
figures are is the benchmark's business (`tailgate live run`), not this test's: this
machine's load decides it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadtests.live import run_live
from loadtests.sim.scenario import load_scenario
from loadtests.sim.tailbench import TAILBENCH_DIR
from taskserver.service_time import ServiceSpec

pytestmark = [pytest.mark.integration, pytest.mark.solo]

REPO = Path(__file__).resolve().parents[2]
TABLE = TAILBENCH_DIR / "masstree_quantiles.txt"


def test_a_small_replay_answers_every_query_and_reports_like_the_simulator() -> None:
    scn = load_scenario(REPO / "loadtests" / "scenarios" / "fanout-single-class.toml")
    scn = scn.with_service(ServiceSpec(kind="quantiles", path=str(TABLE)))
    scn = replace(scn, run=replace(scn.run, queries=300))
    run = run_live(
        scn, 0.2, scale=100.0, per_process=50, service_path=str(TABLE), wait_estimates=True
    )
    assert run.answered == {200: 300}, run.to_text()
    assert run.sent == 300
    live, sim = run.live, run.sim
    assert live.classes.keys() == sim.classes.keys()
    for name in sim.classes:
        assert live.classes[name].samples == sim.classes[name].samples
        assert live.fanout_types[name].keys() == sim.fanout_types[name].keys()
    # where live time goes beyond the model, from every answered task and query
    assert set(run.gap) == {"emulation", "gateway+wire", "query, live - simulated"}
    assert all(p50 <= p99 for p50, p99 in run.gap.values())
    # the gateway's queue-wait estimates against the waits the tasks had (QLM §6)
    assert run.waits.keys() == {"all", "I"} and run.waits["all"]["tasks"] > 0
    assert run.waits["all"]["p50"] <= run.waits["all"]["p99"]
    text = run.to_text()
    assert "== live (time scale 100" in text and "driver lateness p99" in text
    assert "queue-wait estimates (QLM §6" in text


HETEROGENEOUS = """
name = "tiny-least-wait"
[servers]
count = 8
[[servers.pools]]
name = "fast"
count = 4
service_scale = 1.0
[[servers.pools]]
name = "slow"
count = 4
service_scale = 2.0
[arrivals]
process = "poisson"
[fanout]
distribution = { "1" = 3, "4" = 1 }
[[classes]]
name = "I"
percentile = 99.0
slo_ms = 2.0
share = 1.0
[run]
policy = "tf-edfq"
pick = "least-wait"
queries = 300
seed = 1
"""


def test_a_heterogeneous_least_wait_replay_lets_the_gateway_pick(tmp_path: Path) -> None:
    path = tmp_path / "tiny-least-wait.toml"
    path.write_text(HETEROGENEOUS)
    scn = load_scenario(path).with_service(ServiceSpec(kind="quantiles", path=str(TABLE)))
    run = run_live(scn, 0.3, scale=100.0, per_process=4, service_path=str(TABLE))
    assert run.answered == {200: 300}, run.to_text()
    assert run.sent == 300 and run.targets == "least-wait"
    live, sim = run.live, run.sim
    assert live.classes.keys() == sim.classes.keys() == {"I"}
    assert live.classes["I"].samples == sim.classes["I"].samples
    assert live.fanout_types["I"].keys() == sim.fanout_types["I"].keys()
    # Every task ran on one of the two pools; the gateway chose the servers, so queries
    # compare with the simulator's as distributions, not one by one.
    assert run.pool_tasks.keys() == {"fast", "slow"}
    assert sum(run.pool_tasks.values()) == pytest.approx(1.0)
    assert set(run.gap) == {"emulation", "gateway+wire"}
    text = run.to_text()
    assert "servers by the gateway, least-wait" in text and "tasks per pool (live): fast" in text
