"""The history store on a real PostgreSQL server (a throwaway cluster on loopback)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register
from tests.integration.harness import free_port
from tests.integration.test_history import history, wait_for_samples

pytestmark = pytest.mark.integration
pytest.importorskip("psycopg", reason="the PostgreSQL driver comes with the postgres extra")


def _pg_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (Debian keeps them per major version)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return versions[-1].parent if versions else None


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for this test only; yields its SQLAlchemy URL."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server programs (apt install postgresql)")
    # Not under pytest's tmp_path: as root that is private to root, and the server runs as
    # the postgres user (initdb refuses root).
    home = Path(tempfile.mkdtemp(prefix="tailgate-pg-"))
    data = home / "data"
    data.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        for path in (home, data):
            shutil.chown(path, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = free_port()

    def run(*argv: str) -> None:
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{argv[0]} failed: {done.stderr or done.stdout}"

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "tailgate", "--auth=trust")
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {home}"
        log = str(home / "server.log")
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", log, "-o", options, "-w", "start")
        try:
            yield f"postgresql+psycopg://tailgate@127.0.0.1:{port}/postgres"
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def test_history_on_postgresql_survives_a_gateway_restart(
    cluster: Cluster, http: aiohttp.ClientSession, postgres: str
) -> None:
    toml = f'[gateway]\nstorage_url = "{postgres}"\nhistory_interval_s = 0.2\nreplica = "gw-0"\n'
    gw = cluster.gateway(toml)
    await register(http, gw, cluster.taskserver("ts-1"))
    body = {"class": "A", "targets": {"pool": "default", "fanout": 1}}
    statuses = await asyncio.gather(*(query(http, gw, body) for _ in range(20)))
    assert {s for s, _, _ in statuses} == {200}
    before = await wait_for_samples(
        http, gw, lambda ss: any(s["qps"].get("A", 0) > 0 for s in ss) and len(ss) >= 3
    )
    gw.stop()
    again = cluster.gateway(toml)
    after = await history(http, again)
    assert {s["t"] for s in before} <= {s["t"] for s in after}
    assert any(s["qps"].get("A", 0) > 0 for s in after)
    # A second replica on the same database reads back only its own samples.
    other = cluster.gateway(toml.replace('"gw-0"', '"gw-1"'))
    mine = await wait_for_samples(http, other, lambda ss: len(ss) >= 2)
    assert not {s["t"] for s in mine} & {s["t"] for s in before}
    assert all(s["qps"].get("A", 0) == 0 for s in mine)  # it answered no queries
