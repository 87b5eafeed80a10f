"""The fanout query path over real processes: HTTP gateway -> Thrift task servers."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register, wait_until

pytestmark = pytest.mark.integration


async def _servers(
    cluster: Cluster,
    http: aiohttp.ClientSession,
    gw,
    n: int,
    *args: str,
    pool: str = "default",
    slots: int = 1,
    prefix: str = "ts",
) -> list:
    procs = [cluster.taskserver(f"{prefix}-{i + 1}", *args) for i in range(n)]
    for p in procs:
        await register(http, gw, p, pool=pool, slots=slots)
    return procs


async def test_fanout_8_merges_results_with_consistent_timings(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await _servers(cluster, http, gw, 8)
    status, body, _ = await query(
        http,
        gw,
        {
            "class": "A",
            "targets": {"pool": "default", "all": True},
            "task": {"service_ms": 5, "echo": "hello"},
        },
    )
    assert status == 200, body
    assert body["fanout"] == 8
    # met_slo says whether the latency kept the SLO (which a loaded machine may not)
    assert body["met_slo"] is (body["latency_ms"] <= body["slo_ms"])
    assert body["estimate"] in ("empirical", "tail-model")
    # TailGuard eq. (4): the budget is the SLO minus the unloaded p99 at fanout 8.
    assert body["budget_ms"] == pytest.approx(100.0 - body["unloaded_latency_ms"], abs=1e-3)
    servers = {t["server"] for t in body["tasks"]}
    assert servers == {f"ts-{i + 1}" for i in range(8)}
    for t in body["tasks"]:
        assert t["status"] == "ok"
        assert t["result"]["echo"] == "hello"
        assert t["result"]["server"] == t["server"]
        assert 5.0 <= t["service_ms"] < 1000.0  # milliseconds, not seconds
        assert t["missed_deadline"] is False
        # Each task's queueing and post-queuing fit inside the query's latency.
        assert t["queue_ms"] >= 0 and t["post_queue_ms"] >= t["service_ms"] - 0.01
        assert t["queue_ms"] + t["post_queue_ms"] <= body["latency_ms"] + 0.5
    assert body["latency_ms"] >= 5.0


async def test_k_random_servers_and_explicit_servers(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await _servers(cluster, http, gw, 4)
    status, body, _ = await query(
        http, gw, {"class": "B", "targets": {"pool": "default", "fanout": 3}}
    )
    assert status == 200, body
    assert len({t["server"] for t in body["tasks"]}) == 3
    status, body, _ = await query(
        http,
        gw,
        {"slo": {"percentile": 95, "latency_ms": 500}, "targets": {"servers": ["ts-2", "ts-4"]}},
    )
    assert status == 200, body
    assert [t["server"] for t in body["tasks"]] == ["ts-2", "ts-4"]
    assert body["class"] is None and body["percentile"] == 95


async def _reorder_run(
    cluster: Cluster, http: aiohttp.ClientSession, *, central: bool, policy: str
) -> list[str]:
    """Four loose queries queue behind a running one; a tight one arrives last.

    Returns the query names in the order their answers came back: with 400 ms loose tasks
    and a 10 ms tight one, that is the order of service. The tight task must reach the
    server's queue before the first loose one ends: it is sent ~100 ms after that one
    started, so ~300 ms to spare for a loaded machine's scheduling noise (with 150 ms loose
    tasks, 50 ms were not always enough on 2 cores beside 3 test workers).
    """
    if central:
        toml = f'[[pools]]\nname = "edge"\nqueueing = "central"\npolicy = "{policy}"\n'
        gw = cluster.gateway(toml)
        ts = cluster.taskserver("edge-1")
        await register(http, gw, ts, pool="edge", slots=1)
        pool = "edge"
    else:
        gw = cluster.gateway()
        ts = cluster.taskserver("ts-1", "--policy", policy, "--slots", "1")
        await register(http, gw, ts)
        pool = "default"

    def body(name: str, slo_ms: float, service_ms: float) -> dict:
        return {
            "slo": {"percentile": 99, "latency_ms": slo_ms},
            "targets": {"pool": pool, "fanout": 1},
            "task": {"service_ms": service_ms, "echo": name},
        }

    answered: dict[str, float] = {}

    async def run(name: str, slo_ms: float, service_ms: float) -> None:
        status, ans, _ = await query(http, gw, body(name, slo_ms, service_ms))
        assert status == 200, ans
        answered[name] = time.monotonic()

    first = asyncio.create_task(run("loose-0", 10_000, 400))
    await asyncio.sleep(0.05)
    loose = [asyncio.create_task(run(f"loose-{i}", 10_000, 400)) for i in range(1, 4)]
    await asyncio.sleep(0.05)
    tight = asyncio.create_task(run("tight", 4_000, 10))
    await asyncio.gather(first, *loose, tight)
    return sorted(answered, key=answered.__getitem__)


@pytest.mark.parametrize("central", [False, True], ids=["server-queueing", "central-queueing"])
async def test_tf_edfq_lets_a_tight_deadline_overtake_queued_loose_tasks(
    cluster: Cluster, http: aiohttp.ClientSession, central: bool
) -> None:
    order = await _reorder_run(cluster, http, central=central, policy="tf-edfq")
    assert order[0] == "loose-0"
    assert order[1] == "tight", order


async def test_fifo_keeps_arrival_order(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    order = await _reorder_run(cluster, http, central=False, policy="fifo")
    assert order[-1] == "tight", order


def _long_query_on_all(http: aiohttp.ClientSession, gw) -> asyncio.Task:
    """A 10 s task on every server of the pool, answered (at the latest) after 21 s."""
    body = {
        "slo": {"percentile": 99, "latency_ms": 20_000},
        "targets": {"pool": "default", "all": True},
        "task": {"service_ms": 10_000},
    }
    return asyncio.create_task(query(http, gw, body))


async def test_killed_server_fails_the_query_fast_and_cancels_siblings(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    a, _b = await _servers(cluster, http, gw, 2)
    t0 = time.monotonic()
    pending = _long_query_on_all(http, gw)
    await asyncio.sleep(0.3)
    a.kill()
    status, body, _ = await pending
    elapsed = time.monotonic() - t0
    assert status == 502, body
    assert elapsed < 3.0, f"took {elapsed:.2f} s to notice a dead server"
    by_server = {t["server"]: t for t in body["tasks"]}
    assert by_server["ts-1"]["status"] == "lost"
    assert "lost" in by_server["ts-1"]["error"]
    assert by_server["ts-2"]["status"] == "cancelled"
    assert body["error"]["code"] == "task_failed"
    # The sibling was cancelled on its server, not left running for 10 s.
    view = await wait_until(lambda s: s["outstanding"] == 0, http, gw, "ts-2")
    assert view["state"] == "up"
    status, body, headers = await query(
        http, gw, {"class": "A", "targets": {"pool": "default", "all": True}}
    )
    assert status == 503 and body["error"]["code"] == "servers_down", body
    # A lost server's link reconnects within a heartbeat timeout (3 s by default).
    assert (body["retry_after_s"], headers["Retry-After"]) == (3.0, "3")
    assert body["servers_down"] == ["ts-1"]


async def test_hung_server_is_marked_down_by_heartbeat_and_the_query_fails(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    # A stopped process keeps its socket open: only the missed heartbeat reveals it.
    gw = cluster.gateway("[gateway]\nheartbeat_s = 0.2\nheartbeat_timeout_s = 1.0\n")
    a, _b = await _servers(cluster, http, gw, 2)
    pending = _long_query_on_all(http, gw)
    await asyncio.sleep(0.2)
    a.popen.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        status, body, _ = await pending
        elapsed = time.monotonic() - t0
        assert status == 502, body
        assert elapsed < 3.0, f"took {elapsed:.2f} s to notice a hung server"
        by_server = {t["server"]: t for t in body["tasks"]}
        assert by_server["ts-1"]["status"] == "lost"
        assert by_server["ts-2"]["status"] == "cancelled"
        view = await wait_until(lambda s: s["state"] == "down", http, gw, "ts-1")
        assert "heartbeat" in view["last_error"]
    finally:
        a.popen.send_signal(signal.SIGCONT)
    # Once it answers again, the link comes back by itself.
    await wait_until(lambda s: s["state"] == "up", http, gw, "ts-1")


async def _slow_query(
    cluster: Cluster, http: aiohttp.ClientSession, gw: Any
) -> tuple[int, dict, float]:
    """One server; a 5 s task under a 300 ms SLO: (status, body, seconds to the answer)."""
    await _servers(cluster, http, gw, 1, "--slots", "1")
    t0 = time.monotonic()
    status, body, _ = await query(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 300},
            "targets": {"pool": "default", "fanout": 1},
            "task": {"service_ms": 5_000},
        },
    )
    return status, body, time.monotonic() - t0


async def test_query_past_slo_plus_grace_gets_504_and_is_cancelled(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway("[gateway]\ngrace_ms = 200\n")
    status, body, elapsed = await _slow_query(cluster, http, gw)
    assert status == 504, body
    assert 0.45 <= elapsed < 2.0
    assert body["tasks"][0]["status"] == "timeout"
    # The server got the cancel: the next query does not wait behind the 5 s task.
    status, body, _ = await query(
        http,
        gw,
        {"class": "A", "targets": {"pool": "default", "fanout": 1}, "task": {"service_ms": 1}},
    )
    assert status == 200, body
    assert body["latency_ms"] < 100


async def test_prune_late_answers_a_query_still_running_at_its_slo_at_once(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    # Swayam's request pruning: no waiting for the grace (here 5 s).
    gw = cluster.gateway("[gateway]\ngrace_ms = 5000\nprune_late = true\n")
    status, body, elapsed = await _slow_query(cluster, http, gw)
    assert status == 504, body
    assert 0.25 <= elapsed < 1.5, elapsed
    assert "pruned" in body["error"]["message"]
    assert body["tasks"][0]["status"] == "timeout"


async def test_a_timeout_beside_finished_siblings_still_answers_json(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway("[gateway]\ngrace_ms = 200\n")
    await _servers(cluster, http, gw, 2, "--slots", "1")
    # ts-2's only slot is busy for 1.5 s, so the second query's task there cannot finish
    # while its sibling on ts-1 does: a mixed outcome, answered 504 with a JSON body.
    blocker = asyncio.create_task(
        query(
            http,
            gw,
            {
                "slo": {"percentile": 99, "latency_ms": 3000},
                "targets": {"servers": ["ts-2"]},
                "task": {"service_ms": 1_500},
            },
        )
    )
    # Sent to ts-2 first on the same connection, so it holds the slot before the next one.
    await wait_until(lambda s: s["outstanding"] >= 1, http, gw, "ts-2")
    status, body, _ = await query(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 300},
            "targets": {"servers": ["ts-1", "ts-2"]},
            "task": {"service_ms": 1},
        },
    )
    assert status == 504, body
    assert body["error"]["code"] == "query_timeout"
    assert sorted(t["status"] for t in body["tasks"]) == ["ok", "timeout"]
    assert (await blocker)[0] == 200


async def test_a_dropped_task_fails_the_query_at_once_and_cancels_its_siblings(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await _servers(cluster, http, gw, 3)
    t0 = time.monotonic()
    status, body, headers = await query(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 5000},
            "targets": {"servers": ["ts-1", "ts-2", "ts-3"]},
            # ts-2 drops its task at once (as PARD does for a doomed request); the others
            # would each compute for 3 s.
            "task": {"service_ms": 3000, "drop": "budget exhausted", "drop_on": ["ts-2"]},
        },
    )
    assert time.monotonic() - t0 < 1.5
    assert status == 503 and headers["Retry-After"]
    assert body["error"]["code"] == "task_dropped"
    assert "budget exhausted" in body["error"]["message"]
    assert {t["server"]: t["status"] for t in body["tasks"]} == {
        "ts-1": "cancelled",
        "ts-2": "dropped",
        "ts-3": "cancelled",
    }
    assert body["cancelled_siblings"] == 2
    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    assert 'tailgate_tasks_cancelled_after_drop_total{pool="default"} 2.0' in text
    assert 'tailgate_queries_total{class="custom",outcome="dropped"} 1.0' in text


async def test_failing_task_gives_502_with_reason(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await _servers(cluster, http, gw, 2)
    status, body, _ = await query(
        http, gw, {"class": "A", "targets": {"servers": ["ts-1"]}, "task": {"fail": "disk on fire"}}
    )
    assert status == 502
    assert body["tasks"][0]["status"] == "failed"
    assert "disk on fire" in body["tasks"][0]["error"]


async def test_online_cdf_update_moves_unloaded_latency(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway("[gateway]\ncdf_window = 400\ncdf_refresh_every = 16\n")
    await _servers(cluster, http, gw, 1, "--slots", "8")
    body = {"class": "B", "targets": {"pool": "default", "fanout": 1}, "task": {"service_ms": 1}}
    status, first, _ = await query(http, gw, body)
    assert status == 200
    before = first["unloaded_latency_ms"]
    # The server gets slower: 30 ms per task instead of ~2 ms.
    slow = {**body, "task": {"service_ms": 30}}
    for _ in range(10):
        results = await asyncio.gather(*[query(http, gw, slow) for _ in range(8)])
        assert all(r[0] == 200 for r in results)
    status, after_body, _ = await query(http, gw, body)
    after = after_body["unloaded_latency_ms"]
    assert before < 15.0, before
    assert after > 25.0, (before, after)
    view = await wait_until(lambda s: True, http, gw, "ts-1")
    assert view["cdf_samples"] >= 80
    assert view["post_queue_ms"]["p99"] > 25.0


async def test_slo_below_unloaded_latency_is_422_with_both_numbers(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await _servers(cluster, http, gw, 4)
    status, body, _ = await query(
        http,
        gw,
        {"slo": {"percentile": 99, "latency_ms": 0.5}, "targets": {"pool": "default", "all": True}},
    )
    assert status == 422, body
    assert body["error"]["code"] == "slo_unreachable"
    assert body["slo_ms"] == 0.5
    assert body["unloaded_latency_ms"] > 0.5
    assert body["fanout"] == 4
    assert "0.5" in body["error"]["message"]
