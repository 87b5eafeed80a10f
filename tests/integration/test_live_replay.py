"""A small live replay: the simulator's queries on real processes answer in the same shape.

A few hundred queries at one load: every one answers 200 over real HTTP from emulated
servers packed into processes, and the live report has the simulator's rows (classes,
fanout types) with the same sample counts. How close the figures are is the benchmark's
business (`tailgate live run`), not this test's: this machine's load decides it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadtests.live import run_live
from loadtests.sim.scenario import load_scenario
from taskserver.service_time import ServiceSpec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO.parent / "shared" / "data" / "tailbench" / "masstree_quantiles.txt"


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
