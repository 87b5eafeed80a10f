"""`tailgate up --autoscale`: misses drive a scale-up through the local actuator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import REPO_ROOT
from tests.integration.harness import child_pids, free_port

pytestmark = pytest.mark.integration

CONFIG = """
[admission]
policy = "none"   # here only the autoscaler reacts to the misses

[autoscaling]
window_tasks = 8
upper = 0.2
lower = 0.01
up_cooldown_s = 0.5
down_cooldown_s = 60
interval_s = 0.25
"""


async def test_up_autoscale_adds_a_server_when_tasks_miss_deadlines(tmp_path: Path) -> None:
    cfg = tmp_path / "tailgate.toml"
    cfg.write_text(CONFIG)
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "--log-level",
        "WARNING",
        "--config",
        str(cfg),
        "up",
        "--storage-url",
        "",
        "--edge-agents",
        "0",
        "--servers",
        "1",
        "--max-servers",
        "3",
        "--autoscale",
        "--slots",
        "1",
        "--port",
        str(port),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own group, so a failed test can kill every child
    )
    url = f"http://127.0.0.1:{port}"
    children: list[int] = []
    try:
        assert proc.stdout is not None
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 40)
            if not line or b"Ctrl-C" in line:
                break
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/autoscaler") as r:
                state = await r.json()
            assert state["enabled"] and state["replicas"]["now"] == 1
            slow = {
                "slo": {"percentile": 99, "latency_ms": 150},
                "targets": {"pool": "default", "fanout": 1},
                "task": {"service_ms": 60},
            }
            # Bursts of 60 ms tasks on one slot with ~140 ms budgets: most miss t_D.
            for _ in range(20):
                async with http.get(url + "/v1/autoscaler") as r:
                    state = await r.json()
                if state["actions"]:
                    break
                answers = await asyncio.gather(
                    *[http.post(url + "/v1/queries", json=slow) for _ in range(6)]
                )
                assert all(a.status == 200 for a in answers)
                for a in answers:
                    a.release()
                await asyncio.sleep(0.3)  # let the autoscaler tick
            assert state["actions"], state
            action = state["actions"][0]
            assert action["from"] == 1 and action["to"] == 2
            assert action["reason"] and action["miss_ratio"] > 0.2
            async with http.get(url + "/v1/servers") as r:
                servers = [s for s in (await r.json())["servers"] if s["pool"] == "default"]
            assert len(servers) >= 2 and all(s["state"] == "up" for s in servers)
            children = child_pids(proc.pid)
            assert len(children) >= 2
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
