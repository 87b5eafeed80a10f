"""Several emulated task servers in one process (`tailgate taskserver --count N`)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, server_views, wait_until
from tests.integration.harness import start_cli

pytestmark = pytest.mark.integration

TOKEN = "tok-for-dense-servers"


async def test_one_process_hosts_four_servers_that_register_serve_and_leave(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    env = {"TAILGATE_AGENT_TOKEN": TOKEN}
    gw = start_cli(["gateway", "--port", "0"], env=env)
    cluster.procs.append(gw)
    dense = start_cli(
        ["taskserver", "--id", "dense", "--count", "4", "--port", "0", "--gateway", gw.url,
         "--pool", "default", "--seed", "7"],
        env=env,
    )  # fmt: skip
    cluster.procs.append(dense)
    ids = [f"dense-{i}" for i in range(1, 5)]
    for sid in ids:
        await wait_until(lambda s: s["state"] == "up", http, gw, sid)
    servers = await server_views(http, gw.url)
    assert len({servers[s]["address"] for s in ids}) == 4  # a listener each
    status, body, _ = await query(
        http, gw, {"class": "B", "targets": {"pool": "default", "all": True}}
    )
    assert status == 200, body
    assert sorted(t["server"] for t in body["tasks"]) == ids
    # SIGTERM drains every server and each deregisters; the process exits 0.
    dense.popen.send_signal(15)
    assert await asyncio.to_thread(dense.popen.wait, 10) == 0
    for _ in range(100):
        if not set(ids) & set(await server_views(http, gw.url)):
            break
        await asyncio.sleep(0.05)
    assert not set(ids) & set(await server_views(http, gw.url))


def test_count_is_checked_and_not_mixed_with_one_address(cluster: Cluster) -> None:
    import subprocess
    import sys

    for args, message in (
        (["--count", "0"], "--count: must be an integer >= 1, got 0"),
        (["--count", "2", "--advertise", "h:1"], "--count: --advertise names one address"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "deploy.cli", "taskserver", "--id", "d", *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert p.returncode == 2 and message in p.stderr, p.stderr
