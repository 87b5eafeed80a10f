"""SIGTERM on real processes: a gateway and task servers drain, answer everything, exit 0."""

from __future__ import annotations

import asyncio
import math
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register, wait_until
from tests.integration.harness import Proc, start_cli, start_taskserver

pytestmark = pytest.mark.integration


async def _exit_code(p: Proc, timeout_s: float) -> int:
    """Wait (without blocking the loop) for the process to exit; its exit status."""
    deadline = time.monotonic() + timeout_s
    while p.popen.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"process {p.popen.args} still running after {timeout_s} s")
        await asyncio.sleep(0.02)
    return p.popen.returncode


async def _servers(http: aiohttp.ClientSession, gw: Proc) -> dict[str, dict[str, Any]]:
    async with http.get(gw.url + "/v1/servers") as r:
        return {s["id"]: s for s in (await r.json())["servers"]}


async def _until_outstanding(http: aiohttp.ClientSession, gw: Proc, server_id: str, n: int) -> None:
    await wait_until(lambda s: s["outstanding"] + s.get("queued", 0) >= n, http, gw, server_id)


def _taskserver(c: Cluster, server_id: str, *args: str, toml: str = "") -> Proc:
    config = None
    if toml:
        config = c.tmp_path / f"{server_id}.toml"
        config.write_text(toml)
    p = start_taskserver(server_id, *args, config=config)
    c.procs.append(p)
    return p


async def test_a_gateway_drains_answers_every_query_in_flight_and_exits_0(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await register(http, gw, cluster.taskserver("ts-1", "--slots", "8"), slots=8)
    async with http.get(gw.url + "/readyz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ready"
    on_time = {"class": "C", "targets": {"servers": ["ts-1"]}, "task": {"service_ms": 700}}
    # Class B: 300 ms SLO + 1000 ms grace, so this one is answered 504 while draining.
    too_slow = {"class": "B", "targets": {"servers": ["ts-1"]}, "task": {"service_ms": 3000}}
    pending = [asyncio.create_task(query(http, gw, on_time)) for _ in range(3)]
    pending.append(asyncio.create_task(query(http, gw, too_slow)))
    await _until_outstanding(http, gw, "ts-1", 4)

    t0 = time.monotonic()
    gw.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while True:
        async with http.get(gw.url + "/readyz") as r:
            if r.status == 503:
                assert (await r.json())["status"] == "draining"
                break
        assert time.monotonic() < deadline, "/readyz never turned 503"
        await asyncio.sleep(0.02)
    # Not ready, still alive: a new query is turned away with a reason and a retry hint.
    status, body, headers = await query(http, gw, on_time)
    assert status == 503, body
    assert body["error"]["code"] == "draining"
    # Retry when the drain bound (class C's 1 s SLO + 1 s grace + 0.5 s) has passed.
    assert 0 < body["retry_after_s"] <= 2.5
    assert headers["Retry-After"] == str(max(math.ceil(body["retry_after_s"]), 1))
    async with http.get(gw.url + "/livez") as r:
        assert r.status == 200 and (await r.json())["status"] == "draining"
    async with http.get(gw.url + "/metrics") as r:
        assert r.status == 200 and "tailgate_queries_total" in await r.text()

    answers = await asyncio.gather(*pending)  # a reset connection would raise here
    assert [a[0] for a in answers] == [200, 200, 200, 504], [a[1] for a in answers]
    assert answers[3][1]["error"]["code"] == "query_timeout"
    # Exit 0 within the drain bound: largest class SLO + grace (1 s + 1 s), plus shutdown.
    assert await _exit_code(gw, 6.0) == 0
    assert time.monotonic() - t0 < 4.0


async def test_a_self_registered_task_server_drains_deregisters_and_exits_0(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await register(http, gw, cluster.taskserver("ts-b"))
    toml = "[taskserver]\nregister_interval_s = 0.3\ndrain_timeout_s = 1.2\n"
    ts = _taskserver(cluster, "ts-d", "--gateway", gw.url, toml=toml)
    await wait_until(lambda s: s["state"] == "up", http, gw, "ts-d")
    slow = {
        "slo": {"percentile": 99, "latency_ms": 5000},
        "targets": {"servers": ["ts-d"]},
        "task": {"service_ms": 500},
    }
    # One slot: 2 s of work, of which the 1.2 s drain finishes some and gives up the rest.
    pending = [asyncio.create_task(query(http, gw, slow)) for _ in range(4)]
    await _until_outstanding(http, gw, "ts-d", 4)

    ts.popen.send_signal(signal.SIGTERM)
    # The server tells the gateway at once: out of the selection while it finishes.
    view = await wait_until(lambda s: s["state"] == "draining", http, gw, "ts-d", 2.0)
    assert view["outstanding"] >= 1
    for _ in range(3):  # new queries to the pool go to the other server
        status, body, _ = await query(
            http, gw, {"class": "A", "targets": {"pool": "default", "fanout": 1}}
        )
        assert status == 200 and body["tasks"][0]["server"] == "ts-b", body

    answers = await asyncio.gather(*pending)
    statuses = [a[0] for a in answers]
    assert set(statuses) <= {200, 503}, [
        (a[1]["error"], a[1]["tasks"]) for a in answers if a[0] not in (200, 503)
    ][:3]
    assert 200 in statuses and 503 in statuses, statuses
    for status, body, headers in answers:
        if status == 503:  # given up by the drain: an explicit, retryable answer
            assert body["error"]["code"] == "task_rejected", body
            assert body["tasks"][0]["status"] == "rejected"
            assert "draining" in body["tasks"][0]["error"]
            assert headers["Retry-After"] == "1"
    assert await _exit_code(ts, 5.0) == 0
    assert "ts-d" not in await _servers(http, gw)  # deregistered
    assert (await _servers(http, gw))["ts-b"]["state"] == "up"


async def test_a_configured_task_server_that_drains_is_seen_in_the_heartbeat(
    cluster: Cluster, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    ts = cluster.taskserver("ts-c")
    gw = cluster.gateway(
        "[gateway]\nheartbeat_s = 0.2\nheartbeat_timeout_s = 1.0\n"
        f'[[pools]]\nname = "default"\nservers = [{{id = "ts-c", address = "{ts.address}"}}]\n'
    )
    await wait_until(lambda s: s["state"] == "up", http, gw, "ts-c")
    body = {
        "slo": {"percentile": 99, "latency_ms": 5000},
        "targets": {"servers": ["ts-c"]},
        "task": {"service_ms": 1500},
    }
    pending = asyncio.create_task(query(http, gw, body))
    await _until_outstanding(http, gw, "ts-c", 1)
    ts.popen.send_signal(signal.SIGTERM)
    # No registration to withdraw: the gateway learns it from the server's status.
    await wait_until(lambda s: s["state"] == "draining", http, gw, "ts-c", 1.0)
    status, ans, headers = await query(http, gw, body)
    assert status == 503 and ans["error"]["code"] == "servers_down", ans
    assert headers["Retry-After"] == "1"
    status, ans, _ = await pending  # the task in hand finishes within the drain
    assert status == 200, ans
    assert await _exit_code(ts, 5.0) == 0
    await wait_until(lambda s: s["state"] == "down", http, gw, "ts-c", 3.0)


async def test_an_edge_agent_drains_on_sigterm(
    cluster: Cluster, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gw = cluster.gateway()
    agent = start_cli(
        [
            "edge-agent",
            "run",
            "--id",
            "pi-1",
            "--cluster",
            "wet-lab",
            "--port",
            "0",
            "--db",
            str(tmp_path / "pi-1.db"),
            "--gateway",
            gw.url,
            "--register-interval-s",
            "0.3",
            "--profile",
            "gta",  # a status task takes ~20 ms
            "--drain-timeout-s",
            "0.3",
        ]
    )
    cluster.procs.append(agent)
    await wait_until(lambda s: s["state"] == "up", http, gw, "pi-1")
    body = {
        "slo": {"percentile": 99, "latency_ms": 5000},
        "targets": {"pool": "edge", "all": True},
        "task": {"op": "status"},
    }
    status, ans, _ = await query(http, gw, body)
    assert status == 200, ans
    # Central queueing: the gateway holds the queue, the agent gets one task at a time.
    pending = [asyncio.create_task(query(http, gw, body)) for _ in range(200)]
    await wait_until(lambda s: s["tasks_sent"] >= 6, http, gw, "pi-1")  # ~4 s of work queued
    agent.popen.send_signal(signal.SIGTERM)
    answers = await asyncio.gather(*pending)
    statuses = [a[0] for a in answers]
    assert set(statuses) <= {200, 503}, [
        (a[1]["error"], a[1]["tasks"]) for a in answers if a[0] not in (200, 503)
    ][:3]
    assert 200 in statuses and 503 in statuses, statuses
    for status, ans, _ in answers:
        if status == 503:
            # rejected by the draining agent, or arrived once it had left the pool
            assert ans["error"]["code"] in ("task_rejected", "servers_down", "no_servers"), ans
    assert await _exit_code(agent, 5.0) == 0
    assert "pi-1" not in await _servers(http, gw)
