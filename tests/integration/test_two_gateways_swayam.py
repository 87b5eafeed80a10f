"""Two gateway replicas in front of one Swayam-scaled pool agree on the global request rate.

Each gateway reports its local rate with its heartbeats; the shared task servers list every
gateway's rate in their replies; each gateway sums them (Swayam §4.2, summing beyond the
paper). The autoscalers use the Kubernetes actuator against a fake API server in this process,
so scaling patches a replica count and starts no process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.links import ServerLink
from taskserver.executors import EmulatedExecutor
from taskserver.queues import create_task_queue
from taskserver.server import TaskService
from taskserver.service_time import ServiceSpec, make_distribution
from tests.integration.conftest import Cluster, wait_until
from tests.integration.harness import Proc, start_gateway

pytestmark = pytest.mark.integration


async def test_links_of_two_gateways_learn_each_others_rate_through_one_server() -> None:
    svc = TaskService(
        "ts-1",
        create_task_queue("fifo"),
        EmulatedExecutor(make_distribution(ServiceSpec(kind="constant", value_ms=1.0))),
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(svc.protocol_factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    links = [
        ServerLink(
            "ts-1",
            "127.0.0.1",
            port,
            pool="default",
            on_result=lambda *a: None,
            on_failure=lambda *a: None,
            heartbeat_s=0.05,
            heartbeat_timeout_s=1.0,
            gateway_id=gid,
        )
        for gid in ("gw-a", "gw-b")
    ]
    try:
        for link, rate in zip(links, (10.0, 30.0), strict=True):
            link.load_per_s = rate
            link.start()
        want = [("gw-a", 10.0), ("gw-b", 30.0)]
        deadline = time.monotonic() + 5.0
        while any(sorted(lk.frontends) != want for lk in links):
            assert time.monotonic() < deadline, [lk.frontends for lk in links]
            await asyncio.sleep(0.02)
        # One gateway stops: the server forgets it when its connection closes.
        await links[1].close()
        deadline = time.monotonic() + 5.0
        while links[0].frontends != [("gw-a", 10.0)]:
            assert time.monotonic() < deadline, links[0].frontends
            await asyncio.sleep(0.02)
    finally:
        for link in links:
            await link.close()
        server.close()
        await server.wait_closed()
        await svc.close()


# -- two gateway processes ---------------------------------------------------------------

DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/tailgate-taskserver/scale"


class _FakeScaleApi:
    """The scale subresource of one Deployment: what the Kubernetes actuator reads and patches."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.patches: list[int] = []

    def _scale(self) -> web.Response:
        return web.json_response(
            {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {"name": "tailgate-taskserver", "namespace": "default"},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas},
            }
        )

    async def get(self, request: web.Request) -> web.Response:
        return self._scale()

    async def patch(self, request: web.Request) -> web.Response:
        self.replicas = int(json.loads(await request.read())["spec"]["replicas"])
        self.patches.append(self.replicas)
        return self._scale()


@pytest.fixture
async def scale_api() -> AsyncIterator[tuple[_FakeScaleApi, str]]:
    fake = _FakeScaleApi(replicas=2)
    app = web.Application()
    app.router.add_get(DEPLOYMENT, fake.get)
    app.router.add_patch(DEPLOYMENT, fake.patch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield fake, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{url}"}}
users:
- name: fake
  user: {{token: fake}}
contexts:
- name: fake
  context: {{cluster: fake, user: fake, namespace: default}}
current-context: fake
"""

CONFIG = """[gateway]
heartbeat_s = 0.2
heartbeat_timeout_s = 1.0

[admission]
policy = "none"

[autoscaling]
enabled = true
policy = "swayam"
pool = "default"
actuator = "kubernetes"
k8s_name = "tailgate-taskserver"
k8s_namespace = "default"
min_replicas = 1
max_replicas = 16
interval_s = 1.0
setup_s = 0.0
burst = 1.0

[[pools]]
name = "default"
queueing = "server"
servers = [{servers}]
[pools.prior]  # the service law of the tasks below, so n_B is sized on it from the start
kind = "constant"
value_ms = 50.0
"""
RATES_PER_S = (7.0, 15.0)
"""Queries per second sent to each gateway (one 50 ms task each). With the p99 <= 100 ms
target, the model wants 1 backend below ~17 tasks/s and 2 up to ~33 (the prediction runs up
to ~1.3x the steady rate after the step from zero): the sum needs 2, the first gateway's own
share alone would get 1."""
LOAD_S = 12.0
"""Longest the load runs while the test waits for the gateways to agree."""
BODY = {"class": "A", "targets": {"pool": "default", "fanout": 1}, "task": {"service_ms": 50}}


async def _send_at(http: aiohttp.ClientSession, gw: Proc, rate: float, stop: asyncio.Event) -> int:
    """Open-loop load: one query every 1/rate s until `stop`; how many were answered 200."""
    ok = 0
    pending: set[asyncio.Task[int]] = set()

    async def one() -> int:
        async with http.post(gw.url + "/v1/queries", json=BODY) as r:
            await r.read()
            return r.status

    start = time.monotonic()
    n = 0
    while not stop.is_set():
        pending.add(asyncio.create_task(one()))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start + n / rate - time.monotonic()))
    for status in await asyncio.gather(*pending, return_exceptions=True):
        ok += status == 200
    return ok


def _state(snapshot: dict[str, Any]) -> dict[str, Any]:
    ps = snapshot["policy_state"]
    return {
        "n_F": ps.get("frontends", {}).get("count"),
        "ids": ps.get("frontends", {}).get("ids"),
        "local": ps.get("local_rate_per_s"),
        "global": ps.get("global_rate_per_s"),
        "n_B": (ps.get("estimate") or {}).get("backends"),
    }


def _agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["n_F"] != 2 or b["n_F"] != 2 or a["ids"] != b["ids"]:
        return False
    if not (a["global"] and b["global"] and a["local"] and b["local"]):
        return False
    close = abs(a["global"] - b["global"]) <= 0.15 * max(a["global"], b["global"])
    return close and a["n_B"] is not None and a["n_B"] == b["n_B"]


@pytest.mark.slow
async def test_two_swayam_gateways_agree_on_the_global_rate_and_n_b(
    scale_api: tuple[_FakeScaleApi, str],  # first: it outlives the gateways that call it
    cluster: Cluster,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    fake, url = scale_api
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(url=url))
    servers = [cluster.taskserver(f"ts-{i}", "--slots", "4") for i in (1, 2)]
    entries = ", ".join(
        f'{{id = "{s.info["server_id"]}", address = "{s.address}"}}' for s in servers
    )
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(CONFIG.format(servers=entries))
    # Started off the event loop: each gateway's actuator calls the fake API (in this loop)
    # before the gateway announces itself.
    env = {"KUBECONFIG": str(kubeconfig)}
    gws = await asyncio.gather(*(asyncio.to_thread(start_gateway, cfg, env=env) for _ in range(2)))
    cluster.procs.extend(gws)
    for gw in gws:
        for s in servers:
            await wait_until(lambda v: v["state"] == "up", http, gw, s.info["server_id"])
    ids = []
    for gw in gws:
        async with http.get(gw.url + "/readyz") as r:
            ids.append((await r.json())["gateway_id"])

    stop = asyncio.Event()
    load = [
        asyncio.create_task(_send_at(http, gw, rate, stop))
        for gw, rate in zip(gws, RATES_PER_S, strict=True)
    ]
    states: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + LOAD_S
        await asyncio.sleep(3.0)  # a few ticks of load on both
        while True:
            states = []
            for gw in gws:
                async with http.get(gw.url + "/v1/autoscaler") as r:
                    states.append(_state(await r.json()))
            if _agree(*states) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
    finally:
        stop.set()
        answered = await asyncio.gather(*load)
    print(f"two gateways: {states}, answered {answered}, scale patches {fake.patches}")
    a, b = states
    assert a["n_F"] == b["n_F"] == 2, states
    assert a["ids"] == b["ids"] == sorted(ids), states
    # Each gateway's own rate is its share; the global one is about their sum on both.
    assert a["local"] < b["local"], states
    for s in states:
        assert s["global"] > s["local"], states
    assert abs(a["global"] - b["global"]) <= 0.15 * max(a["global"], b["global"]), states
    total = sum(RATES_PER_S)
    assert 0.6 * total < a["global"] < 1.4 * total, states
    assert a["n_B"] == b["n_B"] >= 2, states  # sized for the sum, not for one share
    assert all(n > 0 for n in answered), answered
