"""An edge agent's /metrics and /healthz: served without aiohttp, as a Pi would run it."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest

from loadtests.bench_edge import rss_kib
from tests.integration.harness import free_port
from tests.integration.test_edge_agent import RSS_LIMIT_KIB, SITECUSTOMIZE, sensing, start_agent

pytestmark = pytest.mark.integration

# With a metrics port the agent may load prometheus_client, and nothing heavier.
BLOCKED = ("numpy", "torch", "onnxruntime", "aiohttp")


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of one GET."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


async def test_agent_serves_metrics_and_healthz_without_aiohttp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("{BLOCKED!r}", repr(BLOCKED)))
    log = tmp_path / "imports.log"
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("EDGE_IMPORT_LOG", str(log))
    port = free_port()
    agent = start_agent(
        tmp_path / "edge.db", "--sample-interval-s", "0.05", "--metrics-port", str(port)
    )
    try:
        # The announcement names the metrics address, as a task server's does.
        assert agent.info["metrics"] == f"127.0.0.1:{port}"
        status_task = await sensing(agent.address, {"op": "status"})
        assert status_task["agent"] == "pi-1"
        base = f"http://127.0.0.1:{port}"
        async with asyncio.timeout(10):  # the sampler's first reading may still be due
            while True:
                status, ctype, text = await asyncio.to_thread(get, base + "/metrics")
                assert status == 200 and ctype.startswith("text/plain")
                if "tailgate_edge_agent_samples_total{" in text and not re.search(
                    r"^tailgate_edge_agent_samples_total\{[^}]*\} 0\.0$", text, re.M
                ):
                    break
                await asyncio.sleep(0.05)
        assert 'tailgate_taskserver_tasks_total{server="pi-1",status="ok"} 1.0' in text
        assert 'tailgate_edge_agent_info{cluster="lab",reader="simulated",server="pi-1"}' in text
        samples = [ln for ln in text.splitlines() if ln.startswith("tailgate_edge_agent_samples")]
        assert samples and float(samples[0].split()[-1]) >= 1
        status, ctype, body = await asyncio.to_thread(get, base + "/healthz")
        assert status == 200 and ctype == "application/json"
        assert json.loads(body) == {
            "status": "ok",
            "server_id": "pi-1",
            "queued": 0,
            "busy": 0,
            "slots": 1,
        }
        rss = rss_kib(agent.popen.pid)
    finally:
        agent.stop()
    assert agent.popen.returncode == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "armed", "sitecustomize was not loaded"
    assert [line for line in lines if line.startswith("blocked")] == []
    assert rss < RSS_LIMIT_KIB, f"agent RSS {rss / 1024:.1f} MiB while serving /metrics"
