"""TLS on the HTTP API and the Thrift links, with a throwaway CA made here (openssl).

A gateway and its servers, all real processes on loopback: a query over https and TLS
links with mutual TLS; servers whose certificates come from another CA (or who show none)
kept out, at registration and on the link, each with a line that says why; renewed
certificates served to new connections without a restart; an edge agent over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtests.tls_ca import Issued, ThrowawayCa, openssl_missing
from taskserver.tls import ClientAuth, TlsConfig, link_server_tls
from tests.integration.conftest import Cluster
from tests.integration.harness import Proc, start_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(openssl_missing() is not None, reason=openssl_missing() or ""),
]

SLO = {"percentile": 99, "latency_ms": 2000}


@dataclass
class Pki:
    """The cluster's CA with a gateway's and a server's certificates, and a stranger's CA."""

    folder: Path
    ca: ThrowawayCa
    gateway: Issued
    server: Issued
    other_ca: ThrowawayCa
    stranger: Issued

    def client(self, who: Issued | None = None) -> ssl.SSLContext:
        """A client's context trusting the cluster's CA, showing `who`'s certificate."""
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        if who is not None:
            ctx.load_cert_chain(str(who.cert), str(who.key))
        return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = ThrowawayCa.create(folder / "cluster")
    other = ThrowawayCa.create(folder / "other", name="Some other CA")
    return Pki(
        folder,
        ca,
        ca.issue("gateway"),
        ca.issue("server"),
        other,
        other.issue("stranger"),
    )


def _gateway_toml(pki: Pki, **tls: Any) -> str:
    table = {
        "links": True,
        "http": True,
        "cert_file": str(pki.gateway.cert),
        "key_file": str(pki.gateway.key),
        "ca_file": str(pki.ca.cert),
        "http_client_auth": "optional",
        **tls,
    }
    lines = [f"{k} = {_toml(v)}" for k, v in table.items()]
    return "[gateway]\nheartbeat_s = 0.2\nheartbeat_timeout_s = 1.0\n\n[tls]\n" + "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else f'"{value}"'


def _server_args(who: Issued, ca: ThrowawayCa, client_auth: str = "required") -> list[str]:
    return ["--tls-cert", str(who.cert), "--tls-key", str(who.key), "--tls-ca", str(ca.cert),
            "--tls-links", "--tls-client-auth", client_auth]  # fmt: skip


def _taskserver(c: Cluster, sid: str, *args: str, gateway: Proc | None = None) -> Proc:
    argv = ["taskserver", "--id", sid, "--port", "0", "--service-kind", "constant",
            "--service-value-ms", "1", *args]  # fmt: skip
    if gateway is not None:
        argv += ["--gateway", gateway.url]
    p = start_cli(argv)
    c.procs.append(p)
    return p


@pytest.fixture
async def https(pki: Pki) -> AsyncIterator[aiohttp.TCPConnector]:
    """A connector that trusts the cluster's CA and shows the gateway's certificate (an
    operator holding one)."""
    connector = aiohttp.TCPConnector(ssl=pki.client(pki.gateway))
    try:
        yield connector
    finally:
        await connector.close()


async def _servers(http: aiohttp.ClientSession, gw: Proc) -> dict[str, dict[str, Any]]:
    async with http.get(gw.url + "/v1/servers") as r:
        assert r.status == 200, await r.text()
        return {s["id"]: s for s in (await r.json())["servers"]}


async def _wait_for(
    http: aiohttp.ClientSession, gw: Proc, sid: str, pred: Any, timeout_s: float = 10.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    view: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        view = (await _servers(http, gw)).get(sid)
        if view is not None and pred(view):
            return view
        await asyncio.sleep(0.1)
    raise AssertionError(f"server {sid}: never as expected; last seen {view}")


async def test_a_query_runs_over_https_and_mutual_tls_links(
    cluster: Cluster, pki: Pki, https: aiohttp.TCPConnector
) -> None:
    gw = cluster.gateway(_gateway_toml(pki))
    assert gw.url.startswith("https://127.0.0.1:")
    # The server registers over https with its certificate, and its Thrift port takes
    # only a gateway with one from the cluster's CA.
    _taskserver(cluster, "ts-1", *_server_args(pki.server, pki.ca), gateway=gw)
    async with aiohttp.ClientSession(connector=https) as http:
        await _wait_for(http, gw, "ts-1", lambda s: s["state"] == "up")
        body = {"class": "B", "targets": {"pool": "default", "fanout": 1}, "task": {"n": 7}}
        async with http.post(gw.url + "/v1/queries", json=body) as r:
            answer = await r.json()
            assert r.status == 200, answer
        assert [t["server"] for t in answer["tasks"]] == ["ts-1"]
        assert answer["tasks"][0]["status"] == "ok"
    # Plain HTTP gets nowhere on the TLS port.
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            await plain.get(gw.url.replace("https:", "http:") + "/healthz")


async def test_registration_needs_a_certificate_from_the_cluster_ca(
    cluster: Cluster,
    pki: Pki,
    https: aiohttp.TCPConnector,
    capfd: pytest.CaptureFixture[str],
) -> None:
    gw = cluster.gateway(_gateway_toml(pki))
    body = {"id": "x-1", "pool": "default", "address": "127.0.0.1:9", "slots": 1}
    # No certificate: the handshake passes (http_client_auth = optional), registration is 403
    # while a read route answers.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client())) as anon:
        async with anon.post(gw.url + "/v1/servers", json=body) as r:
            assert r.status == 403
            error = (await r.json())["error"]
        assert error["code"] == "client_certificate_required"
        assert "client certificate" in error["message"]
        async with anon.get(gw.url + "/healthz") as r:
            assert r.status == 200
    # A certificate of another CA: refused at the handshake.
    rogue = pki.client(pki.stranger)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=rogue)) as stranger:
        with pytest.raises(aiohttp.ClientError):
            async with stranger.post(gw.url + "/v1/servers", json=body) as r:
                await r.read()
    # Task servers: one with a stranger's certificate, one with none; both say why in their log.
    _taskserver(cluster, "rogue-1", *_server_args(pki.stranger, pki.ca), gateway=gw)
    _taskserver(cluster, "bare-1", "--tls-ca", str(pki.ca.cert), gateway=gw)
    # A trusted one registers beside them.
    _taskserver(cluster, "ts-1", *_server_args(pki.server, pki.ca), gateway=gw)
    async with aiohttp.ClientSession(connector=https) as http:
        await _wait_for(http, gw, "ts-1", lambda s: s["state"] == "up")
        await asyncio.sleep(1.0)  # a few registration tries of the others
        assert set(await _servers(http, gw)) == {"ts-1"}
    err = capfd.readouterr().err
    assert "server rogue-1: registration at https://" in err
    # TLS 1.3 refuses a client's certificate after the client's handshake is done: the
    # server sees the refusal's alert, or only the connection closing; either way it says so.
    assert "tls.cert_file must be issued by the CA in the peer's tls.ca_file" in err
    assert "server bare-1: registration at https://" in err
    assert "refused (403)" in err and "client certificate" in err


async def test_the_gateway_and_a_server_refuse_each_others_wrong_certificates_on_the_link(
    cluster: Cluster, pki: Pki, https: aiohttp.TCPConnector
) -> None:
    gw = cluster.gateway(_gateway_toml(pki))
    # Its Thrift port shows a certificate of another CA: the gateway does not dial on.
    stranger = _taskserver(cluster, "stranger-1", *_server_args(pki.stranger, pki.ca))
    # It takes only gateways with a certificate of another CA: this gateway's is refused.
    picky = _taskserver(cluster, "picky-1", *_server_args(pki.server, pki.other_ca))
    async with aiohttp.ClientSession(connector=https) as http:
        for ts in (stranger, picky):
            sid = ts.info["server_id"]
            reg = {"id": sid, "pool": "default", "address": ts.address, "slots": 1}
            async with http.post(gw.url + "/v1/servers", json=reg) as r:
                assert r.status == 201, await r.text()
        view = await _wait_for(http, gw, "stranger-1", lambda s: "TLS" in s["last_error"])
        assert view["state"] == "down"
        assert "certificate is refused" in view["last_error"]
        assert "unable to get local issuer certificate" in view["last_error"]
        # The refusal comes as an alert or as the connection closing (TLS 1.3): both say it.
        view = await _wait_for(
            http, gw, "picky-1", lambda s: "tls.cert_file must be issued by" in s["last_error"]
        )
        assert view["state"] == "down"
        assert "TLS" in view["last_error"]


async def _served_serial(port: int, ctx: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
    )
    try:
        cert = writer.get_extra_info("peercert")
        return int(cert["serialNumber"], 16)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_renewed_certificates_are_served_to_new_connections_without_a_restart(
    cluster: Cluster, pki: Pki, tmp_path: Path
) -> None:
    # Their own files, renewed in place below (the module's stay as they are).
    gw_cert = pki.ca.issue("gateway", out=tmp_path / "gw")
    ts_cert = pki.ca.issue("server", out=tmp_path / "ts")
    toml = _gateway_toml(
        pki, cert_file=str(gw_cert.cert), key_file=str(gw_cert.key), reload_check_s=0.1
    )
    gw = cluster.gateway(toml)
    ts_toml = tmp_path / "ts.toml"
    ts_toml.write_text("[tls]\nreload_check_s = 0.1\n" + "\n".join(
        f'{k} = "{v}"' for k, v in (("cert_file", ts_cert.cert), ("key_file", ts_cert.key),
                                    ("ca_file", pki.ca.cert), ("client_auth", "required"))
    ) + "\nlinks = true\n")  # fmt: skip
    p = start_cli(["--config", str(ts_toml), "taskserver", "--id", "ts-1", "--port", "0"])
    cluster.procs.append(p)
    gw_port = int(gw.url.rsplit(":", 1)[1])
    ts_port = int(p.address.rsplit(":", 1)[1])
    client = pki.client(pki.gateway)
    assert await _served_serial(gw_port, client) == gw_cert.serial
    assert await _served_serial(ts_port, client) == ts_cert.serial
    # An open connection keeps its session across the renewal.
    _, kept = await asyncio.open_connection(
        "127.0.0.1", ts_port, ssl=client, server_hostname="127.0.0.1"
    )
    try:
        gw_new = pki.ca.issue("gateway", out=tmp_path / "gw")
        ts_new = pki.ca.issue("server", out=tmp_path / "ts")
        assert (gw_new.serial, ts_new.serial) != (gw_cert.serial, ts_cert.serial)
        deadline = time.monotonic() + 10.0
        served = (0, 0)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.15)  # past reload_check_s
            served = (
                await _served_serial(gw_port, client),
                await _served_serial(ts_port, client),
            )
            if served == (gw_new.serial, ts_new.serial):
                break
        assert served == (gw_new.serial, ts_new.serial)
        assert int(kept.get_extra_info("peercert")["serialNumber"], 16) == ts_cert.serial
        assert not kept.is_closing()
    finally:
        kept.close()
        await kept.wait_closed()


async def test_a_renewed_ca_file_decides_which_clients_a_listener_takes(
    pki: Pki, tmp_path: Path
) -> None:
    # The cluster moves to a new CA: the listener's ca_file is replaced, the server's own
    # certificate stays. Clients holding the new CA's certificates get in from then on.
    anchor = tmp_path / "ca.pem"
    anchor.write_bytes(pki.ca.cert.read_bytes())
    config = TlsConfig(links=True, cert_file=str(pki.server.cert), key_file=str(pki.server.key),
                       ca_file=str(anchor), client_auth=ClientAuth.REQUIRED,
                       reload_check_s=0.01)  # fmt: skip
    tls = link_server_tls(config)
    assert tls is not None

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            writer.write(await reader.read(4))
            await writer.drain()
        writer.close()

    async def answered(who: Issued) -> bool:
        _, port = server.sockets[0].getsockname()[:2]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=pki.client(who), server_hostname="127.0.0.1"
        )
        try:
            writer.write(b"ping")
            return await asyncio.wait_for(reader.read(4), 5.0) == b"ping"
        except OSError:  # the refusal may come as the peer's alert
            return False
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls.listening())
    try:
        assert (await answered(pki.gateway), await answered(pki.stranger)) == (True, False)
        renewed = tmp_path / "ca.pem.new"
        renewed.write_bytes(pki.other_ca.cert.read_bytes())
        renewed.replace(anchor)
        await asyncio.sleep(0.05)  # past reload_check_s
        assert (await answered(pki.gateway), await answered(pki.stranger)) == (False, True)
        assert tls.reloads == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_an_edge_agent_registers_and_answers_over_tls(
    cluster: Cluster, pki: Pki, https: aiohttp.TCPConnector, tmp_path: Path
) -> None:
    gw = cluster.gateway(_gateway_toml(pki))
    argv = ["edge-agent", "run", "--id", "pi-1", "--cluster", "wet-lab", "--port", "0",
            "--db", str(tmp_path / "pi-1.db"), "--gateway", gw.url, "--register-interval-s",
            "0.3", *_server_args(pki.server, pki.ca)]  # fmt: skip
    cluster.procs.append(start_cli(argv))
    async with aiohttp.ClientSession(connector=https) as http:
        view = await _wait_for(http, gw, "pi-1", lambda s: s["state"] == "up")
        assert view["cluster"] == "wet-lab"
        body = {"slo": SLO, "targets": {"pool": "edge", "all": True},
                "task": {"op": "latest", "sensor": "temperature"}}  # fmt: skip
        async with http.post(gw.url + "/v1/queries", json=body) as r:
            answer = await r.json()
        # Answered by the agent over the TLS link (its store is new: a reading or none).
        assert r.status in (200, 400), answer
        if r.status == 400:
            assert answer["error"]["code"] == "invalid_task", answer
        else:
            assert answer["tasks"][0]["server"] == "pi-1"
