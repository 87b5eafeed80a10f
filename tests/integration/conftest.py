"""Fixtures that start real gateways and task servers and always stop them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.harness import Proc, start_gateway, start_taskserver


class Cluster:
    """Processes started by one test; stopped at teardown whatever happened."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []

    def gateway(self, toml: str = "", *args: str) -> Proc:
        cfg = None
        if toml:
            cfg = self.tmp_path / f"gateway-{len(self.procs)}.toml"
            cfg.write_text(toml)
        p = start_gateway(cfg, *args)
        self.procs.append(p)
        return p

    def taskserver(self, server_id: str, *args: str) -> Proc:
        p = start_taskserver(server_id, *args)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def register(
    http: aiohttp.ClientSession, gw: Proc, ts: Proc, *, pool: str = "default", slots: int = 1
) -> None:
    """Register a task server and wait until the gateway's link to it is up."""
    body = {"id": ts.info["server_id"], "address": ts.address, "pool": pool, "slots": slots}
    async with http.post(gw.url + "/v1/servers", json=body) as resp:
        assert resp.status in (200, 201), await resp.text()
    await wait_until(lambda s: s["state"] == "up", http, gw, ts.info["server_id"])


async def server_views(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    """GET /v1/servers: every server's view, by id."""
    async with http.get(url + "/v1/servers") as resp:
        return {s["id"]: s for s in (await resp.json())["servers"]}


async def wait_until(
    pred: Callable[[dict[str, Any]], bool],
    http: aiohttp.ClientSession,
    gw: Proc,
    server_id: str,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Poll GET /v1/servers until the server's view satisfies pred."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    view: dict[str, Any] = {}
    while loop.time() < deadline:
        async with http.get(gw.url + "/v1/servers") as resp:
            servers = {s["id"]: s for s in (await resp.json())["servers"]}
        view = servers.get(server_id, {})
        if view and pred(view):
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"server {server_id} never reached the state; last view {view}")


async def query(
    http: aiohttp.ClientSession, gw: Proc, body: Any
) -> tuple[int, dict[str, Any], Any]:
    """POST /v1/queries; returns (status, JSON body, headers)."""
    async with http.post(gw.url + "/v1/queries", json=body) as resp:
        return resp.status, await resp.json(), resp.headers
