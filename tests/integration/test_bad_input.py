"""Bad input gets a clear 4xx naming the field, and the gateway keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register

pytestmark = pytest.mark.integration

GOOD = {"class": "A", "targets": {"pool": "default", "fanout": 2}, "task": {"service_ms": 1}}

CASES = [
    # (name, body, status, field, words in the message)
    (
        "unknown class",
        {"class": "Z", "targets": {"pool": "default", "fanout": 1}},
        400,
        "class",
        "unknown class",
    ),
    (
        "fanout 0",
        {"class": "A", "targets": {"pool": "default", "fanout": 0}},
        400,
        "targets.fanout",
        ">= 1",
    ),
    (
        "fanout larger than pool",
        {"class": "A", "targets": {"pool": "default", "fanout": 3}},
        400,
        "targets.fanout",
        "exceeds the 2 servers",
    ),
    (
        "fanout not integer",
        {"class": "A", "targets": {"pool": "default", "fanout": "2"}},
        400,
        "targets.fanout",
        "integer",
    ),
    (
        "negative latency",
        {"slo": {"percentile": 99, "latency_ms": -5}, "targets": {"pool": "default", "fanout": 1}},
        400,
        "slo.latency_ms",
        "> 0",
    ),
    (
        "percentile 100",
        {"slo": {"percentile": 100, "latency_ms": 50}, "targets": {"pool": "default", "fanout": 1}},
        400,
        "slo.percentile",
        "(0, 100)",
    ),
    (
        "unknown server",
        {"class": "A", "targets": {"servers": ["ts-1", "ts-99"]}},
        400,
        "targets.servers[1]",
        "ts-99",
    ),
    (
        "duplicate server",
        {"class": "A", "targets": {"servers": ["ts-1", "ts-1"]}},
        400,
        "targets.servers[1]",
        "duplicate",
    ),
    (
        "unknown pool",
        {"class": "A", "targets": {"pool": "nope", "fanout": 1}},
        400,
        "targets.pool",
        "unknown pool",
    ),
    ("missing targets", {"class": "A"}, 400, "targets", "required"),
    (
        "per_cluster with fanout",
        {"class": "A", "targets": {"pool": "default", "fanout": 1, "per_cluster": 1}},
        400,
        "targets.per_cluster",
        "one of 'fanout', 'all' or 'per_cluster'",
    ),
    (
        "bad cluster name",
        {"class": "A", "targets": {"pool": "default", "fanout": 1, "cluster": "lab 2"}},
        400,
        "targets.cluster",
        "'lab 2'",
    ),
    (
        "unknown cluster",
        {"class": "A", "targets": {"pool": "default", "all": True, "cluster": "gta"}},
        400,
        "targets.cluster",
        "unknown cluster 'gta' in pool 'default' (known: none)",
    ),
    (
        "per_cluster over a pool without clusters",
        {"class": "A", "targets": {"pool": "default", "per_cluster": 1}},
        503,
        None,
        "has no clusters",
    ),
    (
        "class and slo",
        {
            "class": "A",
            "slo": {"percentile": 99, "latency_ms": 5},
            "targets": {"pool": "default", "fanout": 1},
        },
        400,
        "slo",
        "not both",
    ),
    (
        "unknown field",
        {"class": "A", "targets": {"pool": "default", "fanout": 1}, "fanuot": 3},
        400,
        "fanuot",
        "unknown field",
    ),
    ("not an object", [1, 2], 400, "", "JSON object"),
]


@pytest.fixture
async def gw(cluster: Cluster, http: aiohttp.ClientSession):
    # No registration grace: a fanout above the registered servers is a client error at once.
    g = cluster.gateway("[gateway]\nmax_body_bytes = 4096\nregistration_grace_s = 0\n")
    for i in range(2):
        await register(http, g, cluster.taskserver(f"ts-{i + 1}"))
    return g


async def test_each_bad_query_is_named_and_the_gateway_keeps_serving(
    gw, http: aiohttp.ClientSession
) -> None:
    for name, body, status, field, words in CASES:
        got, ans, _ = await query(http, gw, body)
        assert got == status, (name, ans)
        assert ans["error"]["field"] == field, (name, ans)
        assert words in ans["error"]["message"], (name, ans)
    got, ans, _ = await query(http, gw, GOOD)
    assert got == 200, ans


async def test_malformed_json_empty_and_oversized_bodies(gw, http: aiohttp.ClientSession) -> None:
    url = gw.url + "/v1/queries"
    async with http.post(
        url, data=b'{"class": "A", "targets": ', headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
        assert "malformed JSON" in (await r.json())["error"]["message"]
    async with http.post(url, data=b"") as r:
        assert r.status == 400
        assert "empty" in (await r.json())["error"]["message"]
    big = b'{"class": "A", "task": "' + b"x" * 10_000 + b'"}'
    async with http.post(url, data=big, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "payload_too_large"
    async with http.get(gw.url + "/v1/nothing-here") as r:
        assert r.status == 404
        assert (await r.json())["error"] == {
            "code": "not_found", "message": "Not Found", "field": None
        }  # fmt: skip
        assert r.headers["Server"] == "tailgate"  # no library versions
    async with http.delete(url) as r:
        assert r.status == 405
        assert r.headers["Allow"] == "POST"
        assert (await r.json())["error"]["field"] is None
    got, ans, _ = await query(http, gw, GOOD)
    assert got == 200, ans


async def test_registration_errors_and_delete(gw, http: aiohttp.ClientSession) -> None:
    async with http.post(gw.url + "/v1/servers", json={"id": "x", "address": "nohost"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == "address"
    async with http.post(
        gw.url + "/v1/servers", json={"id": "x", "address": "127.0.0.1:1", "pool": "zz"}
    ) as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == "pool"
    async with http.post(
        gw.url + "/v1/servers", json={"id": "x", "address": "127.0.0.1:1", "cluster": "a/b"}
    ) as r:
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["field"] == "cluster" and "'a/b'" in err["message"]
    async with http.delete(gw.url + "/v1/servers/nope") as r:
        assert r.status == 404
    async with http.delete(gw.url + "/v1/servers/ts-2") as r:
        assert r.status == 200
    got, ans, _ = await query(http, gw, GOOD)
    assert got == 400 and ans["error"]["field"] == "targets.fanout", ans
    async with http.get(gw.url + "/v1/servers") as r:
        assert [s["id"] for s in (await r.json())["servers"]] == ["ts-1"]
