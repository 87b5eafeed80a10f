"""Edge agents as real processes on loopback: light imports, sensing over Thrift, crashes."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadtests.bench_edge import TaskClient, rss_kib
from tests.integration.harness import REPO_ROOT, Proc, start_cli

pytestmark = pytest.mark.integration

# aiohttp too: the agent registers through the standard library (taskserver.registration).
BLOCKED = ("numpy", "torch", "onnxruntime", "prometheus_client", "aiohttp")
SITECUSTOMIZE = '''
"""Refuses the heavy packages an edge agent must never import, and logs each attempt."""
import os
import sys

_LOG = os.environ["EDGE_IMPORT_LOG"]
_BLOCKED = {BLOCKED!r}


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            with open(_LOG, "a") as f:
                f.write("blocked " + name + "\\n")
            raise ImportError("blocked on an edge agent: " + name)
        return None


sys.meta_path.insert(0, _Refuse())
with open(_LOG, "a") as f:
    f.write("armed\\n")
'''
# The bound: 60 MB. An agent here measures ~49 MiB while serving
# (loadtests/bench_edge.py); numpy or aiohttp would each add ~10 MiB.
RSS_LIMIT_KIB = 60_000_000 // 1024


def agent_args(db: Path, *extra: str) -> list[str]:
    return [
        "edge-agent",
        "run",
        "--id",
        "pi-1",
        "--cluster",
        "lab",
        "--port",
        "0",
        "--db",
        str(db),
        *extra,
    ]


def start_agent(db: Path, *extra: str) -> Proc:
    return start_cli(agent_args(db, *extra))


async def run_cli(*args: str) -> tuple[int, str, str]:
    """`python -m deploy.cli ARGS` to completion: (exit status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        *args,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return int(proc.returncode or 0), out.decode(), err.decode()


def count_rows(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(con.execute("SELECT count(*) FROM readings").fetchone()[0])
    finally:
        con.close()


async def wait_for_rows(db: Path, at_least: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            rows = count_rows(db)
        except sqlite3.OperationalError:  # not created yet
            rows = 0
        if rows >= at_least:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} rows after {timeout_s} s")


async def sensing(address: str, payload: dict[str, Any]) -> dict[str, Any]:
    async with TaskClient(address) as client:
        res = await client.run(payload)
    assert res.status == 0, res.error
    return json.loads(res.result)


async def test_agent_runs_without_heavy_packages_and_stays_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("{BLOCKED!r}", repr(BLOCKED)))
    log = tmp_path / "imports.log"
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("EDGE_IMPORT_LOG", str(log))
    db = tmp_path / "edge.db"
    seeded = await run_cli("edge-agent", "seed", "--db", str(db), "--months", "1")
    assert seeded[0] == 0, seeded[2]
    agent = start_agent(db, "--sample-interval-s", "0.05")
    try:
        now = int(time.time())
        for days in (1, 7, 30):
            start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - days * 86_400))
            result = await sensing(
                agent.address,
                {"op": "range", "sensors": ["temperature", "humidity"], "start": start, "end": now},
            )
            assert result["agent"] == "pi-1"
            assert result["count"] >= 2 * days * 288 - 4
        latest = await sensing(agent.address, {"op": "latest", "sensor": "humidity"})
        assert latest["value"] is not None
        async with TaskClient(agent.address) as client:
            status = await client.status()
        assert status.executor == "sensing" and status.server_id == "pi-1"
        assert status.tasks_done == 4
        rss = rss_kib(agent.popen.pid)
    finally:
        agent.stop()
    assert agent.popen.returncode == 0  # SIGTERM stops it cleanly
    lines = log.read_text().splitlines()
    assert lines[0] == "armed", "sitecustomize was not loaded"
    assert [line for line in lines if line.startswith("blocked")] == []
    assert rss < RSS_LIMIT_KIB, f"agent RSS {rss / 1024:.1f} MiB while serving"


async def test_kill_9_while_writing_then_restart_on_the_same_file(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    agent = start_agent(db, "--sample-interval-s", "0.01")
    try:
        observed = await wait_for_rows(db, 6)
        await asyncio.sleep(0.013)  # land between two 10 ms samples, or in one
        agent.kill()
    finally:
        agent.stop()  # closes its pipe (and stops it, if the kill was never reached)
    assert agent.popen.returncode == -9
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    finally:
        con.close()
    assert count_rows(db) >= observed
    again = start_agent(db, "--sample-interval-s", "3600")
    try:
        status = await sensing(again.address, {"op": "status"})
        assert status["rows"] >= observed
        latest = await sensing(again.address, {"op": "latest", "sensor": "temperature"})
        assert latest["ts"] is not None
    finally:
        again.stop()


async def test_a_broken_store_is_a_clear_error_and_a_nonzero_exit(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    db.write_bytes(b"not a database at all\n" * 300)
    status, out, err = await run_cli(*agent_args(db))
    assert status == 1
    assert out == ""  # never announced itself
    assert "file is not a database" in err
