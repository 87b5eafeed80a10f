"""Slow and greedy HTTP clients against a real gateway: a bounded slowloris, the connection
limit with its reserve for the probes, and queries in flight per client."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import serve
from gateway.config import GatewayConfig
from gateway.service import GatewayService
from tests.integration.conftest import Cluster, register

pytestmark = pytest.mark.integration

SLOW_SLO = {"percentile": 99, "latency_ms": 20_000}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def raw_request(port: int, head: str, timeout_s: float = 5.0) -> tuple[int, dict[str, Any]]:
    """Send a request on a connection of its own; (status, JSON body) once it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body) if body else {}


def get(path: str) -> str:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


async def slow_client(port: int, line_every_s: float, *, send: bool) -> tuple[float, bytes]:
    """A connection that sends a request's head one header line every `line_every_s` and
    never ends it (`send`), or sends nothing; (seconds until the gateway closed it, what
    the gateway wrote)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = loop.time()
    got = b""
    try:
        if send:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(4096), line_every_s)
            except TimeoutError:
                if send:
                    writer.write(b"X-Slow: still here\r\n")
                continue
            if not chunk:
                break
            got += chunk
    except ConnectionError:
        pass
    finally:
        writer.close()
    return loop.time() - opened, got


async def test_slowloris_is_closed_within_the_header_limit_while_the_gateway_answers(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    header_s = 3.0
    gw = cluster.gateway(f"[gateway]\nheader_timeout_s = {header_s}\n")
    await register(http, gw, cluster.taskserver("ts-1"))
    port = _port(gw.url)
    slow = [asyncio.create_task(slow_client(port, 2.0, send=True)) for _ in range(200)]
    idle = [asyncio.create_task(slow_client(port, 2.0, send=False)) for _ in range(100)]
    answers: list[tuple[str, int, float]] = []
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        body = {"slo": SLOW_SLO, "targets": {"pool": "default", "fanout": 1}}
        while not all(t.done() for t in slow + idle):
            for name, call in (
                ("healthz", http.get(gw.url + "/healthz")),
                ("query", http.post(gw.url + "/v1/queries", json=body)),
            ):
                t0 = loop.time()
                async with call as resp:
                    await resp.read()
                    answers.append((name, resp.status, loop.time() - t0))
            await asyncio.sleep(0.25)

    prober = asyncio.create_task(probe())
    done = await asyncio.wait_for(asyncio.gather(*slow, *idle), header_s + 10)
    await asyncio.wait_for(prober, 10)
    for seconds, got in done[: len(slow)]:
        assert header_s - 0.5 <= seconds <= header_s + 1.5, seconds
        assert got.startswith(b"HTTP/1.1 408 "), got[:80]
        assert b'"code":"request_timeout"' in got
    for seconds, got in done[len(slow) :]:
        assert header_s - 0.5 <= seconds <= header_s + 1.5, seconds
        assert got == b""
    assert {name for name, _, _ in answers} == {"healthz", "query"}
    assert [a for a in answers if a[1] != 200] == []
    assert max(seconds for _, _, seconds in answers) < 1.0, answers
    async with http.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert 'tailgate_http_connections_closed_total{reason="header_timeout"} 200.0' in text
    assert 'tailgate_http_connections_closed_total{reason="idle_timeout"} 100.0' in text


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_the_connection_limit_keeps_a_reserve_for_the_probes(cluster: Cluster) -> None:
    most, limit_s = 50, 4.0
    gw = cluster.gateway(
        f"[gateway]\nmax_connections = {most}\nheader_timeout_s = {limit_s}\n"
        f"body_timeout_s = {limit_s}\n"
    )
    port = _port(gw.url)
    # Every connection busy: a query's head, and a body that never comes.
    busy = []
    for _ in range(most):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/queries HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        busy.append((reader, writer))
    await asyncio.sleep(0.3)
    # The probes still answer, on connections of the reserve; anything else is refused.
    status, body = await raw_request(port, get("/healthz"))
    assert (status, body["status"]) == (200, "ok")
    status, body = await raw_request(
        port,
        "POST /v1/queries HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
        "Connection: close\r\n\r\n{}",
    )
    assert status == 503 and body["error"]["code"] == "connection_limit"
    # Past the reserve too: closed at once.
    await asyncio.sleep(0.2)  # the two answered above have left the reserve
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 1.0) == b""
    writer.close()
    # The bodies' deadline: every busy connection gets its 408, and is closed.
    for reader, writer in busy:
        answer = await asyncio.wait_for(reader.read(), limit_s + 3)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        writer.close()
    for reader, writer in held:
        assert await asyncio.wait_for(reader.read(), limit_s + 3) == b""
        writer.close()
    # Idle connections over the limit: the longest idle are closed for the new ones.
    await asyncio.sleep(0.2)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(most + 10)]
    status, body = await raw_request(port, get("/healthz"))
    assert status == 200

    async def closed_soon(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(), 0.3) == b""
        except TimeoutError:
            return False

    closed = await asyncio.gather(*(closed_soon(reader) for reader, _ in idle))
    for _, writer in idle:
        writer.close()
    # The eleven opened first (ten for the later idle ones, one for /healthz), and no other.
    assert closed == [True] * 11 + [False] * (most - 1), closed
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    closed_by = "tailgate_http_connections_closed_total"
    assert _metric(text, f'{closed_by}{{reason="body_timeout"}}') == most
    assert _metric(text, f'{closed_by}{{reason="refused"}}') == 1
    assert _metric(text, f'{closed_by}{{reason="evicted"}}') >= 11


async def test_the_metrics_of_the_connection_limit(cluster: Cluster) -> None:
    """What the limit did is counted: evicted, refused and the open connections."""
    gw = cluster.gateway("[gateway]\nmax_connections = 20\nheader_timeout_s = 3.0\n")
    port = _port(gw.url)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
    await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert _metric(text, 'tailgate_http_connections_closed_total{reason="evicted"}') >= 10
    assert _metric(text, "tailgate_http_connections") <= 20
    for _, writer in idle:
        writer.close()


async def test_queries_in_flight_are_limited_per_client(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway("[gateway]\nmax_in_flight_per_client = 4\n")
    ts = cluster.taskserver(
        "ts-slow", "--service-kind", "constant", "--service-value-ms", "1500", "--slots", "16"
    )
    await register(http, gw, ts, slots=16)
    body = {"slo": SLOW_SLO, "targets": {"pool": "default", "fanout": 1}}

    async def one(session: aiohttp.ClientSession) -> tuple[int, dict[str, Any], str | None]:
        async with session.post(gw.url + "/v1/queries", json=body) as resp:
            return resp.status, await resp.json(), resp.headers.get("Retry-After")

    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=other) as from_elsewhere:
        first = [asyncio.create_task(one(http)) for _ in range(6)]
        await asyncio.sleep(0.5)  # the six are in: four run, two were refused
        elsewhere = await one(from_elsewhere)  # another client is not held back
        answers = await asyncio.gather(*first)
    assert elsewhere[0] == 200, elsewhere
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, 200, 200, 429, 429], answers
    for status, answer, retry_after in answers:
        if status == 429:
            assert answer["error"]["code"] == "client_in_flight_limited"
            assert answer["limit"] == {"name": "max_in_flight_per_client", "value": 4}
            assert "127.0.0.1" in answer["error"]["message"]
            assert retry_after == "1"
    status, _, _ = await one(http)  # answered ones no longer count
    assert status == 200


async def test_a_keep_alive_connection_may_idle_past_the_header_limit(cluster: Cluster) -> None:
    """The header deadline runs from a request's first byte: between requests, only the
    idle keep-alive limit applies."""
    gw = cluster.gateway("[gateway]\nheader_timeout_s = 1.0\nkeepalive_timeout_s = 10.0\n")
    opened = 0

    async def on_open(*_: Any) -> None:
        nonlocal opened
        opened += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_open)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session:
        for pause_s in (1.5, 1.5, 0.0):
            async with session.get(gw.url + "/healthz") as resp:
                assert resp.status == 200
            await asyncio.sleep(pause_s)
    assert opened == 1  # the same connection all along


# gateway.request_ids keys requests by strings, which aiohttp 3.14 warns of (as test_auth).
@pytest.mark.filterwarnings("ignore:It is recommended to use web.RequestKey")
async def test_a_client_that_leaves_mid_body_is_no_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: a client that closed its connection before its body was all sent made
    the gateway log an internal error with a traceback, once per connection."""
    service = GatewayService(GatewayConfig(port=0, storage_url=""), registry=CollectorRegistry())
    announced: list[str] = []
    stop = asyncio.Event()
    gateway = asyncio.create_task(serve(service, announced.append, stop=stop))
    try:
        for _ in range(200):
            if announced:
                break
            await asyncio.sleep(0.02)
        port = _port(json.loads(announced[0])["url"])
        for _ in range(20):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/queries HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.close()
        status, _ = await raw_request(port, get("/healthz"))
        assert status == 200
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(gateway, 30)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
