"""A tenant flood on real processes: one tenant keeps the central queues full of wide
queries; with [allocation] the other tenant's queries still meet their SLO, without it
they are starved (client-side-scheduling §3.1's allocation layer, gateway.tenants)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import numpy as np
import pytest

from tests.integration.conftest import Cluster, query, register

pytestmark = [pytest.mark.integration, pytest.mark.solo, pytest.mark.timeout(120)]

SLO_MS = 400.0
BULK_SERVICE_MS = 40.0
INTERACTIVE_SERVICE_MS = 10.0
BULK_CLIENTS = 16
INTERACTIVE_QUERIES = 20


def gateway_toml(allocation: str, admission: str) -> str:
    # One class, so both tenants' tasks get the same budget: without allocation the central
    # queue is first come, first served, and sixteen bulk tasks (640 ms) are ahead of every
    # interactive one. The pool's prior is 20 ms, so every task costs the same.
    return f"""
[[classes]]
name = "std"
percentile = 99
latency_ms = {SLO_MS}

[[pools]]
name = "default"
queueing = "central"
policy = "tf-edfq"
[pools.prior]
kind = "constant"
value_ms = 20

[admission]
policy = "{admission}"
rule = "reject-all"
window_tasks = 200

[allocation]
policy = "{allocation}"
"""


def body(tenant: str, fanout: int, service_ms: float) -> dict:
    return {
        "class": "std",
        "tenant": tenant,
        "targets": {"pool": "default", "fanout": fanout},
        "task": {"service_ms": service_ms},
    }


async def _flood(
    cluster: Cluster, http: aiohttp.ClientSession, allocation: str, admission: str = "miss-ratio"
) -> tuple[list[tuple[int, dict]], list[int], str]:
    gw = cluster.gateway(gateway_toml(allocation, admission))
    for i in (1, 2):
        ts = cluster.taskserver(f"ts-{i}")
        await register(http, gw, ts, slots=1)
    stop = asyncio.Event()
    bulk_status: list[int] = []

    async def bulk() -> None:
        while not stop.is_set():
            status, _, _ = await query(http, gw, body("bulk", 2, BULK_SERVICE_MS))
            bulk_status.append(status)
            if status != 200:
                await asyncio.sleep(0.05)

    floods = [asyncio.create_task(bulk()) for _ in range(BULK_CLIENTS)]
    answers: list[tuple[int, dict]] = []
    try:
        await asyncio.sleep(1.0)  # the queues fill, the windows see the flood's misses
        for _ in range(INTERACTIVE_QUERIES):
            status, ans, _ = await query(http, gw, body("interactive", 1, INTERACTIVE_SERVICE_MS))
            answers.append((status, ans))
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        deadline = time.monotonic() + 10.0
        for t in floods:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(t, max(deadline - time.monotonic(), 0.1))
            t.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
    async with http.get(gw.url + "/metrics") as r:
        metrics = await r.text()
    async with http.get(gw.url + "/v1/tenants") as r:
        assert r.status == 200
        tenants = await r.json()
    answers.append((0, tenants))
    return answers, bulk_status, metrics


def _interactive_p99(answers: list[tuple[int, dict]]) -> float:
    lat = [a["latency_ms"] for s, a in answers if s == 200]
    return float(np.percentile(lat, 99)) if lat else float("inf")


async def test_without_allocation_the_flood_starves_the_other_tenant(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    answers, bulk_status, _ = await _flood(cluster, http, "none")
    mine = answers[:-1]
    ok = [s for s, _ in mine if s == 200]
    # Refused with the flood (one pool-wide window) or answered late behind it.
    assert len(ok) < len(mine) or _interactive_p99(mine) > SLO_MS, mine
    assert 200 in bulk_status


async def test_without_admission_the_flood_delays_the_other_tenant_past_its_slo(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    answers, bulk_status, _ = await _flood(cluster, http, "none", admission="none")
    mine = answers[:-1]
    assert [s for s, _ in mine] == [200] * INTERACTIVE_QUERIES, mine
    assert _interactive_p99(mine) > SLO_MS, [a["latency_ms"] for _, a in mine]
    assert set(bulk_status) == {200}


async def test_drr_central_queues_alone_keep_the_other_tenant_within_its_slo(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    # No admission: the flood keeps every queue full, and DRR gives the interactive tenant's
    # tasks every other slot, so each waits for at most one bulk task.
    answers, bulk_status, _ = await _flood(cluster, http, "drr", admission="none")
    mine, tenants = answers[:-1], answers[-1][1]
    assert [s for s, _ in mine] == [200] * INTERACTIVE_QUERIES, mine
    assert _interactive_p99(mine) <= SLO_MS, [a["latency_ms"] for _, a in mine]
    assert set(bulk_status) == {200}
    flows = {f["flow"]: f for f in tenants["flows"]}
    assert flows["bulk"]["admitted"] > flows["interactive"]["admitted"]


async def test_with_drr_the_other_tenant_meets_its_slo_while_the_flood_is_refused(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    answers, bulk_status, metrics = await _flood(cluster, http, "drr")
    mine, tenants = answers[:-1], answers[-1][1]
    assert [s for s, _ in mine] == [200] * INTERACTIVE_QUERIES, mine
    assert _interactive_p99(mine) <= SLO_MS, [a["latency_ms"] for _, a in mine]
    assert all(a["met_slo"] for _, a in mine)
    # The flood is refused on its own tasks' misses, and only the flood.
    assert 503 in bulk_status and 200 in bulk_status
    flows = {f["flow"]: f for f in tenants["flows"]}
    assert tenants["policy"] == "drr" and tenants["share"] == "windows"
    assert flows["interactive"]["admitted"] == INTERACTIVE_QUERIES
    assert flows["interactive"]["rejected"] == {}
    assert flows["bulk"]["rejected"].get("miss_ratio_above_threshold", 0) > 0, flows["bulk"]
    assert flows["bulk"]["miss_ratio"] > flows["interactive"]["miss_ratio"]
    assert 'tailgate_tenant_queries_admitted_total{tenant="interactive"} 20.0' in metrics
    rejected = 'tailgate_tenant_queries_rejected_total{reason="miss_ratio_above_threshold",'
    assert rejected + 'tenant="bulk"}' in metrics
