"""The chaos soak on real processes: its relay, its client's failover and hang detection, and
a two-minute soak that must end with nothing hung, lost or corrupt."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from loadtests.soak import Soak
from loadtests.soak_plan import KINDS, PlannedQuery
from loadtests.soak_report import ALLOWED_5XX
from loadtests.tcp_relay import TcpRelay
from tests.integration.conftest import Cluster
from tests.integration.harness import REPO_ROOT, free_port

pytestmark = pytest.mark.integration

SOAK_MINUTES = 2
RSS_GROWTH_MAX_MIB = 32.0
"""The never-restarted replica's resident memory may grow this much over the two minutes
(CDF windows, history and caches filling); it grew 0.7 MiB in the runs that set it."""


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    """A TCP echo server on loopback; its address."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _open(relay: TcpRelay) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = relay.address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def test_the_relay_blackholes_a_link_and_heals_it(echo: str) -> None:
    relay = TcpRelay(echo)
    await relay.start()
    try:
        reader, writer = await _open(relay)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"

        relay.blackhole()
        writer.write(b"lost?")
        await writer.drain()  # the kernel takes the bytes: the sender cannot tell
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.5)
        assert not reader.at_eof()  # no close either: the peer just stalls
        late_reader, late_writer = await _open(relay)  # a connection made meanwhile is held
        late_writer.write(b"late")

        relay.heal()
        assert await asyncio.wait_for(reader.readexactly(5), 2) == b"lost?"
        assert await asyncio.wait_for(late_reader.readexactly(4), 2) == b"late"
        assert relay.partitions == 1 and relay.connections == 2

        relay.upstream = None  # its server is dead: a new connection is closed at once
        dead_reader, dead_writer = await _open(relay)
        assert await asyncio.wait_for(dead_reader.read(1), 2) == b""
        for w in (writer, late_writer, dead_writer):
            w.close()
    finally:
        await relay.close()


def _soak(tmp_path: Path, urls: list[str], http: aiohttp.ClientSession) -> Soak:
    args = argparse.Namespace(
        minutes=1.0, seed=1, rate=1.0, servers=1, agents=0, mean_gap_s=15.0, hang_margin_s=0.5
    )
    soak = Soak(args, tmp_path)
    soak.urls = urls
    soak.http = http
    soak.t0 = asyncio.get_running_loop().time()
    return soak


NO_SERVER = {"class": "A", "targets": {"pool": "default", "fanout": 1}, "task": {}}
"""Answered 400 at once by a gateway that knows no server: any answer will do here."""


async def test_the_client_fails_over_on_refusal_and_counts_a_silent_replica_as_hung(
    cluster: Cluster, tmp_path: Path
) -> None:
    gw = cluster.gateway()
    relay = TcpRelay(gw.url.removeprefix("http://"))
    await relay.start()
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        async with aiohttp.ClientSession() as http:
            soak = _soak(tmp_path, [dead, "http://" + relay.address], http)
            query = PlannedQuery(0.0, "default", NO_SERVER, replica=0, slo_s=0.1)
            rec = await soak.send(query)
            assert rec.failovers == ["refused"]
            # A fresh gateway with no server: "still registering", worth a retry.
            assert (rec.status, rec.code, rec.hung) == (503, "servers_registering", False)

            # The replica accepts the connection and never answers: hung after SLO + grace
            # + the margin (0.1 + 1 + 0.5 s), and not retried elsewhere.
            relay.blackhole()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            rec = await soak.send(PlannedQuery(0.0, "default", NO_SERVER, replica=1, slo_s=0.1))
            assert rec.hung and rec.status == 0 and rec.failovers == []
            assert rec.label == "hung"
            assert 1.5 <= loop.time() - t0 < 5.0
            relay.heal()
            rec = await soak.send(PlannedQuery(0.0, "default", NO_SERVER, replica=1, slo_s=0.1))
            assert (rec.status, rec.hung) == (503, False)
    finally:
        await relay.close()


@pytest.mark.slow
@pytest.mark.timeout(SOAK_MINUTES * 60 + 240)
def test_a_two_minute_chaos_soak_loses_nothing_and_leaves_no_query_hanging(
    tmp_path: Path,
) -> None:
    """Two minutes of open-loop load (20 queries/s) on two gateway replicas while every
    fault of the schedule hits: kill -9, stop and restart of task servers, edge agents and
    replica gw-b, and partitions of servers' links.

    What a user must see, and what this asserts:

    - every query is answered: none hung past SLO + grace + 10 s, none without an answer
      from either replica (gw-a is never faulted, so failing over always has a target);
    - a replica's kill, stop or drain is the client's failover, not the user's error: a
      refused or dropped connection, or a 503 ``draining``, is retried on the other
      replica (as a load balancer retries an idempotent read); what is counted is the
      answer after that retry. At least one such failover happened (gw-b was killed);
    - the 5xx that remain are only those the documented failure modes produce while a
      server is lost, stalled or draining (`loadtests.soak_report.ALLOWED_5XX`: the task
      of a lost server fails with 502, a stalled one times out with 504 at SLO + grace,
      too few live servers or a shedding admission control answer 503); never a 500, and
      none in a quiet stretch: every error belongs to a query sent during a fault or
      within 15 s of its recovery (in-flight queries, the 3 s heartbeat timeout and the
      10 s admission window);
    - at least half of the queries are answered 200, faults and all;
    - an edge agent killed with -9 (or restarted) keeps every reading it had committed,
      its store passes ``PRAGMA integrity_check`` as the dead process left it, and it
      stores new readings once it runs again; both agents' stores and the replicas'
      shared history store pass it at the end;
    - the replica that is never restarted grows by less than RSS_GROWTH_MAX_MIB.
    """
    out = tmp_path / "soak"
    proc = subprocess.run(
        [sys.executable, "-m", "loadtests.soak", "--minutes", str(SOAK_MINUTES), "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SOAK_MINUTES * 60 + 200,
        check=False,
    )
    print(proc.stdout)  # the report, for -rP
    report = json.loads((out / "report.json").read_text())
    summary = f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0 and report["ok"], summary
    q = report["queries"]
    assert q["sent"] > 1500, summary  # ~20/s for 120 s
    assert q["hung"] == 0 and q["no_answer"] == 0, summary
    assert q["answered"] == q["sent"], summary
    assert set(q["5xx"]) <= ALLOWED_5XX, summary
    assert q["errors_outside_faults"] == {}, summary
    assert q["2xx"] >= q["sent"] / 2, summary
    assert sum(q["failovers"].values()) >= 1, summary

    executed = {(e["tier"], e["kind"]) for e in report["events"]}
    assert executed == {(t, k) for t, kinds in KINDS.items() for k in kinds}, summary
    assert all(e["recovered_s"] is not None for e in report["events"]), summary

    checks = report["edge_checks"]
    assert any(c["kind"] == "kill" for c in checks), summary
    for c in checks:
        assert c["lost"] == 0 and c["integrity_check"] == "ok", c
        assert c["committed_after_restart"] > c["committed_before"] > 0, c
    for name, store in report["stores"].items():
        assert store["integrity_check"] == "ok", (name, store)
    assert set(report["stores"]["gateway-history.db"]["samples_per_replica"]) == {"gw-a", "gw-b"}

    stable = report["gateway_rss"]["gw-a"]
    assert stable["restarts"] == 0
    assert stable["end_mib"] - stable["start_mib"] < RSS_GROWTH_MAX_MIB, stable
    assert report["gateway_rss"]["gw-b"]["restarts"] >= 2  # its kill and its restart
