"""What the HTTP API answers operators: media types, error bodies, Retry-After estimates,
sensing tasks checked at the gateway and refused by agents (no sockets)."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from admission import AdmissionConfig, AdmissionGate, MissRatioWindow, QueryInfo, Rule
from gateway import errors
from gateway.app import (
    QUERY_STATUS,
    _errors,
    check_media_type,
    retry_after_s,
    wall_clock,
)
from gateway.config import ClassConfig, GatewayConfig, PoolConfig
from gateway.errors import ApiError, BadRequest, Unavailable, UnsupportedMediaType
from gateway.links import ServerLink
from gateway.overload import admit
from gateway.queries import QueryOutcome
from gateway.requests import QueryRequest, Targets, check_task, parse_query
from gateway.retry_after import delta_seconds, server_back_s, servers_back_s
from gateway.targets import TargetPicker
from taskserver.abc import INVALID_TASK_PREFIX, ExecutorError, InvalidTask
from taskserver.wire import TaskStatus
from tests.unit.test_query_path import _service, _started

# -- 415: request bodies are JSON ------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,  # no Content-Type: read as JSON (RFC 9110 §8.3)
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        'application/json; charset="utf-8"',
    ],
)
def test_json_bodies_are_accepted(content_type: str | None) -> None:
    check_media_type(content_type)


@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),  # curl -d
        ("text/plain; charset=utf-8", "'text/plain'"),
        ("application/octet-stream", "'application/octet-stream'"),
        ("", "'(empty)'"),
        ("application/json; charset=latin-1", "charset 'latin-1'"),
    ],
)
def test_other_media_types_are_415_naming_what_was_sent(content_type: str, named: str) -> None:
    with pytest.raises(UnsupportedMediaType) as err:
        check_media_type(content_type)
    exc = err.value
    assert (exc.status, exc.code, exc.field) == (415, "unsupported_media_type", "Content-Type")
    assert named in exc.message
    assert exc.body()["error"]["field"] == "Content-Type"


# -- error bodies: `field` is always there ---------------------------------------------------


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


@pytest.mark.parametrize("cls", [ApiError, *_subclasses(ApiError)])
def test_every_api_error_body_has_a_field_null_when_none(cls: type[ApiError]) -> None:
    assert cls("no field").body()["error"] == {
        "code": cls.code,
        "message": "no field",
        "field": None,
    }
    assert cls("a field", field="x.y").body()["error"]["field"] == "x.y"


def test_the_error_tree_lists_every_status() -> None:
    # The module docstring draws the tree the API answers with; a new error joins it.
    for cls in _subclasses(ApiError):
        assert f"{cls.__name__}" in errors.__doc__ and str(cls.status) in errors.__doc__


async def _through_errors(exc: BaseException) -> web.Response:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise exc

    request = make_mocked_request("POST", "/v1/queries", app=web.Application())
    response = await _errors(request, handler)
    assert isinstance(response, web.Response)
    return response


@pytest.mark.parametrize(
    ("exc", "status", "code", "field"),
    [
        (web.HTTPNotFound(), 404, "not_found", None),
        (web.HTTPMethodNotAllowed("DELETE", ["POST"]), 405, "method_not_allowed", None),
        (web.HTTPRequestEntityTooLarge(1024, 2048), 413, "payload_too_large", ""),
        (web.HTTPBadRequest(), 400, "http_error", None),
        (BadRequest("bad", field="targets.fanout"), 400, "invalid_request", "targets.fanout"),
        (RuntimeError("a bug"), 500, "internal", None),
    ],
)
async def test_every_error_the_app_renders_is_json_with_a_field(
    exc: BaseException, status: int, code: str, field: str | None
) -> None:
    response = await _through_errors(exc)
    assert response.status == status
    assert response.content_type == "application/json"
    assert response.body is not None
    error = json.loads(bytes(response.body))["error"]  # type: ignore[arg-type]
    assert (error["code"], error["field"]) == (code, field)
    assert "a bug" not in error["message"]  # no internals on the wire


# -- Retry-After: estimates, not the configured constant -------------------------------------


def test_delta_seconds_are_whole_at_least_one_and_fall_back_without_an_estimate() -> None:
    assert delta_seconds(2.01, 7) == 3
    assert delta_seconds(0.0, 7) == 1
    assert delta_seconds(None, 7) == 7
    assert delta_seconds(math.inf, 7) == 7
    assert delta_seconds(math.nan, 7) == 7
    assert retry_after_s(Unavailable("x", extra={"retry_after_s": 12.3}), 1) == 13
    assert retry_after_s(Unavailable("x", extra={"retry_after_s": True}), 4) == 4


def test_server_back_estimates_follow_the_server_state() -> None:
    # heartbeat_s 1, heartbeat_timeout_s 3
    assert server_back_s("connecting", 0.5, None, 1.0, 3.0) == 2.5  # first heartbeat bound
    assert server_back_s("connecting", 2.8, None, 1.0, 3.0) == 1.0  # at least one period
    assert server_back_s("down", 100.0, None, 1.0, 3.0) == 3.0  # a reconnect
    assert server_back_s("draining", 0.0, 4.25, 1.0, 3.0) == 4.25  # its drain bound
    assert server_back_s("draining", 0.0, -1.0, 1.0, 3.0) == 0.0
    assert server_back_s("draining", 0.0, None, 1.0, 3.0) is None  # no bound known
    assert server_back_s("owned_elsewhere", 0.0, None, 1.0, 3.0) is None
    assert servers_back_s([5.0, None, 1.0, 3.0], 2) == 3.0  # the second soonest
    assert servers_back_s([5.0, None], 2) is None
    assert servers_back_s([], 0) == 0.0


def _link(sid: str, state: str) -> ServerLink:
    link = ServerLink(
        sid, "127.0.0.1", 1, pool="default", on_result=lambda *a: None, on_failure=lambda *a: None
    )
    link.state = state
    return link


def test_servers_unavailable_retries_when_enough_servers_may_be_back() -> None:
    config = GatewayConfig(pools=(PoolConfig("default"),), storage_url="")
    links: dict[str, ServerLink] = {}
    back = {"a": None, "b": 6.0, "c": 2.0}
    picker = TargetPicker(config, links, random.Random(1), back_in=lambda lk: back[lk.server_id])
    for sid in back:
        links[sid] = _link(sid, "up")
        picker.join(links[sid])
    for sid in ("b", "c"):  # deregistering with drain bounds: out of the selection
        links[sid].draining = True
        picker.leave(links[sid])
    req = parse_query({"class": "A", "targets": {"pool": "default", "fanout": 2}}, config)
    with pytest.raises(Unavailable) as err:
        picker.pick(req.targets)
    assert err.value.code == "servers_unavailable"
    assert err.value.extra["retry_after_s"] == 2.0  # one more server is needed: c's
    req3 = parse_query({"class": "A", "targets": {"pool": "default", "fanout": 3}}, config)
    with pytest.raises(Unavailable) as err3:
        picker.pick(req3.targets)
    assert err3.value.extra["retry_after_s"] == 6.0  # both are needed
    assert retry_after_s(err3.value, 1) == 6


async def test_a_query_on_a_lost_server_retries_after_a_reconnect() -> None:
    svc, _, links = await _service(2)
    links[1].up = False  # lost: its link reconnects within a heartbeat timeout
    req = QueryRequest("B", 99.0, 300.0, 1, Targets(servers=("s0", "s1")), b"{}")
    with pytest.raises(Unavailable) as err:
        await svc.run_query(req)
    assert err.value.code == "servers_down"
    assert err.value.extra["retry_after_s"] == svc.config.heartbeat_timeout_s
    assert retry_after_s(err.value, 1) == math.ceil(svc.config.heartbeat_timeout_s)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_time_window_releases_when_its_misses_age_out() -> None:
    w = MissRatioWindow(window_tasks=None, window_s=10.0)
    w.record_many(2, 4, 0.0)  # 2 misses of 4 at t=0
    w.record_many(0, 4, 3.0)  # 0 of 4 at t=3: 2/8 = 0.25
    w.record_many(1, 10, 5.0)  # 3/18 ~ 0.167
    # Below 0.2 now; below 0.1 once the t=0 chunk leaves (1/14), at t=10.
    assert w.release_after_s(0.2, 5.0) == 0.0
    assert w.release_after_s(0.1, 5.0) == pytest.approx(5.0)
    # Below 0.05 only when the t=5 chunk leaves too, at t=15 (empty: 0).
    assert w.release_after_s(0.05, 6.0) == pytest.approx(9.0)
    assert MissRatioWindow(window_tasks=10).release_after_s(0.1, 0.0) == 0.0  # empty
    counted = MissRatioWindow(window_tasks=10)
    counted.record(True, 0.0)
    assert counted.release_after_s(0.1, 0.0) is None  # only new tasks push misses out


def _gate(clock: Clock, **kw: Any) -> AdmissionGate:
    config = AdmissionConfig(threshold=0.1, **kw)
    return AdmissionGate(config, [ClassConfig("A", 100.0)], clock)


def test_the_gate_estimates_its_release_from_its_window() -> None:
    clock = Clock(100.0)
    timed = _gate(clock, window_tasks=0, window_s=30.0)
    timed.record_tasks(5, 10, "A")  # at t=100: half of them late
    clock.now = 104.0
    assert timed.release_after_s() == pytest.approx(26.0)  # they leave at t=130
    clock.now = 110.0
    assert timed.release_after_s() == pytest.approx(20.0)
    timed.record_tasks(0, 1000, "A")  # a thousand tasks on time: 5 of 1010 late
    assert timed.release_after_s() == 0.0
    counted = _gate(clock, window_tasks=100, window_max_age_s=5.0)
    clock.now = 104.0
    counted.record_tasks(5, 10, "A")  # at t=104
    clock.now = 106.5
    assert counted.release_after_s() == pytest.approx(2.5)  # cleared 5 s after the last task
    assert _gate(clock, window_tasks=100).release_after_s() == 0.0  # nothing missed
    throttled = _gate(clock, rule=Rule.THROTTLE)
    assert throttled.release_after_s() is None  # it admits a share at any time


async def test_a_miss_ratio_rejection_carries_the_window_estimate() -> None:
    clock = Clock(100.0)
    gate = _gate(clock, window_tasks=0, window_s=30.0)
    gate.record_tasks(5, 10, "A")
    clock.now = 110.0
    with pytest.raises(Unavailable) as err:
        await admit(gate, QueryInfo("A", 0, 1, 100.0, 1.0), lambda: 0.0)
    assert err.value.code == "admission_rejected"
    assert err.value.extra["retry_after_s"] == pytest.approx(20.0)
    assert retry_after_s(err.value, 1) == 20  # not the configured 1


async def test_a_draining_gateway_retries_after_its_drain_bound() -> None:
    svc, clock, _ = await _service(1)
    await svc.drain(timeout_s=5.0)  # nothing in flight: done at once, and still draining
    clock.now += 0.25
    req = QueryRequest("A", 99.0, 100.0, 0, Targets(pool="default", fanout=1), b"{}")
    with pytest.raises(Unavailable) as err:
        await svc.run_query(req)
    assert err.value.code == "draining"
    assert err.value.extra["retry_after_s"] == pytest.approx(4.75)
    assert retry_after_s(err.value, 1) == 5


# -- sensing tasks: 4xx naming the field, at the gateway or from the agent ---------------------


def test_a_sensing_task_is_checked_for_edge_agents_only() -> None:
    bad = json.dumps({"op": "range", "sensor": "t", "start": 20, "end": 10}).encode()
    check_task(bad, ["emulated", None])  # other executors judge their own payloads
    with pytest.raises(BadRequest) as err:
        check_task(bad, ["sensing"])
    assert err.value.field == "task.end"
    assert "must be after start" in err.value.message
    with pytest.raises(BadRequest) as err2:
        check_task(b'"latest"', ["sensing", "sensing"])
    assert err2.value.field == "task"
    with pytest.raises(BadRequest) as err3:
        check_task(b"{}", ["sensing"])
    assert err3.value.field == "task.op"
    check_task(json.dumps({"op": "latest", "sensor": "humidity"}).encode(), ["sensing"])


def test_an_invalid_task_travels_as_a_marked_failure() -> None:
    exc = InvalidTask("start", "2000-01-01 is before the retention horizon")
    assert isinstance(exc, ExecutorError) and str(exc).startswith("start: ")
    wire = exc.wire_error()
    assert wire.startswith(INVALID_TASK_PREFIX)
    back = InvalidTask.from_wire(wire)
    assert back is not None and (back.field, back.problem) == (exc.field, exc.problem)
    assert InvalidTask.from_wire("store: disk I/O error") is None
    assert InvalidTask.from_wire(None) is None


async def test_a_gateway_refuses_a_bad_sensing_range_before_any_task_leaves() -> None:
    svc, _, links = await _service(2)
    for lk in links:
        lk.executor = "sensing"
    task = {"op": "range", "sensor": "temperature", "start": 200, "end": 100}
    req = parse_query({"class": "A", "targets": {"pool": "default", "all": True}, "task": task},
                      svc.config)  # fmt: skip
    with pytest.raises(BadRequest) as err:
        await svc.run_query(req)
    assert err.value.field == "task.end"
    assert all(not lk.sent for lk in links)


async def test_an_agent_refusing_the_task_as_invalid_is_a_client_error_not_a_502() -> None:
    svc, clock, links = await _service(2)
    for lk in links:
        lk.executor = "sensing"
    task = {"op": "range", "sensor": "temperature", "start": 0, "end": 100}
    req = parse_query({"class": "A", "targets": {"pool": "default", "all": True}, "task": task},
                      svc.config)  # fmt: skip
    running = await _started(svc, req)
    horizon = InvalidTask("start", "0 is before the retention horizon 2025-06-01T00:00:00Z")
    links[0].answer(clock, TaskStatus.FAILED, error=horizon.wire_error())
    answer = await running
    assert answer.outcome is QueryOutcome.INVALID and QUERY_STATUS[answer.outcome] == 400
    error = answer.summary["error"]
    assert (error["code"], error["field"]) == ("invalid_task", "task.start")
    assert "retention horizon" in error["message"]
    # A server's own failure stays a 502.
    running = await _started(svc, req)
    links[1].answer(clock, TaskStatus.FAILED, error="store: disk I/O error")
    answer = await running
    assert answer.outcome is QueryOutcome.FAILED and QUERY_STATUS[answer.outcome] == 502
    assert answer.summary["error"]["field"] is None


# -- wall-clock answers ----------------------------------------------------------------------


def test_decision_runs_and_scaling_times_become_unix_seconds() -> None:
    snap = {
        "last_up_s": 50.0,
        "last_change_s": 60.0,
        "up_cooldown_s": 10.0,  # a duration, left alone
        "decisions": [{"time": 70.0, "last_time": 90.0, "repeats": 21}],
    }
    out = wall_clock(snap, 1_700_000_000.0)
    assert out["last_up_s"] == 1_700_000_050.0 and out["last_up_s_monotonic_s"] == 50.0
    assert out["last_change_s"] == 1_700_000_060.0
    assert out["up_cooldown_s"] == 10.0
    assert out["decisions"][0]["last_time"] == 1_700_000_090.0
    assert out["decisions"][0]["repeats"] == 21
