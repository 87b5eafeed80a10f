"""The discrete-event simulator: the live policy objects on a virtual clock.

A query's tasks are independent once their deadlines are stamped, so the
simulation runs in two steps:

1. query level (vectorised): arrivals, classes, fanouts, targets, service
   times (``workload``), and each query's budget from the same CdfBook and
   DeadlineEstimator the gateway uses (TailGuard eq. (1)-(4));
2. task level: each server is simulated on its own, in arrival order, with
   the very TaskQueue class the task servers use, popping at virtual times.
   A task that finds its server idle and the queue empty starts at once,
   as TailGuard §III.B specifies ("if the corresponding task server is idle,
   the task is serviced immediately"), without a trip through the queue.

Query latency is the slowest task's completion minus the query's arrival.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from admission import (
    MissRatioWindow,
    ThresholdAutoscaler,
    vertical_step,
)
from gateway.cdf import CdfBook
from gateway.deadlines import DeadlineEstimator, SloUnreachable
from gateway.table_cdf import prior_of
from loadtests.sim.budget_controller import BudgetController
from loadtests.sim.events import run_with_feedback
from loadtests.sim.scenario import Scenario, SimAutoscaling, class_priorities
from loadtests.sim.waits import SimWaits
from loadtests.sim.workload import Workload, make_workload
from taskserver.queues import QueuedTask, create_task_queue
from taskserver.service_time import make_distribution

PRIOR_POINTS = 10_000


@dataclass(slots=True)
class SimResult:
    """Everything a report needs about one run (warm-up queries already dropped)."""

    scenario: Scenario
    load: float
    policy: str
    latency_ms: np.ndarray
    """Latency of every measured, admitted query."""
    cls: np.ndarray
    fanout: np.ndarray
    tasks: int
    """Measured tasks."""
    missed: int
    """Measured tasks dequeued after their deadline t_D."""
    rejected_queries: int
    """Measured queries not admitted: SLO below x_p^u (the gateway's 422) or admission."""
    measured_queries: int
    utilisation: float
    """Busy time over servers x simulated time."""
    admission_rejected: int = 0
    """Of rejected_queries, those turned away by admission control."""
    deferred: int = 0
    """DEFER decisions admission control took (a deferred query is asked again later)."""
    budgets: dict[str, float] = field(default_factory=dict)
    """Final budget multiplier per class (1.0 without budget adjustment)."""
    scaling: list[dict[str, float]] = field(default_factory=list)
    """Vertical scaling actions, in order (with [autoscaling] enabled)."""
    arrival_ms: np.ndarray | None = None
    """Arrival time of each query in latency_ms (for time series)."""
    query_misses: np.ndarray | None = None
    """Tasks of each query in latency_ms that were dequeued after their t_D."""
    offered_arrival_ms: np.ndarray | None = None
    """Arrival time of every measured query, admitted or not (for accepted-load series)."""
    meet_prob: np.ndarray | None = None
    """Each query in latency_ms: the predictive rule's P(meet SLO) when it was admitted."""

    @property
    def miss_ratio(self) -> float:
        """Task deadline-miss ratio."""
        return self.missed / self.tasks if self.tasks else 0.0

    @property
    def accepted_load(self) -> float:
        """Offered load times the admitted share of queries."""
        if not self.measured_queries:
            return 0.0
        return self.load * (1.0 - self.rejected_queries / self.measured_queries)


def build_book(scn: Scenario) -> tuple[CdfBook, list[str]]:
    """The CDF book of the scenario's servers: one shared row per pool, primed with the
    service law itself (a quantile table is its exact model, TailGuard §IV.A: F does not
    change over time, so the rows are never refreshed and x_p^u is the model's)."""
    overhead = scn.overhead.return_ms
    if scn.run.queueing == "central":
        overhead += scn.overhead.dispatch_ms
    book = CdfBook(window_size=PRIOR_POINTS, refresh_every=1 << 30)
    ids: list[str] = []
    pools = scn.servers.pools or ()
    if not pools:
        prior = prior_of(make_distribution(scn.service), shift_ms=overhead, points=PRIOR_POINTS)
        for i in range(scn.servers.count):
            ids.append(f"s{i}")
            book.add_server(ids[-1], prior, group="all")
        return book, ids
    for j, pool in enumerate(pools):
        spec = replace(scn.service, scale=scn.service.scale * pool.service_scale)
        prior = prior_of(make_distribution(spec), shift_ms=overhead, points=PRIOR_POINTS)
        for _ in range(pool.count):
            ids.append(f"s{len(ids)}")
            book.add_server(ids[-1], prior, group=f"pool{j}")
    return book, ids


def query_budgets(scn: Scenario, w: Workload, book: CdfBook, ids: list[str]) -> np.ndarray:
    """T_b = SLO - x_p^u(k_f) per query over its own servers; NaN where the SLO is unreachable."""
    budgets, _ = _plans(scn, w, book, ids)
    return budgets


def query_unloaded(scn: Scenario, w: Workload, book: CdfBook, ids: list[str]) -> np.ndarray:
    """x_p^u(k_f) per query over its own servers, at its class's percentile (TailGuard eq. 2)."""
    _, unloaded = _plans(scn, w, book, ids)
    return unloaded


def _plans(
    scn: Scenario, w: Workload, book: CdfBook, ids: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(T_b, x_p^u) per query; T_b is NaN where the SLO is unreachable."""
    est = DeadlineEstimator(book)
    pools = scn.servers.pools or ()
    if pools:
        pool_of = np.repeat(np.arange(len(pools)), [p.count for p in pools])
        task_pool = pool_of[w.task_server]
        counts = np.zeros((w.queries, len(pools)), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(w.queries), w.fanout), task_pool), 1)
        starts = np.concatenate([[0], np.cumsum([p.count for p in pools])[:-1]])
    else:
        counts = w.fanout[:, None]
        starts = np.array([0])
    keys = np.concatenate([w.cls[:, None].astype(np.int64), counts], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    budgets = np.empty(len(uniq))
    unloaded = np.empty(len(uniq))
    for u, row in enumerate(uniq):
        c = scn.classes[int(row[0])]
        # Servers of one pool share a CDF row, so any members stand for the composition.
        members = [
            ids[int(s0) + i] for s0, n in zip(starts, row[1:], strict=True) for i in range(n)
        ]
        try:
            plan = est.plan(members, c.percentile, c.slo_ms)
            budgets[u], unloaded[u] = plan.budget_ms, plan.unloaded_ms
        except SloUnreachable as exc:
            budgets[u], unloaded[u] = np.nan, exc.unloaded_ms
    return budgets[inverse.ravel()], unloaded[inverse.ravel()]


def _planner(
    scn: Scenario, book: CdfBook, ids: list[str]
) -> Callable[[int, list[int]], tuple[float, float]]:
    """(T_b, x_p^u) of a query of class c over exactly these servers (TailGuard eq. 1-4);
    (NaN, NaN) where its SLO is below x_p^u (the gateway's 422)."""
    est = DeadlineEstimator(book)

    def plan(c: int, servers: list[int]) -> tuple[float, float]:
        cls = scn.classes[c]
        try:
            p = est.plan([ids[s] for s in servers], cls.percentile, cls.slo_ms)
        except SloUnreachable:
            return math.nan, math.nan
        return p.budget_ms, p.unloaded_ms

    return plan


def simulate(
    scn: Scenario,
    load: float,
    *,
    policy: str | None = None,
    controller: BudgetController | None = None,
    epochs: int = 40,
) -> SimResult:
    """Run the scenario at this load under a policy (default: the scenario's).

    With admission control or autoscaling, every task's outcome reaches them when the
    query handler would learn it (``loadtests.sim.events``). With a BudgetController the
    queries are fed in `epochs` slices; after each slice the controller sees every class's
    tail over the two slices before it and rescales the budgets of the queries that follow
    (a run-time loop, not an offline fit).
    """
    policy = policy or scn.run.policy
    if scn.requests.stages > 1:
        if controller is not None:
            raise ValueError("budget adjustment cannot run with multi-query requests")
        return _simulate_requests(scn, load, policy)
    w = make_workload(scn, load)
    book, ids = build_book(scn)
    base_budget = query_budgets(scn, w, book, ids)
    admitted = ~np.isnan(base_budget)
    slo_ms = np.array([c.slo_ms for c in scn.classes])
    prio = class_priorities(scn)[w.cls]

    # Per task: which query, when it reaches its queue, how long it holds a slot.
    tq = np.repeat(np.arange(w.queries), w.fanout)
    keep = admitted[tq]
    t0 = w.arrival_ms[tq]
    dispatch, ret = scn.overhead.dispatch_ms, scn.overhead.return_ms
    if scn.run.queueing == "central":
        # The handler holds the queue; a slot is busy from send until the result is back.
        arrive, occupy, after = t0, w.task_service_ms + dispatch + ret, 0.0
    else:
        # A copy: vertical scaling rewrites it, and the draws are shared across runs.
        arrive, occupy, after = t0 + dispatch, w.task_service_ms.copy(), ret
    arrays = TaskArrays(
        arrive, occupy, np.zeros(tq.size), t0 + slo_ms[w.cls][tq], prio[tq], w.task_server
    )
    start = np.full(tq.size, np.nan)
    sims: dict[int, ServerSim] = {}
    budget = np.nan_to_num(base_budget)
    admission_rejected = np.zeros(w.queries, dtype=bool)
    scaler = _SimScaler(scn.autoscaling) if scn.autoscaling.enabled else None
    deferred = 0
    least_wait = scn.run.pick == "least-wait"
    waits: SimWaits | None = None
    if scn.admission.policy != "none" or scaler is not None or least_wait or scn.allocation.enabled:
        if controller is not None:
            raise ValueError(
                "budget adjustment cannot run with admission control, autoscaling, least-wait "
                "choice or allocation in the simulator"
            )
        # Feedback loops learn each task's outcome in time: the event-driven engine.
        predictive = scn.admission.effective_rule == "predictive"
        if predictive or least_wait:
            waits = SimWaits.of(book, ids, w.tasks, queries=w.queries)
        fb = run_with_feedback(
            scn,
            w,
            policy,
            base_budget,
            slo_ms[w.cls] - base_budget,
            scaler,
            waits,
            _planner(scn, book, ids) if least_wait else None,
        )
        start, occupy, deferred = fb.start, fb.occupy, fb.deferred
        if fb.budget_ms is not None:
            budget = np.nan_to_num(fb.budget_ms)
        admitted, admission_rejected = fb.admitted, fb.admission_rejected
        keep = admitted[tq]
        arrays.deadline[:] = t0 + budget[tq]
    elif controller is None:
        arrays.deadline[:] = t0 + budget[tq]
        _feed(np.flatnonzero(keep), arrays, policy, scn.servers.slots, sims, start)
    else:
        bounds = np.linspace(0, w.queries, epochs + 1).astype(np.int64)
        names = [c.name for c in scn.classes]
        for e in range(epochs):
            q0, q1 = int(bounds[e]), int(bounds[e + 1])
            t_lo, t_hi = int(w.offsets[q0]), int(w.offsets[q1])
            scale = (
                np.array([controller.scale(n) for n in names])
                if controller is not None
                else np.ones(len(names))
            )
            epoch_budget = (budget * scale[w.cls])[tq[t_lo:t_hi]]
            arrays.deadline[t_lo:t_hi] = t0[t_lo:t_hi] + epoch_budget
            tasks = t_lo + np.flatnonzero(keep[t_lo:t_hi])
            _feed(tasks, arrays, policy, scn.servers.slots, sims, start)
            if controller is not None and e >= 1:
                controller.update(_window_tails(scn, w, start, occupy, after, admitted, bounds, e))
    for sim in sims.values():
        sim.drain(start)
    done = start + occupy + after
    missed_task = start > arrays.deadline

    # Query latency: the slowest task (tasks are laid out query by query).
    latency = _latencies(w, start, occupy, after, 0, w.queries, keep)
    first = int(scn.run.warmup * w.queries)
    measured = np.zeros(w.queries, dtype=bool)
    measured[first:] = True
    ok = measured & admitted
    task_measured = ok[tq]
    per_query_misses = np.add.reduceat(missed_task.astype(np.int64), w.offsets[:-1])
    horizon = float(np.nanmax(done) - w.arrival_ms[0]) if np.any(keep) else 1.0
    busy = float(occupy[keep].sum())
    return SimResult(
        scenario=scn,
        load=load,
        policy=policy,
        latency_ms=latency[ok],
        cls=w.cls[ok],
        fanout=w.fanout[ok],
        tasks=int(task_measured.sum()),
        missed=int((missed_task & task_measured).sum()),
        rejected_queries=int((measured & ~admitted).sum()),
        admission_rejected=int((measured & admission_rejected).sum()),
        deferred=deferred,
        measured_queries=int(measured.sum()),
        utilisation=busy / (scn.servers.count * horizon),
        budgets=controller.scales if controller is not None else {},
        scaling=scaler.actions if scaler is not None else [],
        arrival_ms=w.arrival_ms[ok],
        query_misses=per_query_misses[ok],
        offered_arrival_ms=w.arrival_ms[measured],
        meet_prob=waits.query_meet[ok] if waits is not None and waits.query_meet.size else None,
    )


def _simulate_requests(scn: Scenario, load: float, policy: str) -> SimResult:
    """Multi-query requests (``[requests] stages = M``): every request is M queries in a
    row under its class's SLO, on the event-driven engine; the result counts requests (its
    latency_ms are request latencies, its fanout the widest stage of each)."""
    w = make_workload(scn, load)
    book, ids = build_book(scn)
    budgets, unloaded = _plans(scn, w, book, ids)
    scaler = _SimScaler(scn.autoscaling) if scn.autoscaling.enabled else None
    predictive = scn.admission.effective_rule == "predictive"
    waits = SimWaits.of(book, ids, w.tasks, queries=w.queries) if predictive else None
    fb = run_with_feedback(scn, w, policy, budgets, unloaded, scaler, waits)
    m = scn.requests.stages
    n_req = w.queries // m
    after = 0.0 if scn.run.queueing == "central" else scn.overhead.return_ms
    q_done = _latencies(w, fb.start, fb.occupy, after, 0, w.queries) + w.arrival_ms
    first_stage = np.arange(n_req) * m
    last_stage = first_stage + m - 1
    arrival = w.arrival_ms[:n_req] * m  # as the engine draws requests
    admitted = fb.admitted[first_stage]
    finished = admitted & ~np.isnan(fb.start[w.offsets[last_stage]])
    latency = q_done[last_stage] - arrival
    measured = np.arange(n_req) >= int(scn.run.warmup * n_req)
    ok = measured & finished
    widest = np.maximum.reduceat(w.fanout, first_stage)
    tq = np.repeat(np.arange(w.queries), w.fanout)
    task_ok = ok[tq // m]
    assert fb.budget_ms is not None
    deadline = (fb.query_start_ms + fb.budget_ms)[tq]  # type: ignore[operator]
    missed_task = fb.start > deadline
    ran = ~np.isnan(fb.start)
    done = fb.start + fb.occupy + after
    horizon = float(np.nanmax(done) - arrival[0]) if ran.any() else 1.0
    return SimResult(
        scenario=scn,
        load=load,
        policy=policy,
        latency_ms=latency[ok],
        cls=w.cls[first_stage][ok],
        fanout=widest[ok],
        tasks=int((task_ok & ran).sum()),
        missed=int((missed_task & task_ok).sum()),
        rejected_queries=int((measured & ~admitted).sum()),
        admission_rejected=int((measured & fb.admission_rejected[first_stage]).sum()),
        deferred=fb.deferred,
        measured_queries=int(measured.sum()),
        utilisation=float(np.nansum(fb.occupy[ran])) / (scn.servers.count * horizon),
        scaling=scaler.actions if scaler is not None else [],
        arrival_ms=arrival[ok],
        offered_arrival_ms=arrival[measured],
    )


def _window_tails(
    scn: Scenario,
    w: Workload,
    start: np.ndarray,
    occupy: np.ndarray,
    after: float,
    admitted: np.ndarray,
    bounds: np.ndarray,
    epoch: int,
    span: int = 8,
) -> dict[str, tuple[float, float]]:
    """Each class's worst tail over its fanout types in the last `span` epochs.

    The max-load criterion asks every fanout type of a class to meet the SLO, so the
    class's gap is its worst type's (types with too few samples for the percentile
    are skipped; queries with tasks still queued count as unfinished).
    """
    m0, m1 = int(bounds[max(epoch - span, 0)]), int(bounds[epoch])
    lat = _latencies(w, start, occupy, after, m0, m1)
    ok = admitted[m0:m1]
    edges = np.asarray(scn.fanout.edges())
    types = np.searchsorted(edges, w.fanout[m0:m1], side="right") - 1
    tails: dict[str, tuple[float, float]] = {}
    for ci, c in enumerate(scn.classes):
        tail_share = 1.0 - c.percentile / 100.0
        mine = ok & (w.cls[m0:m1] == ci)
        worst = -math.inf
        for ti in np.unique(types[mine]):
            sel = mine & (types == ti)
            if np.count_nonzero(sel) * tail_share >= 5:
                worst = max(worst, float(np.percentile(lat[sel], c.percentile)))
        if worst > -math.inf:
            tails[c.name] = (worst, c.slo_ms)
    return tails


class _SimScaler:
    """TailGuard §III.E vertical scaling of emulated servers on the virtual clock.

    The ThresholdAutoscaler's replica count stands for a speed level: each step up
    makes service 20% faster (x0.8), each step down 25% slower (x1.25), as in the
    paper's experiment; `max_steps_up`/`max_steps_down` bound the levels.
    """

    def __init__(self, spec: SimAutoscaling) -> None:
        self.base = 1 + spec.max_steps_down
        self.policy = ThresholdAutoscaler(
            upper=spec.upper,
            lower=spec.lower,
            min_replicas=1,
            max_replicas=self.base + spec.max_steps_up,
            up_cooldown_s=spec.up_cooldown_ms / 1000.0,
            down_cooldown_s=spec.down_cooldown_ms / 1000.0,
        )
        self.window_tasks = spec.window_tasks
        self.window = MissRatioWindow(window_tasks=spec.window_tasks)
        self.level = self.base
        self.actions: list[dict[str, float]] = []

    @property
    def scale(self) -> float:
        """Service-time multiplier of the current level."""
        return vertical_step(1.0, self.level - self.base)

    def record(self, misses: int, tasks: int, now_ms: float) -> None:
        """Task outcomes the handler learned (misses of tasks)."""
        self.window.record_many(misses, tasks, now_ms / 1000.0)

    def decide(self, now_ms: float) -> float:
        """Maybe change the level; the service-time multiplier from now on."""
        now_s = now_ms / 1000.0
        if self.window.count(now_s) < self.window_tasks:
            return self.scale  # the window does not yet hold a full window since the change
        ratio = self.window.ratio(now_s)
        d = self.policy.decide(ratio, self.level, now_s)
        if d.delta:
            self.actions.append(
                {
                    "time_ms": now_ms,
                    "miss_ratio": ratio,
                    "from_scale": self.scale,
                    "to_scale": vertical_step(1.0, d.replicas - self.base),
                    "reason": d.reason,
                }
            )
            self.level = d.replicas
            self.window = MissRatioWindow(window_tasks=self.window_tasks)
        return self.scale


def _latencies(
    w: Workload,
    start: np.ndarray,
    occupy: np.ndarray,
    after: float,
    q0: int,
    q1: int,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """Latency of queries q0..q1-1; a task not started yet counts as unfinished (inf)."""
    t_lo, t_hi = int(w.offsets[q0]), int(w.offsets[q1])
    done = start[t_lo:t_hi] + occupy[t_lo:t_hi] + after
    done = np.where(np.isnan(done), np.inf, done)
    if keep is not None:
        done = np.where(keep[t_lo:t_hi], done, -np.inf)
    q_done = np.maximum.reduceat(done, w.offsets[q0:q1] - t_lo)
    return q_done - w.arrival_ms[q0:q1]


@dataclass(slots=True)
class TaskArrays:
    """Per-task attributes, indexed by task id."""

    arrive: np.ndarray
    occupy: np.ndarray
    deadline: np.ndarray
    slo_deadline: np.ndarray
    priority: np.ndarray
    server: np.ndarray


def _feed(
    tasks: np.ndarray,
    arrays: TaskArrays,
    policy: str,
    slots: int,
    sims: dict[int, ServerSim],
    start: np.ndarray,
) -> None:
    """Feed tasks (in any order) to their servers, each in arrival order."""
    if tasks.size == 0:
        return
    order = tasks[np.lexsort((arrays.arrive[tasks], arrays.server[tasks]))]
    cuts = np.flatnonzero(np.diff(arrays.server[order])) + 1
    for chunk in np.split(order, cuts):
        s = int(arrays.server[chunk[0]])
        sim = sims.get(s)
        if sim is None:
            sim = sims[s] = ServerSim(policy, slots)
        # Short per-server lists keep the hot loop in cache (global lists are 10x slower).
        sim.feed(
            chunk,
            arrays.arrive[chunk].tolist(),
            arrays.occupy[chunk].tolist(),
            arrays.deadline[chunk].tolist(),
            arrays.slo_deadline[chunk].tolist(),
            arrays.priority[chunk].tolist(),
            start,
        )


class ServerSim:
    """One server's policy queue and slots on the virtual clock (ms), fed in arrival order.

    The queue is the live TaskQueue. Feeding can stop after any arrival and resume
    later; `drain` serves what is left.
    """

    def __init__(
        self, policy: str, slots: int = 1, on_dequeue: Callable[[int, float], None] | None = None
    ) -> None:
        self.queue = create_task_queue(policy)
        self.free = [float("-inf")] * slots  # min-heap of the times slots become free
        self.queued = 0
        self.on_dequeue = on_dequeue

    def feed(
        self,
        ids: np.ndarray,
        arrive: list[float],
        occupy: list[float],
        deadline: list[float],
        slo_deadline: list[float],
        priority: list[int],
        start: np.ndarray,
    ) -> None:
        """Tasks `ids` (with their attributes), in arrival order, join this server;
        start[id] gets each dequeue time known so far."""
        # The hot loop of the simulator: everything it touches is a local.
        gids = ids.tolist()
        free, push, pop = self.free, self.queue.push, self.queue.pop
        replace_min, on_dequeue = heapq.heapreplace, self.on_dequeue
        queued = self.queued
        local = [math.nan] * len(gids)
        late_ids: list[int] = []
        late_t: list[float] = []
        for k, a in enumerate(arrive):
            # Serve what waits while a slot frees up before this arrival.
            while queued and free[0] <= a:
                t = free[0]
                gid, occ = pop(t).task.item  # type: ignore[union-attr]
                queued -= 1
                late_ids.append(gid)
                late_t.append(t)
                replace_min(free, t + occ)
                if on_dequeue is not None:
                    on_dequeue(gid, t)
            if not queued and free[0] <= a:
                local[k] = a  # idle server, empty queue: served at once
                replace_min(free, a + occupy[k])
                if on_dequeue is not None:
                    on_dequeue(gids[k], a)
            else:
                item = (gids[k], occupy[k])
                push(QueuedTask("", k, deadline[k], slo_deadline[k], priority[k], a, item))
                queued += 1
        self.queued = queued
        start[ids] = local
        if late_ids:
            start[late_ids] = late_t

    def drain(self, start: np.ndarray) -> None:
        """Serve every task still queued."""
        late_ids: list[int] = []
        late_t: list[float] = []
        while self.queued:
            t = self.free[0]
            gid, occ = self.queue.pop(t).task.item  # type: ignore[union-attr]
            self.queued -= 1
            late_ids.append(gid)
            late_t.append(t)
            heapq.heapreplace(self.free, t + occ)
            if self.on_dequeue is not None:
                self.on_dequeue(gid, t)
        if late_ids:
            start[late_ids] = late_t
