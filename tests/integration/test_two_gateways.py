"""Gateway replicas on loopback: shared task servers, own books, one owner per central pool."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, wait_until
from tests.integration.harness import Proc

pytestmark = pytest.mark.integration

FAST = "[gateway]\nheartbeat_s = 0.2\nheartbeat_timeout_s = 1.0\n"
SLO = {"percentile": 99, "latency_ms": 2000}


def _pool(name: str, queueing: str, servers: list[Proc]) -> str:
    entries = ", ".join(
        f'{{id = "{s.info["server_id"]}", address = "{s.address}"}}' for s in servers
    )
    return f'[[pools]]\nname = "{name}"\nqueueing = "{queueing}"\nservers = [{entries}]\n'


async def _gateway_id(http: aiohttp.ClientSession, gw: Proc) -> str:
    async with http.get(gw.url + "/readyz") as r:
        assert r.status == 200
        return str((await r.json())["gateway_id"])


async def _queries_counted(http: aiohttp.ClientSession, gw: Proc) -> float:
    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    return sum(
        float(m.group(1))
        for m in re.finditer(r'^tailgate_queries_total\{class="A",[^}]*\} (\S+)$', text, re.M)
    )


async def _until_answer(
    http: aiohttp.ClientSession,
    gw: Proc,
    body: Any,
    status: int,
    code: str | None = None,
    timeout_s: float = 8.0,
) -> dict[str, Any]:
    """Query until the answer has this status (and error code); else fail with the last one."""
    deadline = time.monotonic() + timeout_s
    while True:
        got, ans, _ = await query(http, gw, body)
        if got == status and (code is None or ans["error"]["code"] == code):
            return ans
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {status}, still {got}: {ans}")
        await asyncio.sleep(0.1)


async def test_two_gateways_share_task_servers_and_each_counts_its_own_queries(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    servers = [cluster.taskserver(f"ts-{i}", "--slots", "4") for i in (1, 2)]
    toml = FAST + _pool("default", "server", servers)
    gws = [cluster.gateway(toml), cluster.gateway(toml)]
    for gw in gws:
        for sid in ("ts-1", "ts-2"):
            await wait_until(lambda s: s["state"] == "up", http, gw, sid)
    body = {"class": "A", "targets": {"pool": "default", "all": True}, "task": {"service_ms": 2}}
    counts = (20, 30)
    answers = await asyncio.gather(
        *(query(http, gw, body) for gw, n in zip(gws, counts, strict=True) for _ in range(n))
    )
    assert [a[0] for a in answers] == [200] * sum(counts), [a[1] for a in answers if a[0] != 200]
    # Query (and so task) ids carry each replica's own prefix: no collision on a server.
    prefixes = [
        {a[1]["query_id"].split("-")[0] for a in part} for part in (answers[:20], answers[20:])
    ]
    assert len(prefixes[0]) == len(prefixes[1]) == 1 and prefixes[0] != prefixes[1]
    for gw, n in zip(gws, counts, strict=True):
        assert await _queries_counted(http, gw) == n
        async with http.get(gw.url + "/v1/servers") as r:
            views = (await r.json())["servers"]
        # Each replica's book learns only from the results it sees.
        assert {v["id"]: v["results"] for v in views} == {"ts-1": n, "ts-2": n}
        assert {v["cdf_samples"] for v in views} == {n}
        assert all("owner" not in v for v in views)  # server queueing: nobody owns them


async def test_a_central_pool_has_one_owner_and_a_standby_takes_over(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    agent = cluster.taskserver("e-1")
    toml = FAST + _pool("edge", "central", [agent])
    gw1 = cluster.gateway(toml)
    id1 = await _gateway_id(http, gw1)
    await wait_until(lambda s: s["state"] == "up" and s.get("owner") == id1, http, gw1, "e-1")
    gw2 = cluster.gateway(toml)
    id2 = await _gateway_id(http, gw2)
    view = await wait_until(lambda s: s["state"] == "owned_elsewhere", http, gw2, "e-1")
    assert view["owner"] == id1
    by_pool = {"slo": SLO, "targets": {"pool": "edge", "fanout": 1}}
    by_server = {"slo": SLO, "targets": {"servers": ["e-1"]}}
    for body in (by_pool, by_server):
        status, ans, headers = await query(http, gw2, body)
        assert status == 503, ans
        assert ans["error"]["code"] == "pool_owned_elsewhere"
        assert ans["owner"] == id1 and id1 in ans["error"]["message"]
        assert headers["Retry-After"] == "1"
    status, ans, _ = await query(http, gw1, by_pool)
    assert status == 200, ans

    # The owner stops answering (frozen, its connection still open): its lease lapses
    # and the standby takes the pool over.
    gw1.popen.send_signal(signal.SIGSTOP)
    try:
        await _until_answer(http, gw2, by_pool, 200)
    finally:
        gw1.popen.send_signal(signal.SIGCONT)
    # A task it sends before its next heartbeat tells it is refused by the server (503
    # task_rejected, "owned by gateway ..."); then it knows, and says who owns the pool.
    ans = await _until_answer(http, gw1, by_pool, 503, "pool_owned_elsewhere")
    assert ans["owner"] == id2

    # The new owner stops for good: its connection closes and the first one takes over.
    gw2.popen.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(gw2.popen.wait, 10) == 0
    await _until_answer(http, gw1, by_pool, 200)
    await wait_until(lambda s: s["state"] == "up" and s.get("owner") == id1, http, gw1, "e-1")
