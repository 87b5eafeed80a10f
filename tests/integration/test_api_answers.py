"""What a live gateway answers operators: bad sensing ranges as 4xx naming the field (a real
edge agent behind it), 415 for bodies that are not JSON, a `field` in every error body,
wall-clock history times, and a Retry-After under overload from the admission window."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register
from tests.integration.harness import start_cli
from tests.integration.test_edge_gateway import (  # noqa: F401 - template_store is a fixture
    SLO,
    TOKEN,
    _agent,
    _gateway,
    _up,
    _week,
    template_store,
)

pytestmark = pytest.mark.integration


async def _servers(http: aiohttp.ClientSession, url: str) -> dict[str, dict]:
    async with http.get(url + "/v1/servers") as r:
        return {s["id"]: s for s in (await r.json())["servers"]}


async def test_bad_sensing_ranges_are_4xx_naming_the_field(
    cluster: Cluster,
    http: aiohttp.ClientSession,
    template_store: Path,  # noqa: F811 - the fixture imported above
) -> None:
    gw = _gateway(cluster)
    _agent(cluster, template_store, gw, 0, "faculty")
    await _up(http, gw, {"pi-0"})
    week = _week()
    on_agent = {"servers": ["pi-0"]}

    # The gateway knows the agent's payload rules (its heartbeat names the executor): an end
    # before the start is refused before any task leaves.
    backwards = {**week, "start": week["end"], "end": week["start"]}
    status, body, _ = await query(http, gw, {"slo": SLO, "targets": on_agent, "task": backwards})
    assert status == 400, body
    assert (body["error"]["code"], body["error"]["field"]) == ("invalid_request", "task.end")
    assert "must be after start" in body["error"]["message"]
    status, body, _ = await query(
        http, gw, {"slo": SLO, "targets": on_agent, "task": {"op": "rnage"}}
    )
    assert (status, body["error"]["field"]) == (400, "task.op"), body
    assert (await _servers(http, gw.url))["pi-0"]["tasks_sent"] == 0

    # What only the agent can judge comes back marked invalid: 400 naming the field, with
    # the tasks, not 502.
    ancient = {**week, "start": "2001-01-01T00:00:00Z", "end": "2001-01-02T00:00:00Z"}
    status, body, _ = await query(http, gw, {"slo": SLO, "targets": on_agent, "task": ancient})
    assert status == 400, body
    assert (body["error"]["code"], body["error"]["field"]) == ("invalid_task", "task.start")
    assert "retention horizon" in body["error"]["message"]
    assert [t["status"] for t in body["tasks"]] == ["failed"]
    unknown = {**week, "sensor": "pressure"}
    status, body, _ = await query(http, gw, {"slo": SLO, "targets": on_agent, "task": unknown})
    assert (status, body["error"]["field"]) == (400, "task.sensor"), body
    assert "pressure" in body["error"]["message"]

    # A multi-query request names the stage's field.
    request = {"slo": SLO, "stages": [{"targets": on_agent, "task": backwards}]}
    async with http.post(gw.url + "/v1/requests", json=request) as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == "stages[0].task.end"

    # The agent serves on: a good range is answered.
    status, body, _ = await query(http, gw, {"slo": SLO, "targets": on_agent, "task": week})
    assert status == 200, body


async def test_bodies_must_be_json_and_every_error_names_its_field(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    cfg = cluster.tmp_path / "gateway.toml"
    cfg.write_text(
        "[gateway]\nmax_body_bytes = 4096\nhistory_interval_s = 0.2\nregistration_grace_s = 0\n"
    )
    gw = start_cli(["gateway", "--port", "0"], config=cfg, env={"TAILGATE_AGENT_TOKEN": TOKEN})
    cluster.procs.append(gw)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = b'{"class": "A", "targets": {"pool": "default", "fanout": 1}}'
    url = gw.url + "/v1/queries"

    # curl -d sends a form: 415, naming what was sent.
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for path, headers in (
        ("/v1/queries", form),
        ("/v1/requests", {"Content-Type": "text/plain"}),
        ("/v1/servers", {**auth, "Content-Type": "application/xml"}),
        ("/v1/queries", {"Content-Type": "application/json; charset=latin-1"}),
    ):
        async with http.post(gw.url + path, data=good, headers=headers) as r:
            assert r.status == 415, (path, await r.text())
            error = (await r.json())["error"]
            assert (error["code"], error["field"]) == ("unsupported_media_type", "Content-Type")
            assert r.headers["Accept-Post"] == "application/json"
    # JSON with a charset, and a body without Content-Type, are read as JSON: this one asks
    # for a server the gateway does not have (400 naming the field), not 415.
    for headers, skip in (
        ({"Content-Type": "application/json; charset=utf-8"}, ()),
        ({}, ("Content-Type",)),
    ):
        async with http.post(url, data=good, headers=headers, skip_auto_headers=skip) as r:
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["field"] == "targets.fanout"

    # Every error body carries `field`, null when no field is at fault.
    answers = []
    async with http.get(gw.url + "/v1/nothing") as r:
        answers.append((r.status, await r.json()))
    async with http.delete(url) as r:
        answers.append((r.status, await r.json()))
    async with http.post(url, data=b'{"x": "' + b"y" * 8000 + b'"}') as r:
        answers.append((r.status, await r.json()))
    async with http.post(gw.url + "/v1/servers", json={"id": "s", "address": "h:1"}) as r:
        answers.append((r.status, await r.json()))
    async with http.delete(gw.url + "/v1/servers/nope", headers=auth) as r:
        answers.append((r.status, await r.json()))
    async with http.get(gw.url + "/v1/history?since_s=-1") as r:
        answers.append((r.status, await r.json()))
    statuses = [s for s, _ in answers]
    assert statuses == [404, 405, 413, 401, 404, 400]
    fields = [b["error"]["field"] for _, b in answers]
    assert fields == [None, None, "", "Authorization", "id", "since_s"]

    # History times are wall-clock unix seconds.
    deadline = time.monotonic() + 10.0
    samples: list[dict] = []
    while not samples and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        async with http.get(gw.url + "/v1/history?since_s=60") as r:
            history = await r.json()
        samples = history["samples"]
    assert samples, history
    assert abs(history["now"] - time.time()) < 5.0
    assert all(abs(s["t"] - time.time()) < 60.0 for s in samples)


async def test_an_overload_503_retries_when_the_window_forgets_its_misses(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    # A 20 s time window: the misses of the burst below stay for 20 s, so a retry in the
    # configured 1 s would only be refused again.
    gw = cluster.gateway(
        "[gateway]\nretry_after_s = 1\n"
        "[admission]\nthreshold = 0.1\nwindow_tasks = 0\nwindow_s = 20.0\n"
    )
    await register(http, gw, cluster.taskserver("ts-1", "--slots", "1"))
    slow = {
        "slo": {"percentile": 99, "latency_ms": 200},
        "targets": {"servers": ["ts-1"]},
        "task": {"service_ms": 100},
    }
    # Six 100 ms tasks on one slot with ~190 ms budgets: the later ones miss t_D.
    results = await asyncio.gather(*[query(http, gw, slow) for _ in range(6)])
    assert sum(r[1]["tasks"][0]["missed_deadline"] for r in results) >= 3
    status, body, headers = await query(http, gw, {"class": "A", "targets": {"servers": ["ts-1"]}})
    assert status == 503, body
    assert body["error"]["code"] == "admission_rejected"
    estimate = body["retry_after_s"]
    assert 15.0 < estimate <= 20.0, body
    assert headers["Retry-After"] == str(max(math.ceil(estimate), 1))
    assert headers["Retry-After"] != "1"
