"""Logs of real processes: a task server that waits for its gateway says so a bounded number
of times, in JSON when asked; the gateway's access log, on when asked for."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import server_views
from tests.integration.harness import REPO_ROOT, Proc, _read_announcement, free_port

pytestmark = pytest.mark.integration


class _Logged:
    """Processes started with their stderr kept in files; stopped at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []

    def start(self, name: str, args: Sequence[str], config: str = "") -> tuple[Proc, Path]:
        argv = [sys.executable, "-m", "deploy.cli"]
        if config:
            path = self.tmp_path / f"{name}.toml"
            path.write_text(config)
            argv += ["--config", str(path)]
        err = self.tmp_path / f"{name}.stderr"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for var in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
            env.pop(var, None)
        with err.open("wb") as sink:
            popen = subprocess.Popen(
                [*argv, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=sink, env=env
            )
        proc = Proc(popen)
        self.procs.append(proc)
        proc.info = _read_announcement(popen, 20.0)
        return proc, err

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[_Logged]:
    procs = _Logged(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON-format log (a line that is not JSON fails the test)."""
    lines = []
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        assert {"ts", "level", "logger", "msg"} <= set(line), line
        datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
        lines.append(line)
    return lines


def _registration_lines(path: Path) -> list[dict[str, Any]]:
    return [line for line in _json_lines(path) if "registration at" in line["msg"]]


@pytest.mark.slow
async def test_a_task_server_started_before_its_gateway_logs_a_few_lines_then_registers(
    logged: _Logged,
) -> None:
    port = free_port()
    # It tries about every second (register_interval_s = 1 caps the backoff): before the
    # backoff and its log, that was a line per second.
    ts, err = logged.start(
        "ts",
        [
            "taskserver",
            "--id",
            "early-1",
            "--port",
            "0",
            "--gateway",
            f"http://127.0.0.1:{port}",
            "--log-level",
            "INFO",
            "--log-format",
            "json",
        ],
        config="[taskserver]\nregister_interval_s = 1.0\n",
    )
    await asyncio.sleep(10.0)  # the gateway is not there yet, for about ten seconds
    waiting = _registration_lines(err)
    assert 1 <= len(waiting) <= 2, [line["msg"] for line in waiting]
    first = waiting[0]
    assert first["msg"].startswith(
        f"server early-1: registration at http://127.0.0.1:{port}/v1/servers failed: "
        "gateway not reachable"
    ), first
    assert (first["level"], first["server_id"], first["pool"]) == ("INFO", "early-1", "default")

    gw, _ = logged.start(
        "gw", ["gateway", "--port", str(port), "--storage-url", "", "--log-level", "WARNING"]
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        deadline = time.monotonic() + 15.0
        views: dict[str, Any] = {}
        while time.monotonic() < deadline and "early-1" not in views:
            views = await server_views(http, gw.url)
            await asyncio.sleep(0.1)
    assert "early-1" in views, views
    assert views["early-1"]["address"] == ts.address
    await asyncio.sleep(2.5)  # two more registrations (heartbeats): nothing more to say
    after = _registration_lines(err)[len(waiting) :]
    assert [line["level"] for line in after] == ["INFO"], after
    assert " succeeded after " in after[0]["msg"], after


async def _requests(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/healthz", headers={"X-Request-Id": "req-42"}) as resp:
            assert resp.status == 200
            await resp.read()
        async with http.get(url + "/v1/no-such-thing?secret=1") as resp:
            assert resp.status == 404
            await resp.read()


async def test_the_gateway_access_log_is_one_line_per_request_when_asked_for(
    logged: _Logged,
) -> None:
    gw, err = logged.start(
        "gw-json",
        ["gateway", "--port", "0", "--storage-url", "", "--access-log", "--log-format", "json"],
    )
    await _requests(gw.url)
    gw.stop()
    access = [line for line in _json_lines(err) if line["logger"] == "gateway.access"]
    assert [(a["method"], a["path"], a["status"]) for a in access] == [
        ("GET", "/healthz", 200),
        ("GET", "/v1/no-such-thing", 404),
    ], access
    health, missing = access
    assert health["request_id"] == "req-42" and health["bytes"] > 0
    assert health["duration_ms"] >= 0 and health["level"] == "INFO"
    assert "secret" not in json.dumps(missing)  # the query string stays out of the log

    # In text, the same line as people read it; and none at all without --access-log.
    gw_text, err_text = logged.start(
        "gw-text", ["gateway", "--port", "0", "--storage-url", "", "--access-log"]
    )
    gw_quiet, err_quiet = logged.start("gw-quiet", ["gateway", "--port", "0", "--storage-url", ""])
    await _requests(gw_text.url)
    await _requests(gw_quiet.url)
    gw_text.stop()
    gw_quiet.stop()
    text = [line for line in err_text.read_text().splitlines() if "gateway.access" in line]
    assert len(text) == 2, text
    assert " INFO gateway.access: GET /healthz 200 " in text[0] and "request req-42" in text[0]
    assert "gateway.access" not in err_quiet.read_text()
