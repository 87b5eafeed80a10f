"""Multi-query requests (POST /v1/requests): M fanout queries in a row under one SLO.

TailGuard §III.C, eq. (5): a request whose M queries run one after another meets its SLO
when the sum of their latencies does, so its budget is additive over its queries. At arrival
the request's every stage gets its servers (`resolve`) and x_p^u over exactly them (u_j,
eq. (2)); a request whose SLO is not above sum_j u_j cannot meet it even on idle servers
and is refused as a query would be (422). Then the stages run one after another, each as an
ordinary query through the query path on the servers picked for it at arrival: each goes
through admission control (it may be deferred or refused like any query), gets its task
budgets from its own SLO (eq. (4)), counts in the metrics as one query, and ends by its SLO
plus the grace. A stage's SLO never reaches past the request's, so a request, too, ends by
its SLO plus the grace. Just before stage s starts, its SLO is
``stage_slo_ms(rule, R, [u_s, ..., u_M])`` (gateway.stages) with R the request's SLO less
the time spent since it arrived; the u_j are read again then, from the CDFs as the earlier
stages' results have moved them, so the stage's own plan agrees with its assignment.

A request ends at the first stage that does not end in success; it answers with that
stage's outcome, and its body lists the stages run so far::

    SloUnreachableError  422  the request's SLO is not above the sum of its stages' x_p^u
    Unavailable          503  request_budget_exhausted: a stage's assigned SLO is not above
                              its x_p^u (the earlier stages spent too much of the SLO)
    ApiError             any  a stage refused before it ran (admission, servers down,
                              draining): the query's error, naming the stage
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from gateway.errors import ApiError, SloUnreachableError, Unavailable
from gateway.queries import QueryOutcome
from gateway.requests import MultiQueryRequest, QueryRequest, Targets
from gateway.stages import stage_slo_ms
from gateway.tracing import Caller, GatewayTracer
from taskserver.tracecontext import parse_traceparent

if TYPE_CHECKING:
    from gateway.deadlines import DeadlinePlan
    from gateway.links import TaskLink
    from gateway.query_path import QueryAnswer

__all__ = ["QueryRunner", "RequestAnswer", "RequestPath", "StageBudget", "assign_stage"]

_SUCCESS = (QueryOutcome.MET, QueryOutcome.MISSED_SLO)
"""Stage outcomes after which the request goes on: every task OK."""


@dataclass(frozen=True, slots=True)
class StageBudget:
    """What a stage about to start gets from what is left of its request's SLO."""

    remaining_ms: float
    """R: the request's SLO less the time spent since it arrived."""
    slo_ms: float
    """The stage's own SLO, x_s^SLO (gateway.stages)."""
    unloaded_ms: float
    """u_s: the stage's x_p^u over its servers."""
    later_unloaded_ms: float
    """sum of u_j over the stages after it."""

    @property
    def exhausted(self) -> bool:
        """Not even idle servers could meet the stage's SLO (every rule: R <= sum_{j>=s} u_j)."""
        return not self.slo_ms > self.unloaded_ms


def assign_stage(
    rule: str, request_slo_ms: float, spent_ms: float, unloaded_ms: Sequence[float]
) -> StageBudget:
    """The budget of the stage about to start `spent_ms` after its request arrived;
    `unloaded_ms` holds u_j of it and of every later stage, in order (TailGuard eq. (5))."""
    remaining_ms = request_slo_ms - spent_ms
    slo_ms = stage_slo_ms(rule, remaining_ms, unloaded_ms)
    return StageBudget(remaining_ms, slo_ms, unloaded_ms[0], sum(unloaded_ms[1:]))


class QueryRunner(Protocol):
    """The query path as a request uses it (GatewayService and QueryPath are both one)."""

    clock: Callable[[], float]

    def resolve(self, req: QueryRequest) -> list[TaskLink]:
        """The query's target servers."""
        ...

    def plan(self, req: QueryRequest, links: list[TaskLink]) -> DeadlinePlan:
        """x_p^u over exactly these servers; SloUnreachableError when req's SLO is not above."""
        ...

    async def run_query(
        self, req: QueryRequest, t0: float | None = None, caller: Caller | None = None
    ) -> QueryAnswer:
        """Run one query from t0 and answer it by its SLO plus the grace."""
        ...


@dataclass(frozen=True, slots=True)
class RequestAnswer:
    """How a request ended and its JSON answer.

    `outcome` is MET or MISSED_SLO when every stage succeeded (by the request's latency
    against its SLO), else the outcome of the stage that ended the request; the HTTP status
    is the shell's choice, as for a query.
    """

    outcome: QueryOutcome
    body: dict[str, Any]


class RequestPath:
    """Runs multi-query requests as sequences of queries on the query path."""

    def __init__(
        self, queries: QueryRunner, id_prefix: str, tracer: GatewayTracer | None = None
    ) -> None:
        self.queries = queries
        self._ids = itertools.count(1)
        self._id_prefix = id_prefix
        self.tracer = tracer
        """With tracing on, a request is a span whose stages' query spans are its children."""

    async def run(
        self, req: MultiQueryRequest, t0: float | None = None, caller: Caller | None = None
    ) -> RequestAnswer:
        """`_run`, inside the request's span when tracing is on (`caller`: the HTTP request's
        id and trace context)."""
        if self.tracer is None:
            return await self._run(req, t0, caller)
        t0 = self.queries.clock() if t0 is None else t0
        span = self.tracer.request(caller, t0, req.slo_ms, len(req.stages))
        # The stages' query spans are children of the request's span.
        stage_caller = Caller(
            caller.request_id if caller is not None else "",
            parse_traceparent(span.traceparent),
            span.tracestate,
        )
        try:
            answer = await self._run(req, t0, stage_caller)
        except ApiError as exc:
            span.end(exc.code, exc.message)
            raise
        except BaseException:
            span.end("cancelled", "the request did not complete")
            raise
        error = answer.body.get("error")
        span.end(answer.outcome.value, None if error is None else error["message"])
        return answer

    async def _run(
        self, req: MultiQueryRequest, t0: float | None, caller: Caller | None
    ) -> RequestAnswer:
        """Run the request's stages one after another from t0 (its arrival) and answer it.

        Raises an ApiError, carrying the stages run so far, when the request cannot start
        (422), when a stage's budget is exhausted (503 ``request_budget_exhausted``) or when
        a stage is refused before it runs (its query's error, naming ``stages[s]``).
        """
        clock = self.queries.clock
        t0 = clock() if t0 is None else t0
        head: dict[str, Any] = {
            "request_id": f"{self._id_prefix}-{next(self._ids)}",
            "class": req.class_name,
            "percentile": req.percentile,
            "slo_ms": req.slo_ms,
            "stage_rule": req.stage_rule,
        }
        done: list[dict[str, Any]] = []

        def failed(exc: ApiError, stage: int) -> ApiError:
            return _in_stage(exc, stage, {**head, **_end(clock(), t0, done)})

        # Every stage's servers at arrival; each stage then runs on exactly those.
        stages: list[QueryRequest] = []
        links: list[list[TaskLink]] = []
        for s, stage in enumerate(req.stages):
            try:
                picked = self.queries.resolve(stage)
            except ApiError as exc:
                raise failed(exc, s) from exc
            links.append(picked)
            ids = tuple(lk.server_id for lk in picked)
            stages.append(replace(stage, targets=Targets(servers=ids)))
        unloaded = [self._unloaded_ms(st, lk) for st, lk in zip(stages, links, strict=True)]
        if not req.slo_ms > sum(unloaded):
            raise SloUnreachableError(
                f"SLO {req.slo_ms:g} ms is not above the sum of the stages' unloaded "
                f"p{req.percentile:g} latencies, {sum(unloaded):.3f} ms "
                f"({' + '.join(f'{u:.3f}' for u in unloaded)})",
                field="slo.latency_ms" if req.class_name is None else "class",
                extra={
                    **head,
                    **_end(clock(), t0, done),
                    "unloaded_latency_ms": round(sum(unloaded), 4),
                    "stages_unloaded_latency_ms": [round(u, 4) for u in unloaded],
                },
            )
        for s, stage in enumerate(stages):
            t_s = clock()
            if s:
                # The CDFs moved with the earlier stages' results (TailGuard §III.C.2).
                unloaded[s:] = [
                    self._unloaded_ms(st, lk) for st, lk in zip(stages[s:], links[s:], strict=True)
                ]
            budget = assign_stage(req.stage_rule, req.slo_ms, (t_s - t0) * 1000.0, unloaded[s:])
            if budget.exhausted:
                raise _exhausted(s, len(stages), req, budget, {**head, **_end(t_s, t0, done)})
            try:
                answer = await self.queries.run_query(
                    replace(stage, slo_ms=budget.slo_ms), t_s, caller
                )
            except ApiError as exc:
                raise failed(exc, s) from exc
            done.append(_stage_json(s, answer, budget, t_s - t0))
            if answer.outcome not in _SUCCESS:
                error = dict(answer.summary["error"])
                error["message"] = f"stage {s}: {error['message']}"
                # Under the stage: its own field when one is at fault (task.end), else itself.
                at = error["field"]
                error["field"] = f"stages[{s}].{at}" if at else f"stages[{s}]"
                body = {**head, **_end(clock(), t0, done), "error": error, "stage": s}
                return RequestAnswer(answer.outcome, body)
        body = {**head, **_end(clock(), t0, done)}
        met = body["latency_ms"] <= req.slo_ms
        body["met_slo"] = met
        return RequestAnswer(QueryOutcome.MET if met else QueryOutcome.MISSED_SLO, body)

    def _unloaded_ms(self, stage: QueryRequest, links: list[TaskLink]) -> float:
        """u_j: x_p^u of the stage over exactly its servers."""
        try:
            return self.queries.plan(stage, links).unloaded_ms
        except SloUnreachableError as exc:
            # Even the whole request's SLO is below this stage's x_p^u: the value is all we need.
            return float(exc.extra["unloaded_latency_ms"])


def _end(now: float, t0: float, done: list[dict[str, Any]]) -> dict[str, Any]:
    """The request's latency so far and its stages run; met only when it ends in success."""
    return {"latency_ms": round((now - t0) * 1000.0, 4), "met_slo": False, "stages": done}


def _stage_json(
    s: int, answer: QueryAnswer, budget: StageBudget, started_s: float
) -> dict[str, Any]:
    """A stage's entry in the request's answer: its assignment, its query's summary and tasks."""
    q = answer.body
    out: dict[str, Any] = {
        "stage": s,
        "query_id": q["query_id"],
        "slo_ms": round(budget.slo_ms, 4),
        "remaining_ms": round(budget.remaining_ms, 4),
        "budget_ms": q["budget_ms"],
        "unloaded_latency_ms": q["unloaded_latency_ms"],
        "estimate": q["estimate"],
        "started_ms": round(started_s * 1000.0, 4),
        "latency_ms": q["latency_ms"],
        "fanout": q["fanout"],
        "met_slo": q["met_slo"],
        "outcome": answer.outcome.value,
    }
    for key in ("error", "cancelled_siblings"):
        if key in q:
            out[key] = q[key]
    out["tasks"] = q["tasks"]
    return out


def _exhausted(
    s: int, m: int, req: MultiQueryRequest, budget: StageBudget, answer: dict[str, Any]
) -> Unavailable:
    """503: the SLO left cannot cover stage s and the stages after it even on idle servers."""
    needed = budget.unloaded_ms + budget.later_unloaded_ms
    which = f"stage {s}" if s == m - 1 else f"stages {s} to {m - 1}"
    return Unavailable(
        f"stage {s} cannot start: {max(budget.remaining_ms, 0.0):.3f} ms of the request's "
        f"{req.slo_ms:g} ms SLO remain, not above the unloaded p{req.percentile:g} latency "
        f"of {which}, {needed:.3f} ms",
        field=f"stages[{s}]",
        code="request_budget_exhausted",
        extra={
            **answer,
            "stage": s,
            "remaining_ms": round(budget.remaining_ms, 4),
            "stage_slo_ms": round(budget.slo_ms, 4),
            "unloaded_latency_ms": round(needed, 4),
        },
    )


def _in_stage(exc: ApiError, stage: int, answer: dict[str, Any]) -> ApiError:
    """The same error naming the stage it came from (its field under ``stages[s]``), with the
    request's answer so far in its body."""
    field = f"stages[{stage}]" if not exc.field else f"stages[{stage}].{exc.field}"
    extra = {**exc.extra, **answer, "stage": stage}
    message = f"stage {stage}: {exc.message}"
    return type(exc)(message, field=field, code=exc.code, extra=extra, headers=exc.headers)
