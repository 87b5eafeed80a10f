"""Multi-query requests: the body's validation and the stages' SLOs (TailGuard eq. (5)).

The request path runs here over a fake query path with a fake clock: each stage "runs" for
a scripted time, so every assigned SLO is an exact number.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest

from gateway.config import ClassConfig, GatewayConfig, PoolConfig
from gateway.deadlines import DeadlinePlan
from gateway.errors import ApiError, BadRequest, SloUnreachableError, Unavailable
from gateway.openapi import openapi_document
from gateway.queries import QueryOutcome, TaskOutcome
from gateway.query_path import QueryAnswer
from gateway.request_path import RequestPath, assign_stage
from gateway.requests import (
    MAX_STAGES,
    MULTI_QUERY_BODY,
    MultiQueryRequest,
    QueryRequest,
    parse_multi_query,
)
from gateway.stages import stage_slo_ms

CONFIG = GatewayConfig(
    classes=(ClassConfig("A", 100.0, 99.0, 0), ClassConfig("B", 300.0, 99.0, 1)),
    pools=(PoolConfig("default"),),
    storage_url="",
)
STAGE = {"targets": {"pool": "default", "fanout": 2}}
BODY: dict[str, Any] = {
    "class": "B",
    "stages": [
        STAGE,
        {"targets": {"servers": ["s1"]}, "task": {"x": 1}, "priority": 4},
        {"targets": {"pool": "default", "all": True}},
    ],
}


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`body` with the value at a path like ``stages[1].targets.fanout`` set (None: removed)."""
    out = copy.deepcopy(body)
    node: Any = out
    keys: list[Any] = []
    for part in path.split("."):
        name, _, index = part.partition("[")
        keys.append(name)
        if index:
            keys.append(int(index.rstrip("]")))
    *parents, leaf = keys
    for key in parents:
        node = node[key]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return out


# -- the body ----------------------------------------------------------------------------


def test_a_valid_body_becomes_one_query_per_stage_with_the_request_class() -> None:
    req = parse_multi_query(BODY, CONFIG)
    assert (req.class_name, req.percentile, req.slo_ms) == ("B", 99.0, 300.0)
    assert req.stage_rule == "remaining" and req.tenant == "default"
    first, second, _ = req.stages
    assert first.class_name == second.class_name == "B"
    assert first.slo_ms == second.slo_ms == 300.0
    assert first.priority == 1  # the class's
    assert second.priority == 4 and second.payload == b'{"x":1}'
    assert first.targets.fanout == 2 and second.targets.servers == ("s1",)


def test_an_slo_tenant_and_rule_reach_every_stage() -> None:
    body = {
        "slo": {"percentile": 95, "latency_ms": 80},
        "tenant": "t-1",
        "stage_rule": "equal",
        "stages": [{**STAGE, "cost_hint": 2.5}, STAGE],
    }
    req = parse_multi_query(body, CONFIG)
    assert (req.class_name, req.percentile, req.slo_ms, req.stage_rule) == (None, 95, 80, "equal")
    assert [s.tenant for s in req.stages] == ["t-1", "t-1"]
    assert [s.cost_hint_ms for s in req.stages] == [2.5, None]


BAD: list[tuple[str, Any, str]] = [
    ("stages", None, "stages"),
    ("stages", [], "stages"),
    ("stages", {"targets": {}}, "stages"),
    ("stages", [STAGE] * (MAX_STAGES + 1), "stages"),
    ("stages[1]", 7, "stages[1]"),
    ("stages[0].class", "A", "stages[0].class"),
    ("stages[0].targets", None, "stages[0].targets"),
    ("stages[2].targets.fanout", 0, "stages[2].targets.fanout"),
    ("stages[0].targets.fanout", None, "stages[0].targets.fanout"),
    ("stages[0].targets.pool", "nope", "stages[0].targets.pool"),
    ("stages[1].targets.servers", [], "stages[1].targets.servers"),
    ("stages[1].targets.servers", ["s1", "s1"], "stages[1].targets.servers[1]"),
    ("stages[1].targets.surprise", 1, "stages[1].targets.surprise"),
    ("stages[1].priority", 1001, "stages[1].priority"),
    ("stages[1].task", math.nan, "stages[1].task"),
    ("stages[0].cost_hint", 0, "stages[0].cost_hint"),
    ("stage_rule", "greedy", "stage_rule"),
    ("stage_rule", 1, "stage_rule"),
    ("class", "Z", "class"),
    ("slo", {"percentile": 99, "latency_ms": 50}, "slo"),
    ("tenant", "-x", "tenant"),
    ("priority", 1, "priority"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD)
def test_a_bad_body_is_400_naming_the_field_path(path: str, value: Any, field: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_multi_query(_with(BODY, path, value), CONFIG)
    assert err.value.field == field, err.value.message


def test_neither_class_nor_slo_without_a_default_class_names_class() -> None:
    with pytest.raises(BadRequest) as err:
        parse_multi_query({"stages": [STAGE]}, CONFIG)
    assert err.value.field == "class"
    for bad in ([], "x"):
        with pytest.raises(BadRequest) as err:
            parse_multi_query(bad, CONFIG)
        assert err.value.field == ""


DOC = openapi_document()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("stages", []),
        ("stages", [STAGE] * MAX_STAGES),
        ("stages", [STAGE] * (MAX_STAGES + 1)),
        ("stages[0].surprise", 1),
        ("stages[1].priority", 1001),
        ("stages[1].priority", -1000),
        ("stage_rule", "proportional"),
        ("stage_rule", "greedy"),
        ("tenant", "ok.1"),
        ("tenant", ""),
        ("stages[0].targets.fanout", 0),
        ("unknown", 1),
    ],
)
def test_the_published_schema_and_the_validation_agree(path: str, value: Any) -> None:
    schema = {"$ref": "#/components/schemas/MultiQueryRequest", "components": DOC["components"]}
    body = _with(BODY, path, value)
    schema_ok = jsonschema.Draft202012Validator(schema).is_valid(body)
    try:
        parse_multi_query(body, CONFIG)
        parse_ok = True
    except BadRequest:
        parse_ok = False
    assert schema_ok == parse_ok


def test_the_document_publishes_the_bodies_and_answers() -> None:
    schemas = DOC["components"]["schemas"]
    assert schemas["MultiQueryRequest"] == MULTI_QUERY_BODY.schema()
    for name in ("MultiQueryRequest", "Stage", "RequestAnswer", "StageAnswer"):
        jsonschema.Draft202012Validator.check_schema(schemas[name])
    responses = DOC["paths"]["/v1/requests"]["post"]["responses"]
    assert set(responses) == {
        *("200", "400", "401", "403", "408", "413", "415", "422", "429"),
        *("500", "502", "503", "504"),
    }


# -- the stages' SLOs ---------------------------------------------------------------------


def test_assign_stage_gives_the_stage_rule_what_is_left() -> None:
    b = assign_stage("remaining", 300.0, 100.0, [50.0, 30.0])
    assert (b.remaining_ms, b.slo_ms, b.unloaded_ms, b.later_unloaded_ms) == (200, 170, 50, 30)
    assert not b.exhausted
    for rule in ("proportional", "equal"):
        b = assign_stage(rule, 300.0, 100.0, [50.0, 30.0])
        assert b.slo_ms == stage_slo_ms(rule, 200.0, [50.0, 30.0])
    # Every rule: exhausted exactly when R is not above the stages' unloaded sum.
    for rule in ("remaining", "proportional", "equal"):
        assert assign_stage(rule, 300.0, 220.0, [50.0, 30.0]).exhausted
        assert not assign_stage(rule, 300.0, 219.0, [50.0, 30.0]).exhausted


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeLink:
    server_id: str


class FakeQueries:
    """A query path whose x_p^u is 10 ms per server and whose stages take scripted times."""

    def __init__(self, durations_ms: Sequence[float], outcomes: Sequence[QueryOutcome] = ()):
        self.clock = FakeClock()
        self.durations_ms = list(durations_ms)
        self.outcomes = list(outcomes)
        self.ran: list[tuple[QueryRequest, float]] = []
        self.refusals: dict[int, ApiError] = {}
        """Stage index -> the error its run_query raises instead of running (admission...)."""

    def resolve(self, req: QueryRequest) -> list[FakeLink]:
        t = req.targets
        if t.servers is not None:
            return [FakeLink(s) for s in t.servers]
        assert t.fanout is not None
        if t.fanout > 4:
            raise BadRequest("fanout exceeds the 4 servers", field="targets.fanout")
        return [FakeLink(f"s{i}") for i in range(t.fanout)]

    def plan(self, req: QueryRequest, links: list[FakeLink]) -> DeadlinePlan:
        u = 10.0 * len(links)
        if not req.slo_ms > u:
            raise SloUnreachableError("below", extra={"unloaded_latency_ms": u})
        return DeadlinePlan(req.percentile, req.slo_ms, u, req.slo_ms - u, "empirical", len(links))

    async def run_query(
        self, req: QueryRequest, t0: float | None = None, caller: Any = None
    ) -> QueryAnswer:
        assert t0 == self.clock()
        if len(self.ran) in self.refusals:
            raise self.refusals[len(self.ran)]
        self.ran.append((req, t0))
        links = self.resolve(req)
        plan = self.plan(req, links)
        took_ms = self.durations_ms.pop(0)
        self.clock.now += took_ms / 1000.0
        outcome = self.outcomes.pop(0) if self.outcomes else QueryOutcome.MET
        ok = outcome in (QueryOutcome.MET, QueryOutcome.MISSED_SLO)
        summary: dict[str, Any] = {
            "query_id": f"q-{len(self.ran)}",
            "fanout": len(links),
            "budget_ms": plan.budget_ms,
            "unloaded_latency_ms": plan.unloaded_ms,
            "estimate": "empirical",
            "latency_ms": took_ms,
            "met_slo": ok and took_ms <= req.slo_ms,
        }
        if not ok:
            summary["error"] = {"code": "task_failed", "message": "boom", "field": None}
        tasks = [TaskOutcome(lk.server_id, "ok" if ok else "failed") for lk in links]
        return QueryAnswer(outcome, summary, tasks)


def _request(fanouts: Sequence[int], rule: str = "remaining", slo_ms: float = 300.0):
    stages = [{"targets": {"pool": "default", "fanout": k}} for k in fanouts]
    body = {"slo": {"percentile": 99, "latency_ms": slo_ms}, "stage_rule": rule, "stages": stages}
    return parse_multi_query(body, CONFIG)


async def _run(
    req: MultiQueryRequest, queries: FakeQueries
) -> tuple[Any, list[tuple[QueryRequest, float]]]:
    path = RequestPath(queries, "req")  # type: ignore[arg-type]
    return await path.run(req, queries.clock()), queries.ran


async def test_remaining_gives_each_stage_what_is_left_less_the_later_stages_unloaded() -> None:
    # u = 30, 20, 10 ms; the stages take 125 and 62.5 ms (exact in binary seconds).
    answer, ran = await _run(_request([3, 2, 1]), FakeQueries([125.0, 62.5, 5.0]))
    assert [req.slo_ms for req, _ in ran] == [300 - 30, 175 - 10, 112.5]
    stages = answer.body["stages"]
    assert [s["started_ms"] for s in stages] == [0.0, 125.0, 187.5]
    assert [s["remaining_ms"] for s in stages] == [300.0, 175.0, 112.5]
    assert [s["budget_ms"] for s in stages] == [270 - 30, 165 - 20, 112.5 - 10]
    # The additive budget: the last stage's SLO ends where the request's does.
    assert stages[-1]["started_ms"] + stages[-1]["slo_ms"] == 300.0
    assert all(s["slo_ms"] <= s["remaining_ms"] for s in stages)
    assert answer.outcome is QueryOutcome.MET
    assert answer.body["met_slo"] is True and answer.body["latency_ms"] == 192.5
    assert answer.body["request_id"] == "req-1" and answer.body["stage_rule"] == "remaining"


@pytest.mark.parametrize("rule", ["proportional", "equal"])
async def test_the_other_rules_share_the_slack(rule: str) -> None:
    answer, ran = await _run(_request([3, 1], rule), FakeQueries([125.0, 5.0]))
    assert ran[0][0].slo_ms == stage_slo_ms(rule, 300.0, [30.0, 10.0])
    assert ran[1][0].slo_ms == stage_slo_ms(rule, 175.0, [10.0]) == 175.0
    assert answer.outcome is QueryOutcome.MET


async def test_each_stage_runs_on_the_servers_picked_at_arrival() -> None:
    _, ran = await _run(_request([2, 1]), FakeQueries([5.0, 5.0]))
    assert [req.targets.servers for req, _ in ran] == [("s0", "s1"), ("s0",)]


async def test_a_stage_that_misses_its_own_slo_does_not_end_the_request() -> None:
    # equal: stage 0 gets 10 + 280 / 2 = 150 ms and takes 187.5; 112.5 ms are left.
    answer, ran = await _run(_request([1, 1], "equal"), FakeQueries([187.5, 62.5]))
    assert [req.slo_ms for req, _ in ran] == [150.0, 112.5]
    assert [s["met_slo"] for s in answer.body["stages"]] == [False, True]
    assert answer.outcome is QueryOutcome.MET and answer.body["latency_ms"] == 250.0
    # The request misses when its stages' latencies add up past its SLO (eq. (5)).
    answer, _ = await _run(_request([1, 1], "equal"), FakeQueries([187.5, 125.0]))
    assert answer.outcome is QueryOutcome.MISSED_SLO and answer.body["met_slo"] is False


async def test_an_exhausted_budget_is_503_naming_the_stage_with_the_stages_run() -> None:
    queries = FakeQueries([296.875])
    with pytest.raises(Unavailable) as err:
        await _run(_request([1, 1]), queries)
    exc = err.value
    assert exc.code == "request_budget_exhausted" and exc.field == "stages[1]"
    assert exc.extra["stage"] == 1 and exc.extra["remaining_ms"] == 3.125
    assert exc.extra["unloaded_latency_ms"] == 10.0
    assert [s["stage"] for s in exc.extra["stages"]] == [0]
    assert exc.extra["request_id"] == "req-1" and exc.extra["slo_ms"] == 300.0
    assert len(queries.ran) == 1


async def test_an_slo_below_the_stages_unloaded_sum_is_refused_at_arrival() -> None:
    queries = FakeQueries([])
    with pytest.raises(SloUnreachableError) as err:
        await _run(_request([2, 1], slo_ms=30.0), queries)
    assert err.value.field == "slo.latency_ms"
    assert err.value.extra["stages_unloaded_latency_ms"] == [20.0, 10.0]
    assert err.value.extra["stages"] == [] and queries.ran == []


async def test_a_failed_stage_ends_the_request_with_its_outcome() -> None:
    queries = FakeQueries([5.0, 5.0], [QueryOutcome.FAILED])
    answer, ran = await _run(_request([1, 1]), queries)
    assert len(ran) == 1
    assert answer.outcome is QueryOutcome.FAILED
    assert answer.body["error"]["field"] == "stages[0]" and answer.body["stage"] == 0
    assert answer.body["met_slo"] is False
    assert [t["status"] for t in answer.body["stages"][0]["tasks"]] == ["failed"]


async def test_a_refused_stage_names_itself_and_keeps_the_stages_run() -> None:
    queries = FakeQueries([5.0, 5.0])
    queries.refusals[1] = Unavailable("no", code="admission_rejected", extra={"retry_after_s": 2.0})
    with pytest.raises(Unavailable) as err:
        await _run(_request([1, 1]), queries)
    exc = err.value
    assert exc.code == "admission_rejected" and exc.field == "stages[1]"
    assert exc.extra["retry_after_s"] == 2.0 and exc.extra["stage"] == 1
    assert len(exc.extra["stages"]) == 1 and exc.message == "stage 1: no"


async def test_unpickable_targets_name_the_stage_before_anything_runs() -> None:
    queries = FakeQueries([])
    with pytest.raises(BadRequest) as err:
        await _run(_request([1, 5]), queries)
    assert err.value.field == "stages[1].targets.fanout" and queries.ran == []
