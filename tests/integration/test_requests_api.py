"""POST /v1/requests over real processes: stages in a row under one SLO (TailGuard eq. (5))."""

from __future__ import annotations

from typing import Any

import aiohttp
import jsonschema
import pytest

from tests.integration.conftest import Cluster, register
from tests.integration.harness import Proc

pytestmark = pytest.mark.integration


async def _request(
    http: aiohttp.ClientSession, gw: Proc, body: Any
) -> tuple[int, dict[str, Any], Any]:
    """POST /v1/requests; returns (status, JSON body, headers)."""
    async with http.post(gw.url + "/v1/requests", json=body) as resp:
        return resp.status, await resp.json(), resp.headers


async def _check_answer(http: aiohttp.ClientSession, gw: Proc, body: dict[str, Any]) -> None:
    """The answer has the shape GET /openapi.json publishes for it."""
    async with http.get(gw.url + "/openapi.json") as resp:
        doc = await resp.json()
    schema = {"$ref": "#/components/schemas/RequestAnswer", "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


async def _gateway(cluster: Cluster, http: aiohttp.ClientSession, n: int) -> Proc:
    gw = cluster.gateway()
    for i in range(n):
        await register(http, gw, cluster.taskserver(f"ts-{i + 1}"))
    return gw


async def test_two_stages_share_the_request_slo(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = await _gateway(cluster, http, 2)
    status, body, _ = await _request(
        http,
        gw,
        {
            "class": "B",
            "stages": [
                {"targets": {"pool": "default", "fanout": 2}, "task": {"service_ms": 5}},
                {"targets": {"pool": "default", "fanout": 1}, "task": {"service_ms": 5}},
            ],
        },
    )
    assert status == 200, body
    assert (body["class"], body["slo_ms"], body["stage_rule"]) == ("B", 300.0, "remaining")
    first, second = body["stages"]
    assert [first["fanout"], second["fanout"]] == [2, 1]
    for stage in body["stages"]:
        assert [t["status"] for t in stage["tasks"]] == ["ok"] * stage["fanout"]
        # Each stage is a query with its own SLO: T_b = its SLO - its x_p^u (eq. (4)).
        assert stage["budget_ms"] == pytest.approx(
            stage["slo_ms"] - stage["unloaded_latency_ms"], abs=1e-3
        )
        assert stage["slo_ms"] <= stage["remaining_ms"] + 1e-3
        assert stage["remaining_ms"] == pytest.approx(300.0 - stage["started_ms"], abs=1e-3)
    # remaining: stage 0 leaves stage 1 its x_p^u; stage 1 gets all that is left, so its
    # SLO ends where the request's does (the budget is additive, eq. (5)).
    assert first["slo_ms"] == pytest.approx(
        first["remaining_ms"] - second["unloaded_latency_ms"], abs=0.5
    )
    assert second["started_ms"] + second["slo_ms"] == pytest.approx(300.0, abs=1e-3)
    assert second["started_ms"] >= first["started_ms"] + first["latency_ms"] - 1e-3
    assert body["latency_ms"] >= second["started_ms"] + second["latency_ms"] - 1e-3
    assert body["met_slo"] is (body["latency_ms"] <= 300.0)
    await _check_answer(http, gw, body)

    status, body, _ = await _request(
        http,
        gw,
        {"class": "B", "stages": [{"targets": {"pool": "default", "fanout": 1}}, {"targets": {}}]},
    )
    assert status == 400 and body["error"]["field"] == "stages[1].targets.pool", body


async def test_a_second_stage_without_budget_is_503_naming_it(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = await _gateway(cluster, http, 1)
    # Stage 0 may take 300 ms less stage 1's x_p^u (some 10 ms) and takes 295: what is left
    # is below stage 1's x_p^u, so it cannot start.
    status, body, headers = await _request(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 300},
            "stages": [
                {"targets": {"servers": ["ts-1"]}, "task": {"service_ms": 295}},
                {"targets": {"servers": ["ts-1"]}},
            ],
        },
    )
    assert status == 503, body
    assert body["error"]["code"] == "request_budget_exhausted"
    assert body["error"]["field"] == "stages[1]" and body["stage"] == 1
    assert "Retry-After" in headers
    (first,) = body["stages"]
    assert first["stage"] == 0 and first["tasks"][0]["status"] == "ok"
    assert first["latency_ms"] >= 295.0
    assert body["remaining_ms"] < body["unloaded_latency_ms"]
    assert body["met_slo"] is False
    await _check_answer(http, gw, body)
