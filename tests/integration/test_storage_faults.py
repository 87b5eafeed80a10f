"""Storage faults with real files: a full disk (a small tmpfs the test mounts) under an edge
agent's store and under the gateway's history, and empty or corrupt stores at start."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from edge_agent.store import SensorStore
from gateway.app import serve
from gateway.config import GatewayConfig
from gateway.service import GatewayService
from loadtests.bench_edge import TaskClient
from tests.integration.conftest import Cluster, register
from tests.integration.test_edge_agent import agent_args, run_cli, start_agent

pytestmark = pytest.mark.integration

T0 = 1_767_225_600


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `where` for the test; skips when mounting is not permitted."""
    where.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        for flags in ([], ["-l"]):  # lazily if a file is still open in it
            if subprocess.run(["umount", *flags, str(where)], timeout=10).returncode == 0:
                break


@pytest.fixture
def small_disk(tmp_path: Path) -> Callable[[str], contextlib.AbstractContextManager[Path]]:
    """`small_disk("2m")`: a tmpfs of that size under the test's directory."""
    count = iter(range(100))
    return lambda size: mounted_tmpfs(tmp_path / f"disk-{next(count)}", size)


def fill(disk: Path) -> Path:
    """Take every free byte of the disk with a ballast file; returns it."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return ballast


def check_store(db: Path) -> int:
    """integrity_check of a closed store (must be ok); its readings."""
    con = sqlite3.connect(db, timeout=5)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return int(con.execute("SELECT count(*) FROM readings").fetchone()[0])
    finally:
        con.close()


async def status_of(client: TaskClient) -> dict[str, Any]:
    result = await client.run({"op": "status"})
    assert result.status == 0, result.error
    return json.loads(result.result)


async def wait_status(
    client: TaskClient, pred: Callable[[dict[str, Any]], bool], timeout_s: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = await status_of(client)
        if pred(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"the agent never got there; last status {status}")
        await asyncio.sleep(0.05)


async def until(pred: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Wait until pred() holds (AssertionError past timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout_s} s")
        await asyncio.sleep(0.02)


async def test_an_agent_on_a_full_disk_keeps_every_row_serves_reads_and_resumes(
    small_disk: Callable[[str], contextlib.AbstractContextManager[Path]],
) -> None:
    with small_disk("16m") as disk:
        db = disk / "edge.db"
        agent = start_agent(db, "--sample-interval-s", "0.05")
        reader: sqlite3.Connection | None = None
        try:
            async with TaskClient(agent.address) as client:
                await wait_status(client, lambda s: s["rows"] >= 6)  # 2 readings a second
                # A reader's snapshot (a backup, say) keeps the log from starting over, so
                # every commit needs new space, as a store that grows does.
                reader = sqlite3.connect(db, timeout=5, isolation_level=None)
                reader.execute("BEGIN")
                reader.execute("SELECT count(*) FROM readings").fetchone()
                ballast = fill(disk)
                full = await wait_status(client, lambda s: s["store_full"])
                assert "the disk is full" in full["last_fault"]
                assert "every committed reading is kept" in full["last_fault"]
                # Full: nothing more is stored, everything stored is served.
                await asyncio.sleep(0.5)  # ten more samples refused
                still = await status_of(client)
                assert still["store_full"] and still["rows"] == full["rows"]
                assert still["dropped_full"] > full["dropped_full"]
                latest = await client.run({"op": "latest", "sensor": "temperature"})
                assert latest.status == 0 and json.loads(latest.result)["ts"] is not None
                now = int(time.time())
                window = {"op": "range", "sensor": "temperature", "start": now - 600,
                          "end": now + 600}  # fmt: skip
                ranged = await client.run(window)
                assert ranged.status == 0, ranged.error
                assert json.loads(ranged.result)["count"] >= full["rows"] // 2
                # A backfill on the full disk: a clear line, status 1, nothing half-done.
                status, out, err = await run_cli(
                    "edge-agent", "seed", "--db", str(db), "--months", "1", "--interval", "1m"
                )
                assert (status, out) == (1, "")
                lines = err.strip().splitlines()
                assert len(lines) == 1 and "bulk insert refused, the disk is full" in lines[0]
                assert (await status_of(client))["rows"] == full["rows"]
                # Space comes back: so do the writes.
                ballast.unlink()
                back = await wait_status(
                    client, lambda s: not s["store_full"] and s["rows"] >= full["rows"] + 4
                )
                assert back["dropped_full"] >= still["dropped_full"]
        finally:
            if reader is not None:
                reader.close()
            agent.stop()
        assert agent.popen.returncode == 0
        assert check_store(db) >= back["rows"]  # every committed row, the log checkpointed


async def test_the_log_gives_its_space_back_when_the_disk_fills(
    small_disk: Callable[[str], contextlib.AbstractContextManager[Path]],
) -> None:
    """Regression: one reading per transaction grew the write-ahead log until a 512 KiB
    disk was full after ~110 readings, though the database had room for them."""
    with small_disk("512k") as disk:
        store = SensorStore(str(disk / "edge.db"))
        try:
            store.insert_many([("temperature", T0 + i, 1.0) for i in range(10_000)])
            assert store.prune(T0 + 10_000) == 10_000  # free pages in the database
            with store.engine.connect() as conn:  # as the automatic checkpoints leave it
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            for i in range(3000):
                store.insert("temperature", T0 + 20_000 + i, float(i))
            assert store.count() == 3000
            store.check()
        finally:
            store.close()
        assert check_store(disk / "edge.db") == 3000


async def test_an_empty_or_corrupt_store_stops_the_agent_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    status, out, err = await run_cli(*agent_args(empty))
    assert (status, out) == (1, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "empty (0 bytes)" in lines[0] and "--init-store" in lines[0]
    assert empty.stat().st_size == 0
    corrupt = tmp_path / "corrupt.db"
    store = SensorStore(str(corrupt))
    store.insert_many([("temperature", T0 + i, float(i)) for i in range(20_000)])
    store.close()
    data = bytearray(corrupt.read_bytes())
    for offset in range(4 * 4096, len(data) - 4096, 5 * 4096):
        data[offset + 8 : offset + 400] = b"\xff" * 392
    corrupt.write_bytes(bytes(data))
    status, out, err = await run_cli(*agent_args(corrupt))
    assert (status, out) == (1, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "integrity check failed" in lines[0]
    assert "to recover: stop the agent" in lines[0]
    assert corrupt.read_bytes() == bytes(data)  # left as it was, for the salvage
    # The recovery the line names, as an operator follows it.
    moved = tmp_path / "corrupt.db.corrupt"
    assert f"mv {corrupt} {moved};" in lines[0]
    corrupt.rename(moved)
    salvage = lines[0].split("`")[1].split()
    assert salvage[:3] == ["tailgate", "edge-agent", "salvage"]
    status, out, err = await run_cli(*salvage[1:])
    assert status == 0, err
    assert out.startswith("salvaged ") and "unreadable stretches skipped" in out
    recovered = start_agent(corrupt, "--sample-interval-s", "3600")
    try:
        async with TaskClient(recovered.address) as client:
            rows = (await status_of(client))["rows"]
            assert 15_000 < rows < 20_000  # the readable readings, not the smashed pages
    finally:
        recovered.stop()
    # Asked to initialise, the empty file becomes a store; the agent serves from it.
    agent = start_agent(empty, "--init-store", "--sample-interval-s", "3600")
    try:
        async with TaskClient(agent.address) as client:
            await wait_status(client, lambda s: s["rows"] >= 1)
    finally:
        agent.stop()
    assert check_store(empty) >= 1


# gateway.request_ids keys requests by strings, which aiohttp 3.14 warns of (as test_auth).
@pytest.mark.filterwarnings("ignore:It is recommended to use web.RequestKey")
async def test_the_gateway_on_a_full_disk_logs_once_answers_and_resumes_its_history(
    small_disk: Callable[[str], contextlib.AbstractContextManager[Path]],
    cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.history")
    with small_disk("4m") as disk:
        config = GatewayConfig(
            port=0, storage_url=f"sqlite:///{disk / 'history.db'}", history_interval_s=0.05
        )
        service = GatewayService(config, registry=CollectorRegistry())
        urls: list[str] = []
        stop = asyncio.Event()
        gateway = asyncio.create_task(serve(service, urls.append, stop=stop))
        try:
            await until(lambda: bool(urls))
            url = json.loads(urls[0])["url"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                gw: Any = SimpleNamespace(url=url)  # what register() reads of a gateway
                await register(http, gw, cluster.taskserver("ts-1"))
                recorder = service.history
                await until(lambda: recorder.samples_written >= 5)
                ballast = fill(disk)
                await until(lambda: recorder.failed_writes >= 10)
                body = {"class": "C", "targets": {"pool": "default", "fanout": 1}}
                for _ in range(5):
                    async with http.post(url + "/v1/queries", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                async with http.get(url + "/healthz") as resp:
                    assert resp.status == 200
                async with http.get(url + "/v1/history?since_s=600") as resp:
                    assert resp.status == 200
                    before = len((await resp.json())["samples"])
                assert before >= 5
                failed = [r for r in caplog.records if "write failed" in r.getMessage()]
                assert len(failed) == 1, [r.getMessage() for r in failed]
                assert "database or disk is full" in failed[0].getMessage()
                ballast.unlink()
                written = recorder.samples_written
                await until(lambda: recorder.samples_written >= written + 5)
                async with http.get(url + "/v1/history?since_s=600") as resp:
                    assert len((await resp.json())["samples"]) >= before + 5
            again = [r for r in caplog.records if "writing again" in r.getMessage()]
            assert len(again) == 1
        finally:
            stop.set()
            await asyncio.wait_for(gateway, 30)
        con = sqlite3.connect(disk / "history.db")
        try:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            con.close()
