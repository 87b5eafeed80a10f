"""The simulator against queueing theory, the Tailbench files and the live task server."""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.config import ConfigError
from loadtests.sim.engine import ServerSim, simulate
from loadtests.sim.maxload import find_max_load
from loadtests.sim.report import percentile, report
from loadtests.sim.scenario import Scenario, parse_scenario
from taskserver.executors import Executor
from taskserver.queues import create_task_queue
from taskserver.server import TaskService
from taskserver.service_time import QuantileFileServiceTime
from taskserver.wire import thrift


def scenario(**sections: Any) -> Scenario:
    doc: dict[str, Any] = {
        "servers": {"count": 1},
        "fanout": {"fixed": 1},
        "classes": [{"name": "I", "percentile": 99, "slo_ms": 1000.0}],
        "service": {"kind": "exponential", "mean_ms": 1.0},
        "run": {"policy": "fifo", "queries": 200_000, "seed": 7},
    }
    doc.update(sections)
    return parse_scenario(doc)


def test_mm1_fifo_matches_the_closed_forms() -> None:
    # M/M/1, rho = 0.5, mu = 1/ms: response time ~ Exp(mu - lambda): mean 2 ms, p99 ln(100)*2.
    res = simulate(scenario(), 0.5)
    lat = res.latency_ms
    assert lat.mean() == pytest.approx(2.0, rel=0.04)
    assert percentile(lat, 99) == pytest.approx(math.log(100) * 2.0, rel=0.05)
    assert res.utilisation == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize(("k", "queries"), [(1, 200_000), (10, 40_000), (100, 20_000)])
def test_fifo_at_near_zero_load_gives_the_models_unloaded_p99_by_fanout(
    tailbench_dir: Path, k: int, queries: int
) -> None:
    # At near-zero load a query's latency is the largest of its k service times, so its
    # p99 is the model's x_99^u(k) = F^-1(0.99^(1/k)). Judged where a sample can judge it:
    # the share of queries within x_99^u(k) is 0.99 up to the binomial noise of `queries`
    # (4 standard deviations); an empirical p99 from 20,000 fanout-100 queries would not
    # be (x_99^u(100) sits where the table ends and the tail begins).
    path = tailbench_dir / "masstree_quantiles.txt"
    exact = QuantileFileServiceTime.from_file(path).quantile(0.99 ** (1 / k))
    scn = scenario(
        servers={"count": 100},
        fanout={"fixed": k},
        service={"kind": "quantiles", "path": str(path)},
        run={"policy": "fifo", "queries": queries, "seed": 3},
    )
    # At load 5e-4 a fanout-100 query finds one of its servers busy 5% of the time: 1e-6.
    res = simulate(scn, 1e-6)
    n = res.latency_ms.size
    within = float(np.mean(res.latency_ms <= exact))
    assert abs(within - 0.99) <= 4 * math.sqrt(0.99 * 0.01 / n), within
    assert res.miss_ratio == 0.0
    # The authors' own Monte-Carlo figures (the shipped table) agree within 2%.
    ref = np.loadtxt(tailbench_dir / "masstree_unloaded_p99_by_fanout.txt")[k - 1]
    assert exact == pytest.approx(ref, rel=0.02)


def test_same_seed_same_result_other_seed_other_result() -> None:
    scn = scenario(
        servers={"count": 20},
        fanout={"distribution": {"1": 0.8, "5": 0.2}},
        run={"policy": "tf-edfq", "queries": 20_000, "seed": 11},
    )
    a, b = simulate(scn, 0.7), simulate(scn, 0.7)
    assert np.array_equal(a.latency_ms, b.latency_ms)
    assert a.missed == b.missed
    c = simulate(replace(scn, run=replace(scn.run, seed=12)), 0.7)
    assert not np.array_equal(a.latency_ms, c.latency_ms)


def test_policies_see_the_same_queries() -> None:
    scn = scenario(
        servers={"count": 10},
        fanout={"distribution": {"1": 0.9, "10": 0.1}},
        classes=[{"name": "A", "slo_ms": 30.0}, {"name": "B", "slo_ms": 60.0}],
        run={"policy": "fifo", "queries": 20_000, "seed": 5},
    )
    fifo, edf = simulate(scn, 0.8, policy="fifo"), simulate(scn, 0.8, policy="tf-edfq")
    assert np.array_equal(fifo.cls, edf.cls) and np.array_equal(fifo.fanout, edf.fanout)
    assert fifo.utilisation == edf.utilisation  # same work, other order
    assert not np.array_equal(fifo.latency_ms, edf.latency_ms)


def test_tf_edfq_protects_large_fanouts_under_load(tailbench_dir: Path) -> None:
    scn = scenario(
        servers={"count": 100},
        fanout={"distribution": {"1": 100 / 111, "10": 10 / 111, "100": 1 / 111}},
        classes=[{"name": "I", "percentile": 99, "slo_ms": 1.0}],
        service={"kind": "quantiles", "path": str(tailbench_dir / "masstree_quantiles.txt")},
        run={"policy": "fifo", "queries": 150_000, "seed": 1},
    )
    fifo = report(simulate(scn, 0.5, policy="fifo"))
    edf = report(simulate(scn, 0.5, policy="tf-edfq"))
    k100 = lambda r: r.fanout_types["I"]["100"].latency_ms  # noqa: E731
    k1 = lambda r: r.fanout_types["I"]["1"].latency_ms  # noqa: E731
    # Fanout-aware deadlines move tail latency from the big queries to the small ones.
    assert k100(edf) < k100(fifo)
    assert k1(edf) > k1(fifo)


def test_unreachable_slo_queries_are_rejected_like_the_gateway_does() -> None:
    scn = scenario(
        servers={"count": 10},
        fanout={"distribution": {"1": 0.5, "10": 0.5}},
        classes=[{"name": "I", "percentile": 99, "slo_ms": 6.0}],
        run={"policy": "tf-edfq", "queries": 10_000, "seed": 2},
    )
    res = simulate(scn, 0.3)
    # x_99^u(1) = ln(100) = 4.6 ms fits in 6 ms; x_99^u(10) = 6.9 ms does not.
    assert set(np.unique(res.fanout)) == {1}
    assert res.rejected_queries == pytest.approx(0.5 * res.measured_queries, rel=0.05)
    assert res.accepted_load == pytest.approx(0.3 * 0.5, rel=0.05)


def test_bisection_brackets_the_threshold_with_the_tolerance() -> None:
    calls = []

    def fake_run(scn: Scenario, load: float, policy: str):
        calls.append(load)
        # A single query class whose p99 crosses its SLO at load 0.37.
        lat = np.full(2_000, 1.0 if load <= 0.37 else 3.0)
        from loadtests.sim.engine import SimResult

        return SimResult(
            scn,
            load,
            policy,
            lat,
            np.zeros(2_000, np.int32),
            np.ones(2_000, np.int64),
            2_000,
            0,
            0,
            2_000,
            load,
        )

    scn = scenario(classes=[{"name": "I", "slo_ms": 2.0}])
    out = find_max_load(scn, "fifo", tol=0.01, run=fake_run)
    lo, hi = out.bracket
    assert lo <= 0.37 < hi and hi - lo <= 0.01
    assert out.max_load == lo and len(calls) == len(out.probes) <= 10


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"servers": {"count": 0}}, "servers.count"),
        ({"arrivals": {"process": "bursty"}}, "arrivals.process"),
        ({"fanout": {"fixed": 200}}, "fanout"),
        ({"fanout": {"distribution": {"x": 1.0}}}, "fanout.distribution"),
        ({"classes": [{"name": "A", "slo_ms": -1}]}, "classes[0].slo_ms"),
        ({"run": {"policy": "edf"}}, "run.policy"),
    ],
)
def test_bad_scenarios_name_the_key(doc: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        scenario(**doc)
    assert err.value.key == key, str(err.value)


# ----- the simulator and the live task server order tasks identically -------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _ManualExecutor(Executor):
    """Starts are recorded; each task ends when the test says its service time is up."""

    name = "manual"

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.started: list[int] = []
        self.running: tuple[float, asyncio.Future[None]] | None = None

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        task = json.loads(payload)
        self.started.append(task["i"])
        fut = asyncio.get_running_loop().create_future()
        self.running = (self.clock.t + task["service"], fut)
        await fut
        return b"{}"


class _Conn:
    closed = False

    def send_item(self, item: Any) -> None:
        pass


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("policy", ["tf-edfq", "t-edfq", "priq", "fifo"])
async def test_live_task_server_and_simulator_dequeue_in_the_same_order(policy: str) -> None:
    rng = random.Random(4)
    n, t = 300, 0.0
    arrive, occupy, deadline, slo_deadline, prio = [], [], [], [], []
    for _ in range(n):
        t += rng.expovariate(1.0 / 0.9)  # load ~1.1: queues build up
        arrive.append(t)
        occupy.append(rng.uniform(0.5, 1.5))
        deadline.append(t + rng.uniform(1.0, 20.0))
        slo_deadline.append(t + rng.choice([10.0, 30.0]))
        prio.append(rng.randrange(3))
    sim_order: list[int] = []
    sim = ServerSim(policy, 1, on_dequeue=lambda i, _t: sim_order.append(i))
    start = np.full(n, np.nan)
    sim.feed(np.arange(n), arrive, occupy, deadline, slo_deadline, prio, start)
    sim.drain(start)

    clock = _Clock()
    ex = _ManualExecutor(clock)
    # The simulator serves every task, however late; so does the server when its grace
    # (a task dequeued past its SLO plus the grace fails unrun) exceeds the test's times.
    svc = TaskService(
        "live",
        create_task_queue(policy),
        ex,
        slots=1,
        clock=clock,
        task_grace_s=1e6,
        max_task_s=1e9,
    )
    Task = thrift().Task
    conn = _Conn()

    async def finish_until(limit: float) -> None:
        while ex.running is not None and ex.running[0] <= limit:
            end, fut = ex.running
            ex.running = None
            clock.t = end
            fut.set_result(None)
            await _settle()

    for i in range(n):
        await finish_until(arrive[i])
        clock.t = arrive[i]
        payload = json.dumps({"i": i, "service": occupy[i]}).encode()
        # Budgets are durations from receipt in ms, exactly as the gateway sends them (the
        # test's times are in seconds of the server's clock).
        budget_ms = (deadline[i] - arrive[i]) * 1000.0
        slo_ms = (slo_deadline[i] - arrive[i]) * 1000.0
        svc.submit(conn, Task(f"q{i}", 0, budget_ms, slo_ms, prio[i], "c", payload))  # type: ignore[arg-type]
        await _settle()
    await finish_until(math.inf)
    assert ex.started == sim_order
    assert len(sim_order) == n


def test_vertical_autoscaling_speeds_servers_up_when_tasks_miss(tailbench_dir: Path) -> None:
    doc: dict[str, Any] = {
        "servers": {"count": 100},
        "fanout": {"fixed": 100},
        "classes": [{"name": "A", "slo_ms": 1.0}, {"name": "B", "slo_ms": 1.5}],
        "service": {"kind": "quantiles", "path": str(tailbench_dir / "masstree_quantiles.txt")},
        "run": {"policy": "tf-edfq", "queries": 20_000, "seed": 1},
    }
    fixed = simulate(parse_scenario(doc), 0.65)
    doc["autoscaling"] = {
        "enabled": True,
        "window_tasks": 5000,
        "up_cooldown_ms": 5,
        "down_cooldown_ms": 20,
        "max_steps_up": 3,
    }
    scaled = simulate(parse_scenario(doc), 0.65)
    # TailGuard §III.E: misses above R_sth^U make the servers 20% faster.
    ups = [a for a in scaled.scaling if a["reason"] == "above_upper"]
    assert ups and ups[0]["to_scale"] == pytest.approx(0.8) and ups[0]["miss_ratio"] > 0.015
    assert scaled.miss_ratio < fixed.miss_ratio
    assert fixed.scaling == []
