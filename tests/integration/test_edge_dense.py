"""Several edge agents in one process (`tailgate edge-agent run --count N`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, server_views, wait_until
from tests.integration.harness import REPO_ROOT, start_cli

pytestmark = pytest.mark.integration

TOKEN = "tok-for-dense-agents"
SLO = {"percentile": 99, "latency_ms": 5000}


def _week() -> dict[str, Any]:
    end = datetime.now(UTC) - timedelta(days=1)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    start = end - timedelta(days=7)
    return {"op": "range", "sensor": "temperature", "start": start.strftime(fmt),
            "end": end.strftime(fmt)}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """One month of readings every 5 min: the store the process's agents share."""
    db = tmp_path / "shared.db"
    subprocess.run(
        [sys.executable, "-m", "deploy.cli", "edge-agent", "seed", "--db", str(db),
         "--months", "1"],
        cwd=REPO_ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return db


async def test_one_process_hosts_agents_that_register_answer_and_read_a_sample(
    cluster: Cluster, http: aiohttp.ClientSession, store: Path
) -> None:
    db = store
    env = {"TAILGATE_AGENT_TOKEN": TOKEN}
    gw = start_cli(["gateway", "--port", "0"], env=env)
    cluster.procs.append(gw)
    dense = start_cli(
        ["edge-agent", "run", "--id", "pi", "--count", "4", "--first", "5", "--cluster",
         "wet-lab", "--profile", "wet-lab", "--read-sample", "0.5", "--seed", "11",
         "--port", "0", "--db", str(db), "--gateway", gw.url, "--register-interval-s", "0.3"],
        env=env,
    )  # fmt: skip
    cluster.procs.append(dense)
    ids = [f"pi-{i}" for i in range(5, 9)]
    for sid in ids:
        await wait_until(lambda s: s["state"] == "up", http, gw, sid)
    servers = await server_views(http, gw.url)
    assert len({servers[s]["address"] for s in ids}) == 4  # a listener each
    assert {servers[s]["cluster"] for s in ids} == {"wet-lab"}
    # Each agent answers its own tasks: some from the store, the rest by their draw alone.
    results = []
    for _ in range(8):
        status, body, _ = await query(
            http, gw, {"slo": SLO, "targets": {"pool": "edge", "all": True}, "task": _week()}
        )
        assert status == 200, body
        assert sorted(t["server"] for t in body["tasks"]) == ids
        assert all(t["result"]["agent"] == t["server"] for t in body["tasks"])
        results += [t["result"] for t in body["tasks"]]
    real = [r for r in results if "series" in r]
    assert real and len(real) < len(results)
    assert all(r["series"]["temperature"]["count"] == 7 * 288 for r in real)
    assert all(r["emulated"] is True for r in results if "series" not in r)
    status, body, _ = await query(
        http, gw, {"slo": SLO, "targets": {"pool": "edge", "all": True}, "task": {"op": "status"}}
    )
    assert status == 200, body
    counts = {t["server"]: t["result"] for t in body["tasks"]}
    assert sum(c["real_reads"] for c in counts.values()) == len(real)
    assert sum(c["real_reads"] + c["emulated_reads"] for c in counts.values()) == 32
    assert {c["profile"] for c in counts.values()} == {"wet-lab"}
    # SIGTERM drains every agent and each deregisters; the process exits 0.
    dense.popen.send_signal(15)
    assert await asyncio.to_thread(dense.popen.wait, 10) == 0
    for _ in range(100):
        if not set(ids) & set(await server_views(http, gw.url)):
            break
        await asyncio.sleep(0.05)
    assert not set(ids) & set(await server_views(http, gw.url))
