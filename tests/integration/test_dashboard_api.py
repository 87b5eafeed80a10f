"""What the dashboard reads from a live gateway: its files (the vendored chart library
included, nothing else), the executor and silence of each server, and query outcomes
in the history."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register, wait_until

pytestmark = pytest.mark.integration


async def test_the_dashboard_files_and_figures_come_from_the_gateway(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway("[gateway]\nhistory_interval_s = 0.2\n")
    await register(http, gw, cluster.taskserver("ts-1"))

    for path, media in (
        ("/dashboard", "text/html"),
        ("/dashboard/dashboard.js", "text/javascript"),
        ("/dashboard/vendor/uplot/uPlot.iife.min.js", "text/javascript"),
        ("/dashboard/vendor/uplot/uPlot.min.css", "text/css"),
        ("/dashboard/vendor/uplot/LICENSE", "text/plain"),
    ):
        async with http.get(gw.url + path) as r:
            assert r.status == 200, path
            assert r.content_type == media, path
    # Only the listed files: not the vendor folder's README, not a path out of static/.
    for path in (
        "/dashboard/vendor/uplot/README.md",
        "/dashboard/vendor/uplot/",
        "/dashboard/x/../dashboard.py",
    ):
        async with http.get(gw.url + path) as r:
            assert r.status == 404, path
            assert (await r.json())["error"]["code"] == "not_found", path

    # The heartbeat tells the gateway what the server runs.
    view = await wait_until(lambda s: s.get("executor") == "emulated", http, gw, "ts-1")
    assert view["state"] == "up"
    async with http.get(gw.url + "/v1/dashboard") as r:
        live = await r.json()
    (row,) = live["servers"]
    assert row["executor"] == "emulated"
    assert 0.0 <= row["silent_s"] < live["heartbeat"]["timeout_s"]

    statuses = await asyncio.gather(
        *(
            query(http, gw, {"class": "A", "targets": {"pool": "default", "fanout": 1}})
            for _ in range(20)
        )
    )
    assert {s for s, _, _ in statuses} == {200}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    met = 0.0
    while loop.time() < deadline and met < 19.5:
        async with http.get(gw.url + "/v1/history?since_s=60") as r:
            samples = (await r.json())["samples"]
        # Each sample's rate times the time it covers adds back up to the 20 queries.
        met = 0.0
        for before, s in itertools.pairwise(samples):
            rate = s.get("outcome_per_s", {}).get("A", {}).get("met", 0.0)
            met += rate * (s["t"] - before["t"])
        await asyncio.sleep(0.2)
    assert met == pytest.approx(20, abs=1.5)
