"""Real edge agents behind a live gateway: registration with the token, per-cluster queries,
a killed agent, a wrong token, and re-registration after a gateway restart."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_agent.sensing import decode_series
from tests.integration.conftest import Cluster, query, wait_until
from tests.integration.harness import REPO_ROOT, Proc, free_port, start_cli

pytestmark = pytest.mark.integration

TOKEN = "edge-token-for-loopback-tests"
CLUSTERS = ("server-room", "wet-lab", "faculty", "gta")


@pytest.fixture(scope="module")
def template_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One month of readings every 5 min, seeded once and copied for each agent."""
    db = tmp_path_factory.mktemp("edge") / "template.db"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.cli",
            "edge-agent",
            "seed",
            "--db",
            str(db),
            "--months",
            "1",
        ],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return db


def _gateway(c: Cluster, port: int = 0) -> Proc:
    p = start_cli(["gateway", "--port", str(port)], env={"TAILGATE_AGENT_TOKEN": TOKEN})
    c.procs.append(p)
    return p


def _agent(
    c: Cluster,
    template: Path,
    gw: Proc,
    n: int,
    cluster: str,
    *,
    token: str = TOKEN,
    profile: str = "none",
) -> Proc:
    db = c.tmp_path / f"pi-{n}.db"
    if not db.exists():
        shutil.copy(template, db)
    args = [
        "edge-agent",
        "run",
        "--id",
        f"pi-{n}",
        "--cluster",
        cluster,
        "--port",
        "0",
        "--db",
        str(db),
        "--gateway",
        gw.url,
        "--register-interval-s",
        "0.3",
        "--profile",
        profile,
    ]
    p = start_cli(args, env={"TAILGATE_AGENT_TOKEN": token})
    c.procs.append(p)
    return p


async def _up(
    http: aiohttp.ClientSession, gw: Proc, ids: set[str], timeout_s: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    servers: dict[str, Any] = {}
    while time.monotonic() < deadline:
        async with http.get(gw.url + "/v1/servers") as r:
            servers = {s["id"]: s for s in (await r.json())["servers"]}
        if ids <= {sid for sid, s in servers.items() if s["state"] == "up"}:
            return servers
        await asyncio.sleep(0.1)
    raise AssertionError(f"agents {sorted(ids)} not all up; gateway sees {servers}")


def _week() -> dict[str, Any]:
    end = datetime.now(UTC) - timedelta(days=1)
    start = end - timedelta(days=7)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return {
        "op": "range",
        "sensor": "temperature",
        "start": start.strftime(fmt),
        "end": end.strftime(fmt),
    }


SLO = {"percentile": 99, "latency_ms": 5000}


async def test_agents_register_and_a_per_cluster_query_merges_four_agents_records(
    cluster: Cluster, http: aiohttp.ClientSession, template_store: Path
) -> None:
    gw = _gateway(cluster)
    for n, name in enumerate(CLUSTERS):
        _agent(cluster, template_store, gw, n, name)
    servers = await _up(http, gw, {f"pi-{n}" for n in range(4)})
    assert {s["cluster"] for s in servers.values()} == set(CLUSTERS)
    assert {s["queueing"] for s in servers.values()} == {"central"}
    status, body, _ = await query(
        http, gw, {"slo": SLO, "targets": {"pool": "edge", "per_cluster": 1}, "task": _week()}
    )
    assert status == 200, body
    assert sorted(t["server"] for t in body["tasks"]) == [f"pi-{n}" for n in range(4)]
    for t in body["tasks"]:
        series = t["result"]["series"]["temperature"]
        readings = decode_series(series)
        # A week of 5-minute readings (the end bound is exclusive).
        assert len(readings) == series["count"] == 7 * 288
        assert t["result"]["agent"] == t["server"]
    # A sensor no agent has is the client's mistake: the agents refuse the task as invalid,
    # and the query answers 400 naming the field, at once.
    bad = {**_week(), "sensor": "pressure"}
    status, body, _ = await query(
        http, gw, {"slo": SLO, "targets": {"pool": "edge", "all": True}, "task": bad}
    )
    assert status == 400
    assert (body["error"]["code"], body["error"]["field"]) == ("invalid_task", "task.sensor")
    assert "pressure" in body["error"]["message"]


async def test_a_killed_agent_is_marked_down_and_its_queries_fail_fast(
    cluster: Cluster, http: aiohttp.ClientSession, template_store: Path
) -> None:
    gw = _gateway(cluster)
    # The server-room profile: about 80 ms per task, so ten queued tasks take ~0.8 s.
    agent = _agent(cluster, template_store, gw, 0, "server-room", profile="server-room")
    await _up(http, gw, {"pi-0"})
    body = {"slo": SLO, "targets": {"servers": ["pi-0"]}, "task": _week()}
    # Ten queries for one agent: the gateway holds them in that agent's queue and sends one
    # at a time, so most are still waiting when it dies.
    pending = [asyncio.create_task(query(http, gw, body)) for _ in range(10)]
    # All ten at the gateway before the kill (one arriving after it would find no server up).
    # `outstanding` counts the queued tasks too; `results` the few a fast draw already ended.
    await wait_until(lambda s: s["outstanding"] + s["results"] >= 10, http, gw, "pi-0")
    t0 = time.monotonic()
    agent.kill()
    answers = await asyncio.gather(*pending)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0  # far from SLO + grace (6 s): failed fast, not timed out
    failed = [b for status, b, _ in answers if status != 200]
    assert failed and all(b["error"]["code"] == "task_failed" for b in failed)
    async with http.get(gw.url + "/v1/servers") as r:
        view = {s["id"]: s for s in (await r.json())["servers"]}["pi-0"]
    assert view["state"] == "down"


async def test_a_wrong_token_keeps_an_agent_out_and_agents_come_back_after_a_gateway_restart(
    cluster: Cluster, http: aiohttp.ClientSession, template_store: Path
) -> None:
    port = free_port()
    gw = _gateway(cluster, port)
    _agent(cluster, template_store, gw, 0, "faculty")
    _agent(cluster, template_store, gw, 1, "gta", token="not-the-token")
    await _up(http, gw, {"pi-0"})
    await asyncio.sleep(1.0)  # a few registration periods of the wrong-token agent
    async with http.get(gw.url + "/v1/servers") as r:
        assert {s["id"] for s in (await r.json())["servers"]} == {"pi-0"}
    gw.stop()
    gw2 = _gateway(cluster, port)
    servers = await _up(http, gw2, {"pi-0"}, timeout_s=10.0)
    assert servers["pi-0"]["cluster"] == "faculty" and "pi-1" not in servers
    status, body, _ = await query(
        http,
        gw2,
        {
            "slo": SLO,
            "targets": {"pool": "edge", "cluster": "faculty", "fanout": 1},
            "task": {"op": "latest", "sensor": "humidity"},
        },
    )
    assert status == 200, body
    assert isinstance(body["tasks"][0]["result"]["value"], float)
