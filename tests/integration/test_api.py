"""The rest of the API surface and the wire contract seen from a stock Thrift client."""

from __future__ import annotations

import re

import aiohttp
import pytest
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from gateway.app import ROUTES
from gateway.requests import _REGISTER_FIELDS, _TARGET_FIELDS
from taskserver.wire import thrift
from tests.integration.conftest import Cluster, query, register

pytestmark = pytest.mark.integration


async def test_classes_health_metrics_and_openapi(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()
    await register(http, gw, cluster.taskserver("ts-1"))
    async with http.get(gw.url + "/v1/classes") as r:
        classes = {c["name"]: c for c in (await r.json())["classes"]}
    assert classes["A"] == {"name": "A", "percentile": 99.0, "latency_ms": 100.0, "priority": 0}
    async with http.get(gw.url + "/healthz") as r:
        assert (await r.json()) == {"status": "ok", "servers_up": 1, "servers": 1}
    status, _, _ = await query(
        http, gw, {"class": "A", "targets": {"pool": "default", "fanout": 1}}
    )
    assert status == 200
    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    assert 'tailgate_queries_total{class="A",outcome="met"} 1.0' in text
    assert 'tailgate_tasks_total{pool="default",status="ok"} 1.0' in text
    assert 'tailgate_servers{pool="default",state="up"} 1.0' in text
    assert "tailgate_query_latency_seconds_bucket" in text
    async with http.get(gw.url + "/openapi.json") as r:
        doc = await r.json()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    # A route's regex ({file:.+}) is documented as its plain parameter ({file}).
    assert documented == {(m, re.sub(r"\{(\w+):[^}]+\}", r"{\1}", p)) for m, p, _ in ROUTES}
    # The schemas list exactly the fields the validators accept.
    schemas = doc["components"]["schemas"]
    assert set(schemas["Targets"]["properties"]) == _TARGET_FIELDS
    assert set(schemas["Register"]["properties"]) == _REGISTER_FIELDS
    for method, path in (("post", "/v1/servers"), ("delete", "/v1/servers/{id}")):
        assert "401" in doc["paths"][path][method]["responses"]
        assert {"registrationToken": []} in doc["paths"][path][method]["security"]


async def test_register_is_idempotent(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    gw = cluster.gateway()
    ts = cluster.taskserver("ts-1")
    body = {"id": "ts-1", "address": ts.address}
    async with http.post(gw.url + "/v1/servers", json=body) as r:
        assert r.status == 201
    async with http.post(gw.url + "/v1/servers", json=body) as r:
        assert r.status == 200


async def test_task_server_self_registers(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    gw = cluster.gateway()
    cluster.taskserver("ts-self", "--gateway", gw.url)
    from tests.integration.conftest import wait_until

    view = await wait_until(lambda s: s["state"] == "up", http, gw, "ts-self")
    assert view["pool"] == "default"


def test_stock_thrift_client_speaks_to_a_task_server(cluster: Cluster) -> None:
    ts = cluster.taskserver("ts-1", "--policy", "priq", "--slots", "3")
    host, port = ts.address.rsplit(":", 1)
    client = make_client(
        thrift().TaskServer,
        host,
        int(port),
        proto_factory=TBinaryProtocolFactory(),
        trans_factory=TFramedTransportFactory(),
        timeout=5000,
    )
    try:
        assert client.ping("hello") == "hello"
        st = client.status()
        assert (st.server_id, st.policy, st.slots, st.busy, st.queued) == ("ts-1", "priq", 3, 0, 0)
    finally:
        client.close()


async def test_task_servers_come_back_after_a_gateway_restart(
    cluster: Cluster, http: aiohttp.ClientSession, tmp_path
) -> None:
    import socket

    from tests.integration.conftest import wait_until
    from tests.integration.harness import start_cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw = start_cli(["gateway", "--port", str(port)])
    cluster.procs.append(gw)
    cfg = tmp_path / "ts.toml"
    cfg.write_text("[taskserver]\nregister_interval_s = 0.3\n")
    ts = start_cli(["taskserver", "--id", "ts-r", "--port", "0", "--gateway", gw.url], config=cfg)
    cluster.procs.append(ts)
    await wait_until(lambda s: s["state"] == "up", http, gw, "ts-r")
    gw.stop()
    gw2 = start_cli(["gateway", "--port", str(port)])
    cluster.procs.append(gw2)
    view = await wait_until(lambda s: s["state"] == "up", http, gw2, "ts-r")
    assert view["address"] == ts.address
    status, body, _ = await query(http, gw2, {"class": "A", "targets": {"servers": ["ts-r"]}})
    assert status == 200, body


async def test_deregister_with_drain_lets_outstanding_tasks_finish(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    import asyncio
    import time

    gw = cluster.gateway()
    for sid in ("ts-1", "ts-2"):
        await register(http, gw, cluster.taskserver(sid))
    body = {
        "slo": {"percentile": 99, "latency_ms": 5000},
        "targets": {"servers": ["ts-1"]},
        "task": {"service_ms": 600},
    }
    pending = asyncio.create_task(query(http, gw, body))
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    async with http.delete(gw.url + "/v1/servers/ts-1?drain_s=5") as r:
        assert r.status == 200
        assert await r.json() == {"id": "ts-1", "deleted": True, "drained": True, "failed_tasks": 0}
    assert 0.2 < time.monotonic() - t0 < 2.0  # it waited for the task, not for the bound
    status, ans, _ = await pending
    assert status == 200, ans
    # Without a drain, an outstanding task fails at once.
    pending = asyncio.create_task(query(http, gw, {**body, "targets": {"servers": ["ts-2"]}}))
    await asyncio.sleep(0.2)
    async with http.delete(gw.url + "/v1/servers/ts-2") as r:
        assert (await r.json())["failed_tasks"] == 1
    status, ans, _ = await pending
    assert status == 502 and ans["tasks"][0]["status"] == "lost"
    async with http.delete(gw.url + "/v1/servers/ts-2?drain_s=-1") as r:
        assert r.status == 404


async def test_admission_rejects_with_503_while_tasks_miss_deadlines(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    import asyncio

    gw = cluster.gateway(
        "[admission]\nthreshold = 0.1\nwindow_tasks = 10\nwindow_max_age_s = 0.6\n"
    )
    await register(http, gw, cluster.taskserver("ts-1", "--slots", "1"))
    slow = {
        "slo": {"percentile": 99, "latency_ms": 200},
        "targets": {"servers": ["ts-1"]},
        "task": {"service_ms": 100},
    }
    # Six 100 ms tasks on one slot with ~190 ms budgets: the later ones miss t_D.
    results = await asyncio.gather(*[query(http, gw, slow) for _ in range(6)])
    assert all(r[0] == 200 for r in results)
    missed = sum(r[1]["tasks"][0]["missed_deadline"] for r in results)
    assert missed >= 3
    async with http.get(gw.url + "/v1/admission") as r:
        state = await r.json()
    assert state["window"]["ratio"] == pytest.approx(missed / 6)
    status, body, headers = await query(http, gw, {"class": "A", "targets": {"servers": ["ts-1"]}})
    assert status == 503, body
    assert body["error"]["code"] == "admission_rejected"
    assert body["reason"] == "miss_ratio_above_threshold" and body["class"] == "A"
    assert headers["Retry-After"] == "1"
    async with http.get(gw.url + "/metrics") as r:
        assert (
            'tailgate_admission_rejections_total{class="A",reason="miss_ratio_above_threshold"} 1.0'
            in await r.text()
        )
    # With no fresh tasks the stale window is forgotten, and queries are admitted again.
    await asyncio.sleep(0.7)
    status, body, _ = await query(http, gw, {"class": "A", "targets": {"servers": ["ts-1"]}})
    assert status == 200, body
