"""The gateway's query path: plan, stamp deadlines, dispatch, gather, answer.

The shell around the pure parts (CdfBook, DeadlineEstimator, the admission gate): it
turns a validated request into k_f tasks with TailGuard deadlines on the links the
server registry picks, and their outcomes into a `QueryAnswer` whose `QueryOutcome` the
HTTP shell (gateway.app) maps to a status. It learns every task's fate through the link
callbacks (`on_result`, `on_failure`, `on_dequeue`), which feed the CDF book, the
admission gate, the autoscaler and the metrics. Under the predictive admission rule (or
with `wait_estimates`) each target's queue wait is estimated before dispatch
(`gateway.waits`, QLM §6), kept on its task, and compared with the actual wait when the
result comes back. In a pool with ``dispatch = "retry"`` a task its server sends back busy
is sent to another random server of the pool after the pool's Δ (`BusyRetry`, Swayam §4.5).

Lifecycle: ``drain`` stops admitting (new queries get 503 ``draining``) and waits for the
queries in flight, each of which already ends by its SLO plus the grace, so a stopping
gateway answers every query it took.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from admission import AdmissionGate, QueryInfo, WaitEstimate, meet_probability
from admission.groups import RATE_WINDOW_SERVICES, ArrivalRates, RequestGroups
from admission.waiting import (
    NO_WAIT,
    LogCdf,
    ServiceMoments,
    overtake_window,
    with_overtaking,
)
from gateway.cdf import CdfBook
from gateway.config import GatewayConfig
from gateway.deadlines import DeadlineEstimator, DeadlinePlan, SloUnreachable
from gateway.deferral import DeferralQueue
from gateway.errors import ApiError, SloUnreachableError, Unavailable
from gateway.fanout import new_tasks
from gateway.links import LinkDown, TaskLink, TaskReport
from gateway.metrics import GatewayMetrics
from gateway.overload import PREDICTED_MISS, admit
from gateway.queries import (
    CANCELLED,
    DROPPED,
    FAILED,
    LOST,
    OK,
    REJECTED,
    TIMEOUT,
    PendingTask,
    QueryOutcome,
    QueryRun,
    TaskOutcome,
    render_answer,
)
from gateway.requests import QueryRequest, Targets, check_task
from gateway.server_registry import ServerRegistry
from gateway.settle import Settled, settle
from gateway.targets import BusyRetry
from gateway.tenants import SHARE_REASON, Tenants
from gateway.tracing import Caller, GatewayTracer, QuerySpan
from gateway.waits import NewTask, largest_mean_ms, link_wait
from taskserver.abc import InvalidTask
from taskserver.wire import TaskStatus

_REJECTED = TaskStatus.REJECTED

GROUP_RATE_WINDOW_S = 10.0
"""GET /v1/groups: a group's arrival rate is weighted over this many seconds."""

if TYPE_CHECKING:
    from gateway.autoscaling import AutoscalerLoop

__all__ = ["DRAIN_MARGIN_S", "DrainReport", "QueryAnswer", "QueryPath"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueryAnswer:
    """How a query ended (`outcome`, see `gateway.queries.QueryOutcome`), its summary and
    every task's outcome. The HTTP status and headers are the shell's choice (gateway.app).

    The per-task part of the body is rendered on first access: the query is
    decided (outcome, metrics, CDFs) without it, and only the HTTP shell pays
    for decoding task results into the JSON answer.
    """

    outcome: QueryOutcome
    summary: dict[str, Any]
    outcomes: list[TaskOutcome]

    @property
    def body(self) -> dict[str, Any]:
        """The JSON answer: the summary plus every task's outcome."""
        return {**self.summary, "tasks": [o.to_json() for o in self.outcomes]}

    def render(self, **extra: Any) -> bytes:
        """`body` and then `extra`'s keys as JSON bytes, each distinct task result read once
        (gateway.queries.render_answer): what the HTTP shell sends."""
        return render_answer(self.summary, self.outcomes, extra)


DRAIN_MARGIN_S = 0.5
"""Beyond the drain bound: lets the queries' own SLO + grace timers fire first."""


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain did: queries in flight at its start, those the bound cut, its duration."""

    queries: int
    cut: int
    seconds: float


@dataclass(slots=True)
class _Placement:
    """Where the tasks of a query of a retry pool are now, for re-dispatch."""

    targets: Targets
    links: list[TaskLink]
    """links[i] holds task i now: the query's own list, which a retry updates in place, so
    that cancelling the query reaches whichever server holds each task."""
    tasks: list[PendingTask]
    """The query's tasks by index (one object per task, whichever server holds it)."""
    policy: BusyRetry


class QueryPath:
    """Fans queries out over the registry's servers and answers them."""

    def __init__(
        self,
        config: GatewayConfig,
        clock: Callable[[], float],
        servers: ServerRegistry,
        book: CdfBook,
        estimator: DeadlineEstimator,
        gate: AdmissionGate,
        metrics: GatewayMetrics,
        id_prefix: str,
    ) -> None:
        self.config = config
        self.clock = clock
        self.links = servers.links
        self.targets = servers.targets
        self.book = book
        self.estimator = estimator
        self.gate = gate
        self.metrics = metrics
        self.autoscaler: AutoscalerLoop | None = None
        """Told every task's miss (set when the gateway enables autoscaling)."""
        self.tracer: GatewayTracer | None = None
        """Spans of queries and tasks (set when tracing is on; gateway.tracing)."""
        self._retry = {p.name: r for p in config.pools if (r := BusyRetry.of(p)) is not None}
        """Pools with dispatch = "retry" -> their policy (Swayam §4.5)."""
        self._placed: dict[str, _Placement] = {}
        """Queries in flight on a retry pool, by id: where their tasks are."""
        self._ids = itertools.count(1)
        self._id_prefix = id_prefix
        self._inflight: dict[str, QueryRun] = {}
        self.draining = False
        """Stopping: new queries get 503 `draining`; those in flight finish."""
        self._drain_ends_s = 0.0
        """While draining: when the drain bound passes (clock time)."""
        self._active = 0
        """Queries inside run_query (admission included)."""
        self._idle = asyncio.Event()
        """Set while no query is inside run_query (what drain waits for)."""
        self._idle.set()
        self._cut: set[str] = set()
        """Queries the drain bound ended before their own deadline."""
        self.groups = RequestGroups(GROUP_RATE_WINDOW_S)
        """Request groups (QLM §4): arrivals, cost and outstanding tasks (GET /v1/groups)."""
        self._group_rates: dict[str, ArrivalRates] = {}
        """Per server: each request group's task arrival rate (per second)."""
        self._group_keys: dict[tuple[str, int], tuple[float, float, int]] = {}
        """Per request group (class, fanout): its last (T_b ms, SLO ms, priority)."""
        self._wait_estimates = config.wait_estimates
        """Estimate every task's queue wait even when admission does not read it."""
        self.deferrals = DeferralQueue(config.allocation)
        """Deferred queries, asked again in the allocation layer's order."""
        self.tenants = Tenants(
            config.allocation,
            gate,
            lambda: AdmissionGate(config.admission, config.classes, clock),
        )
        """The allocation layer: flows' shares of admission and of central queues."""

    def resolve(self, req: QueryRequest) -> list[TaskLink]:
        """The k_f target servers of a query (TailGuard §III.B: the handler picks them),
        with its task checked for what they run (400 naming `task.<field>`)."""
        links = self.targets.pick(req.targets)
        check_task(req.payload, (lk.executor for lk in links))
        return links

    def plan(self, req: QueryRequest, links: list[TaskLink]) -> DeadlinePlan:
        """x_p^u over exactly these servers and the task budget (TailGuard eq. (1)-(4))."""
        try:
            plan = self.estimator.plan([lk.server_id for lk in links], req.percentile, req.slo_ms)
        except SloUnreachable as exc:
            raise SloUnreachableError(
                f"SLO {exc.slo_ms:g} ms is below the unloaded p{exc.percentile:g} latency "
                f"{exc.unloaded_ms:.3f} ms for fanout {exc.fanout}",
                field="slo.latency_ms" if req.class_name is None else "class",
                extra={
                    "slo_ms": exc.slo_ms,
                    "unloaded_latency_ms": round(exc.unloaded_ms, 4),
                    "percentile": exc.percentile,
                    "fanout": exc.fanout,
                },
            ) from exc
        self.metrics.set_unloaded(req.class_name or "custom", len(links), plan.unloaded_ms)
        return plan

    async def run_query(
        self, req: QueryRequest, t0: float | None = None, caller: Caller | None = None
    ) -> QueryAnswer:
        """Fan a validated query out and answer it; never later than SLO + grace. With
        tracing on it is one span (a child of the caller's trace) with a span per task."""
        if self.draining:
            self.metrics.queries.labels(req.class_name or "custom", "rejected").inc()
            # Retry-After: when the drain bound passes this replica is gone and its address
            # (a Service, a load balancer) serves another one.
            left_s = max(self._drain_ends_s - self.clock(), 0.0)
            raise Unavailable(
                "the gateway is shutting down and admits no new query; send it to another replica",
                code="draining",
                extra={"retry_after_s": round(left_s, 3)},
            )
        self._active += 1
        self._idle.clear()
        try:
            if self.tracer is None:
                return await self._run_query(req, t0, None)
            return await self._run_traced(self.tracer, req, t0, caller)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def _run_traced(
        self, tracer: GatewayTracer, req: QueryRequest, t0: float | None, caller: Caller | None
    ) -> QueryAnswer:
        """`_run_query` inside the query's span, which ends with the query's outcome."""
        t0 = self.clock() if t0 is None else t0
        span = tracer.query(caller, t0, req.slo_ms)
        try:
            answer = await self._run_query(req, t0, span)
        except ApiError as exc:
            span.end(exc.code, exc.message)
            raise
        except BaseException:
            span.end("cancelled", "the query did not complete (client went away or a bug)")
            raise
        error = answer.summary.get("error")
        span.end(answer.outcome.value, None if error is None else error["message"])
        return answer

    async def _run_query(
        self, req: QueryRequest, t0: float | None, span: QuerySpan | None
    ) -> QueryAnswer:
        t0 = self.clock() if t0 is None else t0
        cls = req.class_name or "custom"
        links = self.resolve(req)
        if self.autoscaler is not None:
            self.autoscaler.record_arrival(len(links), links[0].pool)
        plan = self.plan(req, links)
        down = [lk for lk in links if not lk.is_up]
        if down:
            self.metrics.queries.labels(cls, "rejected").inc()
            raise self._unreachable(down)
        deadline_s = t0 + plan.budget_ms / 1000.0  # TailGuard eq. (4): t_D = t0 + T_b
        slo_deadline_s = t0 + req.slo_ms / 1000.0
        flow = self.tenants.flow_of(req.tenant, cls)
        # client-side-scheduling's cost prior, k_f * x_p^u, unless the client gives its own.
        cost_ms = req.cost_hint_ms or max(len(links) * plan.unloaded_ms, 1e-6)
        task_cost = cost_ms / len(links)
        new = NewTask(
            deadline_s, slo_deadline_s, req.priority, plan.budget_ms, req.slo_ms, flow, task_cost
        )
        waits = await self._admit_shared(req, cls, flow, cost_ms, links, plan, new, t0)
        if waits is None and self._wait_estimates:
            waits = self.estimate_waits(links, new)
        qid = f"{self._id_prefix}-{next(self._ids)}"
        run = QueryRun(qid, len(links), t0)
        if span is not None:
            span.describe(cls, links[0].pool, len(links), qid)
        retry = self._retry.get(req.targets.pool) if req.targets.pool is not None else None
        placement = None
        if retry is not None:
            placement = self._placed[qid] = _Placement(req.targets, links, [], retry)
        run.group = RequestGroups.key(cls, links[0].pool, cost_ms)
        if self.autoscaler is not None:
            self.autoscaler.record_query(req.percentile, req.slo_ms, len(links), links[0].pool)
        self.groups.admitted(run.group, cost_ms, len(links), t0)
        self._inflight[qid] = run
        self.metrics.inflight += 1
        try:
            tasks = new_tasks(
                run, links, deadline_s, slo_deadline_s, req.priority, cls, req.payload, waits,
                flow, task_cost,
            )  # fmt: skip
            for i, link in enumerate(links):
                p = tasks[i]
                if placement is not None:
                    placement.tasks.append(p)
                if span is not None:
                    p.trace = span.task(i, link.server_id, plan.budget_ms)
                try:
                    link.dispatch(p)
                except LinkDown as exc:
                    if p.trace is not None:
                        p.trace.end(LOST, link.server_id, 0, error=str(exc))
                    run.complete(i, TaskOutcome(link.server_id, LOST, error=str(exc)), self.clock())
                    break
            run.t_sent = self.clock()
            if waits is not None:
                self._arrived(links, (cls, len(links)), new, run.t_sent)
            # Never later than SLO + grace: a timer at the SLO (which reports the violation,
            # and with prune_late ends the query there), then one at SLO + grace.
            run.timer = asyncio.get_running_loop().call_later(
                max(slo_deadline_s - self.clock(), 0.0), self._slo_passed, run, links[0].pool
            )
            try:
                await run.done
            except asyncio.CancelledError:
                self._abandon(run, links, "client went away", span)
                raise
            finally:
                if run.timer is not None:
                    run.timer.cancel()
            if run.expired or run.failed:
                dropped = any(o is not None and o.status == DROPPED for o in run.outcomes)
                reason = (
                    "query timed out"
                    if run.expired
                    else "a sibling task was dropped"
                    if dropped
                    else "a sibling task failed"
                )
                if qid in self._cut:
                    reason = "the gateway stopped before the query completed"
                cancelled = self._abandon(run, links, reason, span)
                if dropped and not run.expired:
                    # PARD: no server keeps computing for a query that is already lost.
                    for pool, n in cancelled.items():
                        self.metrics.saved_tasks.labels(pool).inc(n)
        finally:
            self._inflight.pop(qid, None)
            self._placed.pop(qid, None)
            self.metrics.inflight -= 1
        return self._answer(req, run, plan, links)

    async def _admit_shared(
        self,
        req: QueryRequest,
        cls: str,
        flow: str,
        cost_ms: float,
        links: list[TaskLink],
        plan: DeadlinePlan,
        new: NewTask,
        t0: float,
    ) -> list[WaitEstimate] | None:
        """Admission by the rule (`_admit`), then by the allocation layer's share: a refusal
        on the pool-wide signal may move to the flow served most per weight, and a flow
        that owes such moves is refused in their place (gateway.tenants)."""
        tenants = self.tenants
        gate = tenants.gate_of(flow)
        if tenants.config.protected:
            tenants.note_congestion(gate.pressure().miss_ratio, gate.controller.threshold)
        try:
            waits = await self._admit(gate, req, cls, links, plan, new, t0, cost_ms)
        except Unavailable as exc:
            reason = str(exc.extra.get("reason", ""))
            if tenants.gates:
                exc.extra["flow"] = flow  # judged on its own tasks' miss ratio
            movable = (
                tenants.share is not None
                and exc.code == "admission_rejected"
                and reason != PREDICTED_MISS  # the query's own prediction, not the pool's load
            )
            if not (movable and tenants.decide(flow, cost_ms, False, self.clock())):
                self._refused(cls, flow, reason)
                raise
            return None
        if not tenants.decide(flow, cost_ms, True, self.clock()):
            self._refused(cls, flow, SHARE_REASON)
            assert tenants.share is not None
            debt = tenants.share.flows[flow].debt
            raise Unavailable(
                f"admission control refused the query for the allocation share: {flow!r} was "
                f"admitted the most per weight while queries of other flows were refused under "
                f"overload, and owes {debt:.4g} ms of cost to them",
                code="admission_rejected",
                extra={"reason": SHARE_REASON, "flow": flow, "debt_ms": debt, "class": cls},
            )
        return waits

    def _refused(self, cls: str, flow: str, reason: str) -> None:
        self.metrics.queries.labels(cls, "rejected").inc()
        self.metrics.admission_rejected(cls, reason)
        self.tenants.refused(flow, reason)

    async def _admit(
        self,
        gate: AdmissionGate,
        req: QueryRequest,
        cls: str,
        links: list[TaskLink],
        plan: DeadlinePlan,
        new: NewTask,
        t0: float,
        cost_ms: float,
    ) -> list[WaitEstimate] | None:
        """Admission (TailGuard §III.D; QLM §6 for the predictive rule): may hold the query
        (DEFER, in the deferral queue) or refuse it (503); returns the targets' wait
        estimates it read, if any."""
        if gate.clearly_admitted():
            return None
        # A DEFER holds it in the deferral queue (built here: most queries never get this far).
        sleep = self.deferrals.sleeper(new.flow, cost_ms, new.slo_deadline_s)
        info = QueryInfo(
            cls,
            req.priority,
            len(links),
            req.slo_ms,
            plan.unloaded_ms,
            percentile=req.percentile,
            cost_hint_ms=req.cost_hint_ms,
        )
        if not gate.needs_wait:
            await admit(gate, info, self._queue_pressure, sleep)
            return None
        waits: list[WaitEstimate] = []

        def predict(q: QueryInfo) -> QueryInfo:
            # Asked again after each deferral: the queues and the slack have moved since.
            waits[:] = self.estimate_waits(links, new)
            meet = self.meet_probability(links, waits, t0, req.slo_ms)
            return replace(q, meet_prob=meet, wait_ms=largest_mean_ms(waits))

        await admit(gate, predict(info), self._queue_pressure, sleep, rewait=predict)
        return waits

    def estimate_waits(self, links: list[TaskLink], new: NewTask) -> list[WaitEstimate]:
        """Each target's queue wait for a task with these keys dispatched now (QLM §6), with
        the work of later arrivals that will overtake it in the server's order."""
        now = self.clock()
        book = self.book
        out: list[WaitEstimate] = []
        for lk in links:
            if not book.has_server(lk.server_id):
                out.append(NO_WAIT)  # deregistered meanwhile (a deferral): its task fails as lost
                self._group_rates.pop(lk.server_id, None)
                continue
            moments = partial(book.moments, lk.server_id)
            e = link_wait(lk, new, now, moments)
            rates = self._group_rates.get(lk.server_id)
            if rates is not None and (e.mean_ms or e.sd_ms):
                e = self._overtaken(lk, e, new, now, rates, moments())
            out.append(e)
        return out

    def _overtaken(
        self,
        lk: TaskLink,
        e: WaitEstimate,
        new: NewTask,
        now: float,
        rates: ArrivalRates,
        m: ServiceMoments,
    ) -> WaitEstimate:
        """`e` plus the tasks that will arrive while it waits and go ahead of it
        (admission.waiting.with_overtaking, beyond QLM), from the link's group rates."""
        policy = str(lk.policy)
        mine = (new.budget_ms, new.slo_ms, new.priority)
        keys = self._group_keys
        overtakers = [
            (rate / 1000.0, overtake_window(policy, mine, keys[g]), m)  # rate: per ms
            for g, rate in rates.rates(now)
        ]
        return with_overtaking(e, overtakers, lk.slots)

    def _arrived(
        self, links: list[TaskLink], group: tuple[str, int], new: NewTask, now: float
    ) -> None:
        """A query of request group (class, fanout) reached these servers: their group
        arrival rates (QLM §4's groups, what overtaking needs), weighted over
        RATE_WINDOW_SERVICES of each server's mean service time."""
        self._group_keys[group] = (new.budget_ms, new.slo_ms, new.priority)
        book = self.book
        for lk in links:
            rates = self._group_rates.get(lk.server_id)
            if rates is None:
                if not book.has_server(lk.server_id):
                    continue
                tau_s = RATE_WINDOW_SERVICES * book.moments(lk.server_id).mean_ms / 1000.0
                rates = self._group_rates[lk.server_id] = ArrivalRates(tau_s)
            rates.add(group, now)

    def meet_probability(
        self, links: list[TaskLink], waits: list[WaitEstimate], t0: float, slo_ms: float
    ) -> float:
        """P(every task's wait plus post-queuing time fits in what is left of the SLO)."""
        book = self.book
        rows: dict[int, tuple[LogCdf, list[WaitEstimate]]] = {}
        for lk, w in zip(links, waits, strict=True):
            if not book.has_server(lk.server_id):
                continue
            key = book.row_key(lk.server_id)
            row = rows.get(key)
            if row is None:
                row = rows[key] = (book.cdf_of(lk.server_id).log_cdf, [])
            row[1].append(w)
        slack_ms = slo_ms - (self.clock() - t0) * 1000.0
        return meet_probability(rows.values(), slack_ms)

    def _slo_passed(self, run: QueryRun, pool: str) -> None:
        """The query is still running at its SLO: an SLA violation, which the autoscaler
        hears at once (Swayam Algorithm 1, lines 4-5); with `prune_late` the query ends
        now (line 6, request pruning), else at SLO + grace."""
        if run.done.done():
            return
        if self.autoscaler is not None:
            self.autoscaler.note_violation(pool)
        if self.config.prune_late:
            run.expire()
        else:
            run.timer = asyncio.get_running_loop().call_later(
                self.config.grace_ms / 1000.0, run.expire
            )

    def _abandon(
        self, run: QueryRun, links: list[TaskLink], reason: str, span: QuerySpan | None = None
    ) -> dict[str, int]:
        """Cancel every task of the query that has no outcome yet; how many, per pool."""
        timed_out = run.expired and run.query_id not in self._cut
        cancelled: dict[str, int] = {}
        placed = self._placed.get(run.query_id)
        for i, link in enumerate(links):
            if run.outcomes[i] is None:
                link.cancel_query(run.query_id)
                status = TIMEOUT if timed_out else CANCELLED
                outcome = TaskOutcome(link.server_id, status, error=reason)
                if placed is not None and i < len(placed.tasks):
                    outcome.retries = placed.tasks[i].retries
                run.outcomes[i] = outcome
                if span is not None:
                    span.end_task(i, status, link.server_id, outcome.retries, reason)
                self.metrics.task_done(link.pool, status)
                cancelled[link.pool] = cancelled.get(link.pool, 0) + 1
                if run.group is not None:
                    self.groups.task_done(run.group, None)
        return cancelled

    def _answer(
        self, req: QueryRequest, run: QueryRun, plan: DeadlinePlan, links: list[TaskLink]
    ) -> QueryAnswer:
        now = self.clock()
        latency_ms = (now - run.t0) * 1000.0
        cls = req.class_name or "custom"
        outcomes = [o for o in run.outcomes if o is not None]
        statuses = {o.status for o in outcomes}
        body: dict[str, Any] = {
            "query_id": run.query_id,
            "class": req.class_name,
            "percentile": req.percentile,
            "slo_ms": req.slo_ms,
            "fanout": run.fanout,
            "budget_ms": round(plan.budget_ms, 4),
            "unloaded_latency_ms": round(plan.unloaded_ms, 4),
            "estimate": plan.estimate,
            "latency_ms": round(latency_ms, 4),
            "met_slo": statuses == {OK} and latency_ms <= req.slo_ms,
            # The gateway's own share of the latency: request to last task handed to the wire,
            # and deciding outcome to answer (the rest is the wire and the servers).
            "dispatch_ms": round((run.t_sent - run.t0) * 1000.0, 4),
            "merge_ms": round((now - run.t_last) * 1000.0, 4) if not run.expired else 0.0,
        }
        if statuses == {OK}:
            outcome = QueryOutcome.MET if body["met_slo"] else QueryOutcome.MISSED_SLO
            self.gate.record_query(cls, latency_ms, req.slo_ms)
            if self.tenants.gates:
                flow = self.tenants.flow_of(req.tenant, cls)
                self.tenants.record_query(flow, cls, latency_ms, req.slo_ms)
            self.metrics.query_answered(cls, run.fanout, latency_ms)
        else:
            bad = [o for o in outcomes if o.status not in (OK, CANCELLED)]
            first = bad[0] if bad else outcomes[0]
            field: str | None = None
            dropped = [o for o in outcomes if o.status == DROPPED]
            if dropped:
                # Dropped because it could not meet its deadline: like an overload rejection,
                # retrying later may succeed.
                outcome, code = QueryOutcome.DROPPED, "task_dropped"
                message = f"task on server {dropped[0].server} dropped: {dropped[0].error}"
                body["cancelled_siblings"] = sum(1 for o in outcomes if o.status == CANCELLED)
            elif run.query_id in self._cut:
                outcome, code = QueryOutcome.DRAINING, "draining"
                message = "the gateway stopped before the query completed (drain bound reached)"
            elif TIMEOUT in statuses:
                outcome, code = QueryOutcome.TIMEOUT, "query_timeout"
                message = (
                    f"query not complete at its SLO ({req.slo_ms:g} ms): pruned (prune_late)"
                    if self.config.prune_late
                    else f"query not complete at SLO + grace "
                    f"({req.slo_ms:g} + {self.config.grace_ms:g} ms)"
                )
            elif bad and all(o.status == REJECTED for o in bad):
                outcome, code = QueryOutcome.REJECTED, "task_rejected"
                message = f"server {first.server} rejected its task: {first.error}"
            elif bad and (invalid := _invalid(bad)) is not None:
                # The server judged the client's payload (what the gateway could not check):
                # a client error naming the field, not a server's failure.
                outcome, code = QueryOutcome.INVALID, "invalid_task"
                message = f"server {first.server} refused the task: {invalid}"
                field = "task" if invalid.field == "payload" else f"task.{invalid.field}"
            else:
                outcome, code = QueryOutcome.FAILED, "task_failed"
                message = f"task on server {first.server} {first.status}: {first.error}"
            body["error"] = {"code": code, "message": message, "field": field}
        self.metrics.count_query(cls, outcome.metric)
        return QueryAnswer(outcome, body, outcomes)

    def _unreachable(self, down: list[TaskLink]) -> Unavailable:
        """503 for targets that take no task now, naming the owner of a central pool."""
        ids = [lk.server_id for lk in down]
        owned = [lk for lk in down if lk.owned_elsewhere is not None]
        if owned:
            owners = sorted({str(lk.owned_elsewhere) for lk in owned})
            pools = sorted({lk.pool for lk in owned})
            return Unavailable(
                f"pool {', '.join(pools)} is owned by gateway {', '.join(owners)}: with central "
                "queueing one gateway at a time sends to its servers; use that gateway",
                code="pool_owned_elsewhere",
                extra={
                    "owner": owners[0],
                    "servers_owned_elsewhere": [lk.server_id for lk in owned],
                },
            )
        extra: dict[str, Any] = {"servers_down": ids}
        back_s = self.targets.back_of(down, len(down))  # every one of them is needed
        if back_s is not None:
            extra["retry_after_s"] = round(back_s, 3)  # the 503's Retry-After (gateway.app)
        return Unavailable(
            f"{len(ids)} target server(s) are not reachable: {', '.join(ids[:10])}",
            code="servers_down",
            extra=extra,
        )

    def drain_bound_s(self) -> float:
        """Longest a query already admitted may still run: the largest class SLO plus grace."""
        return (max(c.latency_ms for c in self.config.classes) + self.config.grace_ms) / 1000.0

    async def drain(self, timeout_s: float | None = None) -> DrainReport:
        """Admit nothing new; wait for the queries in flight, at most timeout_s.

        Each query ends by itself at its SLO plus grace, so with class SLOs the default bound
        (drain_bound_s) is never reached; a query with a longer custom SLO still running at
        the bound is answered 503 `draining` and its tasks are cancelled.
        """
        bound_s = self.drain_bound_s() + DRAIN_MARGIN_S if timeout_s is None else timeout_s
        start = self.clock()
        self._drain_ends_s = start + bound_s
        self.draining = True
        in_flight = self._active
        log.info("draining: no new queries; %d in flight (bound %.1f s)", in_flight, bound_s)
        if not await self._wait_idle(bound_s):
            for qid, run in list(self._inflight.items()):
                self._cut.add(qid)
                run.expire()
            await self._wait_idle(DRAIN_MARGIN_S)
        return DrainReport(in_flight, len(self._cut), self.clock() - start)

    async def _wait_idle(self, timeout_s: float) -> bool:
        """Wait until no query is in run_query; False on timeout."""
        if self._idle.is_set():
            return True  # wait_for with a timeout <= 0 would not even start the wait
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _queue_pressure(self) -> float:
        """Tasks waiting beyond the servers' slots, per slot (0: nothing queued)."""
        # Read only when the admission rule declares it needs it (admission.Signal).
        slots = sum(lk.slots for lk in self.links.values()) or 1
        waiting = sum(max(len(lk.outstanding) - lk.slots, 0) for lk in self.links.values())
        return waiting / slots

    def on_result(self, link: TaskLink, p: PendingTask, r: TaskReport, now: float) -> None:
        """A task's result came back (`on_results` with one)."""
        self.on_results(link, [(p, r)], now)

    def on_results(
        self, link: TaskLink, batch: list[tuple[PendingTask, TaskReport]], now: float
    ) -> None:
        """Results that came back together from one server (a frame): recorded at once; in
        a retry pool, a busy refusal sends its task to another server instead (Swayam §4.5)."""
        if self._placed:
            batch = [
                (p, r)
                for p, r in batch
                if r.status is not _REJECTED or not self._retry_busy(link, p, r, now)
            ]
        self._record(link, batch, now)

    def _retry_busy(self, link: TaskLink, p: PendingTask, r: TaskReport, now: float) -> bool:
        """Whether this refusal is taken care of by a retry (or left to the SLO timer): a
        busy refusal of a retry-pool task, before the SLO, with another server to try. The
        refused try carries no service sample, so nothing of it reaches the CDF book, the
        miss-ratio windows or the task counts."""
        placed = self._placed.get(p.run.query_id)
        if placed is None or p.run.done.done():
            return False
        decision = placed.policy.decide(r.error, now, p.slo_deadline_s)
        if decision.action == "fail":
            return False
        used = {lk.server_id for lk in placed.links}
        if self.targets.replacement(placed.targets, link, p.run.query_id, used) is None:
            return False  # no other server can take it: the refusal stands, as today
        if decision.action == "hold":
            return True  # unplaced: the query ends at its SLO (_slo_passed)
        asyncio.get_running_loop().call_later(
            decision.at_s - now, self._redispatch, placed, p, link, r, now
        )
        return True

    def _redispatch(
        self, placed: _Placement, p: PendingTask, refused: TaskLink, r: TaskReport, at_s: float
    ) -> None:
        """Δ after `refused` sent task `p` back busy at `at_s`: send it to another random
        server of its pool (Swayam §4.5). The link stamps the budgets left at send time
        from the task's own t_D and SLO, so the retry carries what remains of them."""
        run = p.run
        if run.done.done() or run.outcomes[p.index] is not None:
            return  # the query ended meanwhile (a sibling failed, timed out, cancelled)
        if self.clock() >= p.slo_deadline_s:
            return  # its SLO passed: the query ends as at its SLO (_slo_passed)
        used = {lk.server_id for lk in placed.links}
        new = self.targets.replacement(placed.targets, refused, run.query_id, used)
        if new is None:  # the last one left took another task of the query meanwhile
            self._record(refused, [(p, r)], at_s)
            return
        p.retries += 1
        p.server_id = new.server_id
        p.est_wait_ms = None  # estimated for the server that refused it
        placed.links[p.index] = new
        self.metrics.task_retries.labels(new.pool).inc()
        if p.trace is not None:
            p.trace.retried(new.server_id)
        try:
            new.dispatch(p)
        except LinkDown as exc:
            self.on_failure(new, p, LOST, str(exc))

    def _record(
        self, link: TaskLink, batch: list[tuple[PendingTask, TaskReport]], now: float
    ) -> None:
        """Tasks' outcomes from one server: into their queries, and into the CDF book, the
        miss windows and the metrics once for the batch (a frame of results, not a task)."""
        central = link.central
        server_id, pool = link.server_id, link.pool
        metrics, groups = self.metrics, self.groups
        statuses, post_queue, by_class, by_group = self._settle(link, batch, now)
        for status, n in statuses.items():
            metrics.tasks_done(pool, status, n)
        if post_queue:
            self.book.observe_many(server_id, post_queue)
            misses = 0
            for cls, (missed_n, n) in by_class.items():
                if not central:
                    # TailGuard §III.D: the miss flag comes back with the result (central
                    # queueing counted it at the dequeue, on_dequeue).
                    self.gate.note_tasks(missed_n, n, cls)
                if missed_n:
                    metrics.deadlines_missed(cls, pool, missed_n)
                misses += missed_n
            if self.autoscaler is not None:
                self.autoscaler.record_tasks(misses, len(post_queue), pool)
            metrics.server_windows.tasks(server_id, pool, len(post_queue), misses)
        for group, (ended_n, service_sum, ran_n) in by_group.items():
            groups.tasks_done(group, int(ended_n), service_sum, int(ran_n))

    def _settle(
        self, link: TaskLink, batch: list[tuple[PendingTask, TaskReport]], now: float
    ) -> Settled:
        """Each task's outcome into its query, and the frame's counts (gateway.settle)."""
        central = link.central
        return settle(
            batch,
            now,
            central,
            bool(self.tenants.gates) and not central,
            link.server_id,
            link.pool,
            self.metrics,
            self.tenants,
        )

    def on_dequeue(self, link: TaskLink, p: PendingTask) -> None:
        """Central queueing: a task left this gateway's queue; its miss is known now."""
        self.gate.note_task(bool(p.missed_deadline), p.class_name)
        if self.tenants.gates:
            self.tenants.note_task(p.flow, bool(p.missed_deadline), p.class_name)

    def on_failure(self, link: TaskLink, p: PendingTask, status: str, reason: str) -> None:
        """A task ended without a result (its server was lost, a bad result, a rejection in
        the link's own queue)."""
        self.metrics.task_done(link.pool, status)
        outcome = TaskOutcome(link.server_id, status, error=reason, retries=p.retries)
        if p.trace is not None:
            p.trace.end(status, link.server_id, p.retries, error=reason)
        p.run.complete(p.index, outcome, self.clock())
        if p.run.group is not None:
            self.groups.task_done(p.run.group, None)


def _invalid(bad: list[TaskOutcome]) -> InvalidTask | None:
    """The InvalidTask the failed tasks report when each of them reports one (the first)."""
    found = [InvalidTask.from_wire(o.error) if o.status == FAILED else None for o in bad]
    return found[0] if found and all(f is not None for f in found) else None
