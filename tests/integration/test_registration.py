"""Registration on loopback: the token, cluster labels and targets, liveness, gateway restarts."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.config import GatewayConfig
from gateway.requests import RegisterRequest
from gateway.service import GatewayService
from tests.integration.conftest import Cluster, query, wait_until
from tests.integration.harness import Proc, free_port, start_cli, start_taskserver

pytestmark = pytest.mark.integration

TOKEN = "tok-for-loopback-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"TAILGATE_AGENT_TOKEN": TOKEN}


def _gateway(
    procs: Cluster, *, port: int = 0, token: str | None = TOKEN, grace_s: float | None = None
) -> Proc:
    """A gateway with the default config (pool "edge": central, one CDF per cluster), or
    with `registration_grace_s = grace_s`."""
    env = {"TAILGATE_AGENT_TOKEN": token} if token else {}
    cfg = None
    if grace_s is not None:
        cfg = procs.tmp_path / f"gateway-grace-{len(procs.procs)}.toml"
        cfg.write_text(f"[gateway]\nregistration_grace_s = {grace_s}\n")
    p = start_cli(["gateway", "--port", str(port)], config=cfg, env=env)
    procs.procs.append(p)
    return p


def _taskserver(
    procs: Cluster, server_id: str, *args: str, toml: str = "", token: str | None = None
) -> Proc:
    config = None
    if toml:
        config = procs.tmp_path / f"{server_id}.toml"
        config.write_text(toml)
    env = {"TAILGATE_AGENT_TOKEN": token} if token else {}
    p = start_taskserver(server_id, *args, config=config, env=env)
    procs.procs.append(p)
    return p


def _self_registering(cluster: str, interval_s: float = 0.3) -> str:
    """[taskserver] table of a server that registers into pool edge with a cluster label."""
    return (
        f'[taskserver]\npool = "edge"\ncluster = "{cluster}"\nregister_interval_s = {interval_s}\n'
    )


async def _register(
    http: aiohttp.ClientSession,
    gw: Proc,
    ts: Proc,
    *,
    pool: str = "edge",
    cluster: str | None = None,
    slots: int = 1,
) -> dict[str, Any]:
    """Register with the token and wait until the gateway's link is up."""
    body: dict[str, Any] = {"id": ts.info["server_id"], "address": ts.address, "pool": pool}
    body["slots"] = slots
    if cluster is not None:
        body["cluster"] = cluster
    async with http.post(gw.url + "/v1/servers", json=body, headers=AUTH) as r:
        assert r.status in (200, 201), await r.text()
    return await wait_until(lambda s: s["state"] == "up", http, gw, ts.info["server_id"])


async def _servers(http: aiohttp.ClientSession, gw: Proc) -> dict[str, dict[str, Any]]:
    async with http.get(gw.url + "/v1/servers") as r:
        return {s["id"]: s for s in (await r.json())["servers"]}


async def test_registration_needs_the_token_and_queries_do_not(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = _gateway(cluster)
    ts = _taskserver(cluster, "ts-1")
    url = gw.url + "/v1/servers"
    body = {"id": "ts-1", "address": ts.address}
    refused = [
        ({}, 'Bearer realm="tailgate"'),
        ({"Authorization": "Bearer not-the-token"}, 'error="invalid_token"'),
        ({"Authorization": f"Basic {TOKEN}"}, 'error="invalid_request"'),
        ({"Authorization": "Bearer"}, 'error="invalid_request"'),
    ]
    for headers, challenge in refused:
        async with http.post(url, json=body, headers=headers) as r:
            assert r.status == 401, headers
            assert r.headers["WWW-Authenticate"].startswith("Bearer ")
            assert challenge in r.headers["WWW-Authenticate"]
            err = (await r.json())["error"]
            assert err["code"] == "unauthorized" and err["field"] == "Authorization"
            assert TOKEN not in err["message"]
    # Nothing is validated (or revealed) before the credential.
    async with http.post(url, json={"nonsense": True}) as r:
        assert r.status == 401
    assert await _servers(http, gw) == {}
    async with http.post(url, json=body, headers=AUTH) as r:
        assert r.status == 201, await r.text()
    view = await wait_until(lambda s: s["state"] == "up", http, gw, "ts-1")
    assert view["cluster"] is None
    # Re-registering an unchanged server refreshes when it was last seen.
    await asyncio.sleep(0.4)
    assert (await _servers(http, gw))["ts-1"]["registered_ago_s"] >= 0.35
    async with http.post(url, json=body, headers=AUTH) as r:
        assert r.status == 200
        assert (await r.json())["registered_ago_s"] < 0.2
    # Queries need no token.
    status, ans, _ = await query(http, gw, {"class": "A", "targets": {"servers": ["ts-1"]}})
    assert status == 200, ans
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        for sid in ("ts-1", "no-such-server"):  # 401 before 404: ids are not revealed either
            async with http.delete(f"{url}/{sid}", headers=headers) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer ")
    assert "ts-1" in await _servers(http, gw)
    async with http.delete(f"{url}/ts-1", headers=AUTH) as r:
        assert r.status == 200
    assert await _servers(http, gw) == {}


async def test_without_a_token_registration_is_open_and_the_gateway_warns(
    cluster: Cluster, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    gw = _gateway(cluster, token=None)
    ts = _taskserver(cluster, "ts-1")
    async with http.post(gw.url + "/v1/servers", json={"id": "ts-1", "address": ts.address}) as r:
        assert r.status == 201
    for token, warned in ((None, True), ("a-token", False)):
        caplog.clear()
        config = GatewayConfig(token=token, storage_url="")
        service = GatewayService(config, registry=CollectorRegistry())
        with caplog.at_level(logging.WARNING, logger="gateway.service"):
            await service.start()
            await service.stop()
        assert ("registration is unauthenticated" in caplog.text) is warned


async def test_task_server_with_the_token_registers_itself_with_its_cluster(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = _gateway(cluster)
    _taskserver(
        cluster, "pi-1", "--gateway", gw.url, toml=_self_registering("wet-lab"), token=TOKEN
    )
    _taskserver(
        cluster, "pi-x", "--gateway", gw.url, toml=_self_registering("wet-lab"), token="wrong"
    )
    _taskserver(cluster, "pi-y", "--gateway", gw.url, toml=_self_registering("wet-lab"))
    view = await wait_until(lambda s: s["state"] == "up", http, gw, "pi-1")
    assert (view["pool"], view["cluster"], view["queueing"]) == ("edge", "wet-lab", "central")
    await asyncio.sleep(1.0)
    servers = await _servers(http, gw)
    assert set(servers) == {"pi-1"}, "servers without the right token must not register"
    # Its periodic re-registration is its heartbeat: the timestamp keeps being refreshed.
    assert servers["pi-1"]["registered_ago_s"] < 0.9


async def test_just_after_start_too_few_servers_is_a_retry_not_a_client_error(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    """A restarted replica: its servers come back within their register interval, so
    within the registration grace a fanout above the servers registered so far is a 503
    with Retry-After (a client retries it), not a 400 (a client gives up on it)."""
    gw = _gateway(cluster, grace_s=60)
    await _register(http, gw, _taskserver(cluster, "g-1"), cluster="a")
    for targets, asked in (
        ({"pool": "edge", "fanout": 2}, "fanout 2 exceeds the 1 servers of pool 'edge'"),
        ({"pool": "edge", "per_cluster": 2}, "per_cluster 2 exceeds the 1 servers of cluster"),
    ):
        status, ans, headers = await query(http, gw, {"class": "C", "targets": targets})
        assert status == 503 and ans["error"]["code"] == "servers_registering", ans
        assert asked in ans["error"]["message"] and "still registering" in ans["error"]["message"]
        assert 0 < float(headers["Retry-After"]) <= 1
    status, ans, _ = await query(http, gw, {"class": "C", "targets": {"pool": "edge", "fanout": 1}})
    assert status == 200, ans


async def test_cluster_and_per_cluster_targets_pick_the_right_servers(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = _gateway(cluster, grace_s=0)  # too few servers is a client error at once
    layout = {"a-1": "a", "a-2": "a", "b-1": "b", "b-2": "b", "c-1": "c"}
    for sid, name in layout.items():
        await _register(http, gw, _taskserver(cluster, sid, "--slots", "4"), cluster=name, slots=4)

    async def picked(targets: dict[str, Any]) -> list[str]:
        body = {"class": "C", "targets": targets, "task": {"service_ms": 1}}
        status, ans, _ = await query(http, gw, body)
        assert status == 200, ans
        return [t["server"] for t in ans["tasks"]]

    for _ in range(5):
        got = await picked({"pool": "edge", "per_cluster": 1})
        assert sorted(layout[s] for s in got) == ["a", "b", "c"], got
        got = await picked({"pool": "edge", "fanout": 1, "cluster": "b"})
        assert layout[got[0]] == "b"
        got = await picked({"pool": "edge", "per_cluster": 1, "exclude_cluster": "c"})
        assert sorted(layout[s] for s in got) == ["a", "b"], got
        got = await picked({"pool": "edge", "fanout": 1, "exclude_cluster": "a"})
        assert layout[got[0]] != "a"
    assert sorted(await picked({"pool": "edge", "fanout": 2, "cluster": "b"})) == ["b-1", "b-2"]
    assert sorted(await picked({"pool": "edge", "all": True, "cluster": "a"})) == ["a-1", "a-2"]
    got = await picked({"pool": "edge", "all": True, "exclude_cluster": "a"})
    assert sorted(got) == ["b-1", "b-2", "c-1"]

    # Pool "edge" has cdf = "cluster": the members of a cluster share one online CDF.
    servers = await _servers(http, gw)
    for members in (["a-1", "a-2"], ["b-1", "b-2"]):
        seen = {servers[s]["cdf_samples"] for s in members}
        assert seen == {sum(servers[s]["results"] for s in members)}, servers

    status, ans, _ = await query(
        http, gw, {"class": "C", "targets": {"pool": "edge", "per_cluster": 2}}
    )
    assert status == 400 and ans["error"]["field"] == "targets.per_cluster"
    assert "exceeds the 1 servers of cluster 'c'" in ans["error"]["message"]
    status, ans, _ = await query(
        http, gw, {"class": "C", "targets": {"pool": "edge", "fanout": 1, "cluster": "d"}}
    )
    assert status == 400 and ans["error"]["field"] == "targets.cluster"
    assert "(known: a, b, c)" in ans["error"]["message"]

    # A cluster whose servers are all down: 503 and Retry-After, naming the cluster.
    next(p for p in cluster.procs if p.info.get("server_id") == "c-1").kill()
    await wait_until(lambda s: s["state"] != "up", http, gw, "c-1")
    for targets in (
        {"pool": "edge", "per_cluster": 1},
        {"pool": "edge", "fanout": 1, "cluster": "c"},
    ):
        status, ans, headers = await query(http, gw, {"class": "C", "targets": targets})
        assert status == 503, ans
        assert ans["error"]["code"] == "cluster_unavailable" and ans["clusters_down"] == ["c"]
        # Back, if at all, at a reconnect: within a heartbeat timeout (3 s by default).
        assert (ans["retry_after_s"], headers["Retry-After"]) == (3.0, "3")
    assert len(await picked({"pool": "edge", "per_cluster": 1, "exclude_cluster": "c"})) == 2


async def test_killed_server_fails_its_centrally_queued_tasks_fast(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = _gateway(cluster)
    e1 = _taskserver(cluster, "e-1")
    await _register(http, gw, e1, slots=1)
    await _register(http, gw, _taskserver(cluster, "e-2"), slots=1)
    long = {"slo": {"percentile": 99, "latency_ms": 20_000}, "task": {"service_ms": 10_000}}
    running = asyncio.create_task(query(http, gw, {**long, "targets": {"servers": ["e-1"]}}))
    await wait_until(lambda s: s["outstanding"] == 1, http, gw, "e-1")
    queued = asyncio.create_task(
        query(http, gw, {**long, "targets": {"pool": "edge", "all": True}})
    )
    # e-1 has one slot: the second task waits in the gateway's queue for e-1.
    await wait_until(lambda s: s.get("queued") == 1, http, gw, "e-1")
    t0 = time.monotonic()
    e1.kill()
    (s1, a1, _), (s2, a2, _) = await asyncio.gather(running, queued)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, f"took {elapsed:.2f} s; the bound is SLO + grace = 21 s"
    assert s1 == 502 and a1["tasks"][0]["status"] == "lost", a1
    assert s2 == 502, a2
    by_server = {t["server"]: t for t in a2["tasks"]}
    assert by_server["e-1"]["status"] == "lost"
    assert by_server["e-2"]["status"] == "cancelled"
    # The sibling was cancelled on e-2, not left running for 10 s.
    view = await wait_until(lambda s: s["outstanding"] == 0, http, gw, "e-2")
    assert view["state"] == "up"
    view = await wait_until(lambda s: s["state"] != "up", http, gw, "e-1")
    assert view["outstanding"] == 0 and view["queued"] == 0


async def test_labelled_server_with_token_comes_back_after_a_gateway_restart(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    gw = _gateway(cluster, port=port)
    ts = _taskserver(
        cluster, "pi-9", "--gateway", gw.url, toml=_self_registering("gta"), token=TOKEN
    )
    await wait_until(lambda s: s["state"] == "up", http, gw, "pi-9")
    gw.stop()
    gw2 = _gateway(cluster, port=port)
    view = await wait_until(lambda s: s["state"] == "up", http, gw2, "pi-9")
    assert (view["cluster"], view["address"]) == ("gta", ts.address)
    status, ans, _ = await query(
        http, gw2, {"class": "C", "targets": {"pool": "edge", "fanout": 1, "cluster": "gta"}}
    )
    assert status == 200, ans
    assert ans["tasks"][0]["server"] == "pi-9"


async def test_a_listener_that_does_not_speak_http_is_unreachable_not_a_crash() -> None:
    from taskserver.registration import GatewayUnreachable, gateway_call

    async def not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"\x00\x00\x00\x05thrift\r\n\r\n")  # e.g. a Thrift port given as gateway
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(not_http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(GatewayUnreachable):
            await gateway_call("POST", f"http://127.0.0.1:{port}/v1/servers", {}, timeout_s=5)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_deregistered_server_is_freed_without_the_cycle_collector(
    cluster: Cluster,
) -> None:
    # A running gateway freezes the objects of servers that joined (taskserver.heap), which
    # the cycle collector then never frees: a closed link must be freed by reference
    # counting alone, or every server that leaves would leak its link and connection.
    ts = _taskserver(cluster, "ts-freed")
    svc = GatewayService(GatewayConfig(), registry=CollectorRegistry())
    try:
        await svc.register(RegisterRequest("ts-freed", "default", ts.address, 2))
        link = svc.links["ts-freed"]
        assert await link.wait_up(5.0)
        conn = link._conn
        assert conn is not None
        refs = weakref.ref(link), weakref.ref(conn)
        del link, conn
        gc.collect()
        gc.disable()
        try:
            await svc.deregister("ts-freed")
            for _ in range(50):  # the transport reports the close a loop turn or two later
                if refs[0]() is None and refs[1]() is None:
                    break
                await asyncio.sleep(0.01)
            assert refs[0]() is None, gc.get_referrers(refs[0]())
            assert refs[1]() is None, gc.get_referrers(refs[1]())
        finally:
            gc.enable()
    finally:
        await svc.stop()
