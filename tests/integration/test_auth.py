"""Access control on loopback: every route of the real router, token rotation without a
restart, tenants' API keys with limits, and a refused-registration flood's log."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.auth import Access, access_of
from gateway.config import AuthConfig, GatewayConfig, TenantAccess
from gateway.service import GatewayService
from tests.integration.conftest import Cluster, wait_until
from tests.integration.harness import REPO_ROOT, Proc

pytestmark = pytest.mark.integration

ADMIN, ADMIN_NEXT, READ, REG = "adm-0123456789", "adm-next-98765", "rd-0123456789", "reg-0123456"
KEY, SLOW_KEY = "acme-key-0123456789", "slow-key-0123456789"
SECRETS = (ADMIN, ADMIN_NEXT, READ, REG, KEY, SLOW_KEY)


def _auth_header(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- every route of the app's router -------------------------------------------------------


def _app(read_routes: str) -> web.Application:
    config = GatewayConfig(
        storage_url="",
        token=REG,
        auth=AuthConfig(
            admin_tokens=(ADMIN,),
            read_tokens=(READ,),
            read_routes=read_routes,
            tenants={"acme": TenantAccess(api_keys=(KEY,))},
            slowdown_after=10_000,  # this test fails on purpose, many times, from one address
        ),
    )
    app = create_app(GatewayService(config))

    async def set_threshold(request: web.Request) -> web.Response:
        return web.json_response({"changed": True})

    # A write route added by a later change, without a word about access: closed.
    app.router.add_post("/v1/admission/threshold", set_threshold)
    return app


def _concrete(path: str) -> str:
    """A route's path with its parameters filled in."""
    return path.replace("{id}", "no-such-server").replace("{file}", "dashboard.js")


@pytest.fixture(params=["open", "token"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[tuple[TestClient, str]]:
    async with TestClient(TestServer(_app(request.param), host="127.0.0.1")) as c:
        yield c, request.param


# gateway.request_ids keeps the request id under a plain string key, which aiohttp 3.14
# warns about; the warning is only raised in-process, as here.
@pytest.mark.filterwarnings("ignore:It is recommended to use web.RequestKey")
async def test_every_write_route_of_the_router_refuses_a_request_without_a_credential(
    client: tuple[TestClient, str],
) -> None:
    c, read_routes = client
    routes = sorted(
        (r.method, r.resource.canonical)
        for r in c.app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    )
    writes = [(m, p) for m, p in routes if m != "GET"]
    known = {("POST", "/v1/servers"), ("DELETE", "/v1/servers/{id}"), ("POST", "/v1/queries")}
    known |= {("POST", "/v1/requests"), ("POST", "/v1/admission/threshold")}
    assert known <= set(writes)
    for method, path in routes:
        url = _concrete(path)
        async with c.request(method, url, json={"nonsense": True}) as r:
            status = r.status
            body = await r.json() if status == 401 else {}
        access = access_of(method, path)
        if method != "GET" or (access is Access.READ and read_routes == "token"):
            assert status == 401, (method, path, status)
            assert body["error"]["field"] == "Authorization"
            assert r.headers["WWW-Authenticate"].startswith("Bearer ")
        else:
            assert status != 401, (method, path, status)
        # A tenant's key is valid, but not for anything that writes (or reads, when closed).
        if access not in (Access.PUBLIC, Access.QUERY) and status == 401:
            async with c.request(method, url, headers=_auth_header(KEY)) as r:
                assert r.status == 403, (method, path, r.status)
                assert (await r.json())["error"]["code"] == "forbidden"
    async with c.post("/v1/admission/threshold", headers=_auth_header(REG)) as r:
        assert r.status == 403  # the registration token registers; it changes nothing else
    async with c.post("/v1/admission/threshold", headers=_auth_header(ADMIN)) as r:
        assert r.status == 200
    async with c.get("/v1/servers", headers=_auth_header(READ)) as r:
        assert r.status == 200
    async with c.delete("/v1/servers/x", headers=_auth_header(READ)) as r:
        assert r.status == 403


# -- real gateway processes ----------------------------------------------------------------


def _gateway(cluster: Cluster, toml: str, env: dict[str, str] | None = None, *args: str) -> Proc:
    from tests.integration.harness import start_cli

    config = cluster.tmp_path / "tailgate.toml"
    config.write_text(toml)
    p = start_cli(["gateway", "--port", "0", *args], config=config, env=env)
    cluster.procs.append(p)
    return p


def _write_atomically(path: Path, text: str) -> None:
    """As an operator should: a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _status(http: aiohttp.ClientSession, gw: Proc, token: str) -> int:
    """DELETE of an unknown server: 404 when the token may deregister, else 401."""
    async with http.delete(gw.url + "/v1/servers/nobody", headers=_auth_header(token)) as r:
        return r.status


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


async def test_admin_tokens_rotate_without_a_restart(
    cluster: Cluster, http: aiohttp.ClientSession, capfd: pytest.CaptureFixture[str]
) -> None:
    tokens = cluster.tmp_path / "admin.tokens"
    tokens.write_text(f"{ADMIN}\n")
    gw = _gateway(
        cluster,
        '[auth]\nadmin_tokens_file = "admin.tokens"\nreload_interval_s = 0.1\n'
        "slowdown_after = 1000\n",
    )
    pid = gw.popen.pid
    assert await _status(http, gw, ADMIN) == 404
    assert await _status(http, gw, ADMIN_NEXT) == 401
    # Rotation: both valid at once, clients move over, then the old one goes.
    _write_atomically(tokens, f"{ADMIN}\n{ADMIN_NEXT}\n")

    async def next_valid() -> bool:
        return await _status(http, gw, ADMIN_NEXT) == 404

    await _eventually(next_valid)
    assert await _status(http, gw, ADMIN) == 404
    _write_atomically(tokens, f"# rotated\n{ADMIN_NEXT}\n")

    async def old_refused() -> bool:
        return await _status(http, gw, ADMIN) == 401

    await _eventually(old_refused)
    assert await _status(http, gw, ADMIN_NEXT) == 404
    # A file that cannot be used (empty, half-written) keeps the tokens it held.
    tokens.write_text("")
    await asyncio.sleep(0.4)
    assert await _status(http, gw, ADMIN_NEXT) == 404
    assert gw.popen.pid == pid and gw.popen.poll() is None  # the same process throughout
    err = capfd.readouterr().err
    assert "admin_tokens_file" in err and "holds no token" in err and "keeping the 1" in err
    _assert_no_secret(err)


async def test_sighup_rereads_the_token_files_at_once(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    tokens = cluster.tmp_path / "admin.tokens"
    tokens.write_text(f"{ADMIN}\n")
    gw = _gateway(cluster, '[auth]\nadmin_tokens_file = "admin.tokens"\nreload_interval_s = 3600\n')
    _write_atomically(tokens, f"{ADMIN_NEXT}\n")
    assert await _status(http, gw, ADMIN_NEXT) == 401  # not re-read yet: once an hour
    gw.popen.send_signal(signal.SIGHUP)

    async def rotated() -> bool:
        return await _status(http, gw, ADMIN_NEXT) == 404

    await _eventually(rotated, timeout_s=5.0)
    assert await _status(http, gw, ADMIN) == 401


TENANTS_TOML = """
[auth]
admin_tokens_file = "admin.tokens"

[tenants.acme]
api_keys_file = "acme.keys"
rate_per_s = 0.2
burst = 3

[tenants.slow]
api_keys_file = "slow.keys"
max_in_flight = 1
"""


async def _query(
    http: aiohttp.ClientSession, gw: Proc, token: str | None, **extra: Any
) -> tuple[int, dict[str, Any], Any]:
    body = {"class": "C", "targets": {"servers": ["ts-1"]}, **extra}
    headers = _auth_header(token) if token else {}
    async with http.post(gw.url + "/v1/queries", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers


async def test_queries_take_a_tenants_api_key_within_its_limits(
    cluster: Cluster, http: aiohttp.ClientSession, capfd: pytest.CaptureFixture[str]
) -> None:
    for name, token in (("admin.tokens", ADMIN), ("acme.keys", KEY), ("slow.keys", SLOW_KEY)):
        (cluster.tmp_path / name).write_text(f"{token}\n")
    gw = _gateway(cluster, TENANTS_TOML)
    ts = cluster.taskserver("ts-1", "--service-kind", "constant", "--service-value-ms", "400")
    body = {"id": "ts-1", "address": ts.address, "pool": "default"}
    async with http.post(gw.url + "/v1/servers", json=body, headers=_auth_header(ADMIN)) as r:
        assert r.status == 201, await r.text()  # an admin token may register too
    await wait_until(lambda s: s["state"] == "up", http, gw, "ts-1")

    status, ans, headers = await _query(http, gw, None)
    assert status == 401 and ans["error"]["field"] == "Authorization"
    assert "API key" in ans["error"]["message"]
    # Its burst of 3: two queries run as acme, one naming another tenant is refused.
    for _ in range(2):
        status, ans, _ = await _query(http, gw, KEY)
        assert status == 200, ans
    status, ans, _ = await _query(http, gw, KEY, tenant="globex")
    assert status == 403 and ans["error"]["field"] == "tenant"
    status, ans, headers = await _query(http, gw, KEY)
    assert status == 429 and ans["error"]["code"] == "key_limited"
    assert int(headers["Retry-After"]) >= 1
    async with http.get(gw.url + "/v1/tenants") as r:
        flows = {f["flow"]: f for f in (await r.json())["flows"]}
    assert flows["acme"]["admitted"] == 2 and "globex" not in flows
    # One query of the slow tenant's key at a time: the second, sent meanwhile, waits.
    first, second = await asyncio.gather(_query(http, gw, SLOW_KEY), _query(http, gw, SLOW_KEY))
    assert sorted([first[0], second[0]]) == [200, 429]
    assert (await _query(http, gw, SLOW_KEY))[0] == 200  # the first one is answered: free
    # An admin token queries with no limit, as whichever tenant the body names.
    assert (await _query(http, gw, ADMIN, tenant="ops"))[0] == 200

    # `tailgate query` sends --token, $TAILGATE_TOKEN or, on the gateway's host, the config's
    # admin token.
    config = cluster.tmp_path / "tailgate.toml"
    argv = [sys.executable, "-m", "deploy.cli", "query", "--url", gw.url, "--servers", "ts-1",
            "--class", "C"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGATE_")}
    runs = [
        (argv, env, 1),
        (argv, {**env, "TAILGATE_TOKEN": ADMIN}, 0),
        ([*argv, "--token", ADMIN], env, 0),
        ([*argv[:3], "--config", str(config), *argv[3:]], env, 0),
    ]
    for args, run_env, code in runs:
        done = await asyncio.to_thread(
            subprocess.run,
            args,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=run_env,
        )
        assert done.returncode == code, (args, done.stderr)
        if code:
            assert "HTTP 401" in done.stderr
    _assert_no_secret(capfd.readouterr().err)


async def test_a_refused_registration_flood_writes_a_bounded_log(
    cluster: Cluster, http: aiohttp.ClientSession, capfd: pytest.CaptureFixture[str]
) -> None:
    gw = _gateway(
        cluster,
        "[auth]\nrefusal_interval_s = 0.5\nslowdown_after = 200\nslowdown_max_s = 2\n",
        {"TAILGATE_AGENT_TOKEN": REG},
    )
    sent = 3000
    statuses: list[int] = []
    start = time.monotonic()

    async def attempt(i: int) -> None:
        body = {"id": f"intruder-{i}", "address": "127.0.0.1:9"}
        headers = {} if i % 3 == 0 else _auth_header(f"guess-{i:06d}")
        async with http.post(gw.url + "/v1/servers", json=body, headers=headers) as r:
            statuses.append(r.status)
            if r.status == 429:
                assert int(r.headers["Retry-After"]) >= 1
                assert (await r.json())["error"]["code"] == "slowed_down"

    for batch in range(0, sent, 100):
        await asyncio.gather(*(attempt(i) for i in range(batch, batch + 100)))
    elapsed_s = time.monotonic() - start
    # The registration token still works from the same address while it is slowed down.
    ts = cluster.taskserver("ts-1")
    body = {"id": "ts-1", "address": ts.address}
    async with http.post(gw.url + "/v1/servers", json=body, headers=_auth_header(REG)) as r:
        assert r.status == 201
    await asyncio.sleep(1.2)  # the last interval closes and is logged
    gw.stop()
    err = capfd.readouterr().err

    assert statuses.count(401) + statuses.count(429) == sent
    assert statuses.count(429) > 0  # slowed down after 200 failures
    lines = [line for line in err.splitlines() if "gateway.guard" in line]
    # One line at the first refusal, then at most one per 0.5 s interval (and one at stop).
    assert len(lines) <= 2 + elapsed_s / 0.5 + 3, "\n".join(lines)
    # The first refusal is whichever of the first 100 concurrent attempts arrived first:
    # one without a credential or one with a wrong one.
    assert re.match(
        r"refused POST /v1/servers: 401 (no|unknown) credential from 127\.0\.0\.1",
        lines[0].split("gateway.guard: ", 1)[1],
    ), lines[0]
    firsts = sum(1 for line in lines if "gateway.guard: refused POST" in line)
    counted = firsts + sum(
        int(m.group(1)) for line in lines if (m := re.search(r"refused (\d+) more", line))
    )
    assert counted == sent
    assert sum(len(line) for line in lines) < 10_000  # not a line, and ~150 bytes, per try
    assert "guess-" not in err
    _assert_no_secret(err)
