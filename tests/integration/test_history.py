"""The gateway's history outlives a restart, and its metrics move with traffic."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register
from tests.integration.harness import Proc

pytestmark = pytest.mark.integration


def history_toml(db: Path) -> str:
    return f'[gateway]\nstorage_url = "sqlite:///{db}"\nhistory_interval_s = 0.2\n'


async def history(http: aiohttp.ClientSession, gw: Proc, since_s: float = 600) -> list[Any]:
    async with http.get(gw.url + f"/v1/history?since_s={since_s}") as r:
        assert r.status == 200, await r.text()
        return (await r.json())["samples"]


async def wait_for_samples(
    http: aiohttp.ClientSession, gw: Proc, enough: Any, timeout_s: float = 10.0
) -> list[Any]:
    """Poll /v1/history until enough(samples) holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    samples: list[Any] = []
    while loop.time() < deadline:
        samples = await history(http, gw)
        if enough(samples):
            return samples
        await asyncio.sleep(0.1)
    raise AssertionError(f"history never filled; last {samples[-3:]}")


def metric(text: str, line_start: str) -> float:
    """The value of the first sample line that starts with line_start."""
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_start!r} in /metrics")


async def test_history_survives_a_gateway_restart_and_metrics_move(
    cluster: Cluster, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    db = tmp_path / "history.db"
    gw = cluster.gateway(history_toml(db))
    await register(http, gw, cluster.taskserver("ts-1"))
    body = {"class": "A", "targets": {"pool": "default", "fanout": 1}}
    statuses = await asyncio.gather(*(query(http, gw, body) for _ in range(30)))
    assert {s for s, _, _ in statuses} == {200}

    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    server = 'pool="default",server="ts-1"'
    assert metric(text, f"tailgate_server_tasks_total{{{server}}}") == 30.0
    assert metric(text, f"tailgate_server_task_deadline_misses_total{{{server}}}") >= 0.0
    assert metric(text, f"tailgate_server_task_miss_ratio{{{server}}}") >= 0.0
    assert metric(text, 'tailgate_pool_task_miss_ratio{pool="default"}') >= 0.0
    assert metric(text, f"tailgate_server_queue_depth{{{server}}}") == 0.0  # all answered
    p99 = metric(text, 'tailgate_server_post_queuing_seconds{q="0.99",server="ts-1"}')
    p50 = metric(text, 'tailgate_server_post_queuing_seconds{q="0.5",server="ts-1"}')
    assert 0 < p50 <= p99
    assert 'tailgate_query_latency_seconds_count{class="A",fanout="1"} 30.0' in text

    # Samples carry the traffic: answered queries per second and the tail of class A.
    before = await wait_for_samples(
        http, gw, lambda ss: any(s["qps"].get("A", 0) > 0 and "A" in s["tail_ms"] for s in ss)
    )
    await wait_for_samples(http, gw, lambda ss: len(ss) >= len(before) + 2)
    busy = [s for s in before if s["qps"].get("A", 0) > 0]
    assert busy and busy[0]["servers"] == {"up": 1}
    assert busy[0]["tail_ms"]["A"] > 0
    async with http.get(gw.url + "/v1/history?since_s=-3") as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == "since_s"

    gw.stop()
    assert db.exists()
    again = cluster.gateway(history_toml(db))
    after = await history(http, again)
    stamps = {s["t"] for s in after}
    assert {s["t"] for s in before} <= stamps  # every sample from before the restart
    assert any(s["qps"].get("A", 0) > 0 for s in after)
