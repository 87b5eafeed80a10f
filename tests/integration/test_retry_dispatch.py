"""Swayam's random dispatch with retries (§4.5) over real processes: task servers that
reject when busy, and a gateway pool that retries a refused task on another server."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register, wait_until

pytestmark = pytest.mark.integration

RETRY_POOL = '[[pools]]\nname = "default"\ndispatch = "retry"\nretry_delay_ms = 1.0\n'
MAX_QUERIES = 30
"""Short queries sent while one server is busy; each lands on it with probability 1/2."""
ENOUGH = 3
"""Stop once this many of them landed on the busy server."""


async def _busy_server_run(
    cluster: Cluster, http: aiohttp.ClientSession, toml: str
) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """Two one-slot servers that reject when busy; ts-1 held by a long task while short
    single-task queries go to a random server of the pool, one after another. Returns the
    short queries' (status, answer) and the gateway's /metrics text."""
    gw = cluster.gateway(toml)
    for sid in ("ts-1", "ts-2"):
        ts = cluster.taskserver(sid, "--reject-when-busy", "--slots", "1")
        await register(http, gw, ts)
    long_body = {
        "slo": {"percentile": 99, "latency_ms": 10_000},
        "targets": {"servers": ["ts-1"]},
        "task": {"service_ms": 3000},
    }
    blocker = asyncio.create_task(query(http, gw, long_body))
    await wait_until(lambda s: s["outstanding"] == 1, http, gw, "ts-1")
    short_body = {
        "slo": {"percentile": 99, "latency_ms": 2000},
        "targets": {"pool": "default", "fanout": 1},
        "task": {"service_ms": 5},
    }
    answers: list[tuple[int, dict[str, Any]]] = []
    hit = 0
    while len(answers) < MAX_QUERIES and hit < ENOUGH and not blocker.done():
        status, body, _ = await query(http, gw, short_body)
        answers.append((status, body))
        task = body.get("tasks", [{}])[0]
        hit += status != 200 or task.get("retries", 0) > 0
    assert not blocker.done(), "ts-1 was not kept busy for the whole run"
    assert (await blocker)[0] == 200
    async with http.get(gw.url + "/metrics") as resp:
        metrics = await resp.text()
    return answers, metrics


def _retries_metric(text: str) -> float:
    m = re.search(r'^tailgate_task_retries_total\{pool="default"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_a_retry_pool_sends_a_refused_task_to_the_other_server(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    answers, metrics = await _busy_server_run(cluster, http, RETRY_POOL)
    assert all(status == 200 for status, _ in answers), answers
    tasks = [body["tasks"][0] for _, body in answers]
    assert {t["server"] for t in tasks} == {"ts-2"}  # ts-1 refused every one it was offered
    retried = [t for t in tasks if "retries" in t]
    assert len(retried) >= 1, "no query landed on the busy server"
    assert all(t["retries"] == 1 and t["status"] == "ok" for t in retried)
    assert _retries_metric(metrics) == len(retried)
    assert 'tailgate_tasks_total{pool="default",status="rejected"}' not in metrics


async def test_a_queue_pool_answers_the_busy_refusal_503_as_before(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    answers, metrics = await _busy_server_run(cluster, http, "")
    refused = [body for status, body in answers if status != 200]
    assert len(refused) >= 1, "no query landed on the busy server"
    for body in refused:
        assert body["error"]["code"] == "task_rejected"
        assert "busy:" in body["error"]["message"]
        assert body["tasks"][0]["server"] == "ts-1" and "retries" not in body["tasks"][0]
    assert _retries_metric(metrics) == 0.0
