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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gateway.cdf import CdfBook
from gateway.deadlines import DeadlineEstimator, SloUnreachable
from loadtests.sim.scenario import Scenario
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
    """Measured queries whose SLO was below x_p^u (the gateway answers those 422)."""
    measured_queries: int
    utilisation: float
    """Busy time over servers x simulated time."""
    budgets: dict[str, float] = field(default_factory=dict)
    """Final budget multiplier per class (1.0 without budget adjustment)."""

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
    """The CDF book of the scenario's servers: one shared row per pool, from the service law."""
    dist = make_distribution(scn.service)
    base = np.asarray(dist.quantiles(PRIOR_POINTS))
    overhead = scn.overhead.return_ms
    if scn.run.queueing == "central":
        overhead += scn.overhead.dispatch_ms
    book = CdfBook(window_size=PRIOR_POINTS, refresh_every=1 << 30)
    ids: list[str] = []
    pools = scn.servers.pools or ()
    if not pools:
        for i in range(scn.servers.count):
            ids.append(f"s{i}")
            book.add_server(ids[-1], base + overhead, group="all")
        return book, ids
    for j, pool in enumerate(pools):
        for _ in range(pool.count):
            ids.append(f"s{len(ids)}")
            book.add_server(ids[-1], base * pool.service_scale + overhead, group=f"pool{j}")
    return book, ids


def query_budgets(scn: Scenario, w: Workload, book: CdfBook, ids: list[str]) -> np.ndarray:
    """T_b = SLO - x_p^u(k_f) per query over its own servers; NaN where the SLO is unreachable."""
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
    for u, row in enumerate(uniq):
        c = scn.classes[int(row[0])]
        # Servers of one pool share a CDF row, so any members stand for the composition.
        members = [
            ids[int(s0) + i] for s0, n in zip(starts, row[1:], strict=True) for i in range(n)
        ]
        try:
            budgets[u] = est.plan(members, c.percentile, c.slo_ms).budget_ms
        except SloUnreachable:
            budgets[u] = np.nan
    return budgets[inverse.ravel()]


def class_priorities(scn: Scenario) -> np.ndarray:
    """PRIQ priority per class: the tighter the SLO, the higher the class (0 first)."""
    order = sorted(range(len(scn.classes)), key=lambda i: (scn.classes[i].slo_ms, i))
    prio = np.empty(len(order), dtype=np.int64)
    prio[order] = np.arange(len(order))
    return prio


def simulate(
    scn: Scenario,
    load: float,
    *,
    policy: str | None = None,
    budget_scale: Callable[[np.ndarray], np.ndarray] | None = None,
) -> SimResult:
    """Run the scenario at this load under a policy (default: the scenario's)."""
    policy = policy or scn.run.policy
    w = make_workload(scn, load)
    book, ids = build_book(scn)
    budget_ms = query_budgets(scn, w, book, ids)
    if budget_scale is not None:
        budget_ms = budget_scale(budget_ms)
    admitted = ~np.isnan(budget_ms)
    slo_ms = np.array([c.slo_ms for c in scn.classes])[w.cls]
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
        arrive, occupy, after = t0 + dispatch, w.task_service_ms, ret
    deadline = t0 + np.nan_to_num(budget_ms)[tq]
    slo_deadline = t0 + slo_ms[tq]
    start = np.full(tq.size, np.nan)
    _serve_all(
        np.flatnonzero(keep),
        w.task_server,
        arrive,
        occupy,
        deadline,
        slo_deadline,
        prio[tq],
        policy,
        scn.servers.slots,
        start,
    )
    done = start + occupy + after
    missed_task = start > deadline

    # Query latency: the slowest task (tasks are laid out query by query).
    nonempty = w.offsets[:-1]
    q_done = np.maximum.reduceat(np.where(keep, done, -np.inf), nonempty)
    latency = q_done - w.arrival_ms
    first = int(scn.run.warmup * w.queries)
    measured = np.zeros(w.queries, dtype=bool)
    measured[first:] = True
    ok = measured & admitted
    task_measured = ok[tq]
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
        measured_queries=int(measured.sum()),
        utilisation=busy / (scn.servers.count * horizon),
    )


def _serve_all(
    tasks: np.ndarray,
    server: np.ndarray,
    arrive: np.ndarray,
    occupy: np.ndarray,
    deadline: np.ndarray,
    slo_deadline: np.ndarray,
    priority: np.ndarray,
    policy: str,
    slots: int,
    start: np.ndarray,
) -> None:
    """Fill start[task] (dequeue time) for every task, server by server."""
    order = tasks[np.lexsort((arrive[tasks], server[tasks]))]
    srv = server[order]
    bounds = np.flatnonzero(np.diff(srv)) + 1
    for chunk in np.split(order, bounds):
        if chunk.size:
            starts = serve_one_server(
                arrive[chunk].tolist(),
                occupy[chunk].tolist(),
                deadline[chunk].tolist(),
                slo_deadline[chunk].tolist(),
                priority[chunk].tolist(),
                policy,
                slots,
            )
            start[chunk] = starts


def serve_one_server(
    arrive: list[float],
    occupy: list[float],
    deadline: list[float],
    slo_deadline: list[float],
    priority: list[int],
    policy: str,
    slots: int = 1,
    on_dequeue: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Dequeue times of one server's tasks, given in arrival order.

    The queue is the live TaskQueue; time is virtual (ms). ``on_dequeue(i, t)``
    is told each dequeue in order, for tests that compare with the live server.
    """
    n = len(arrive)
    start = [0.0] * n
    q = create_task_queue(policy)
    push, pop = q.push, q.pop
    queued = 0
    free = [float("-inf")] * slots  # min-heap of the times slots become free
    for j in range(n):
        a = arrive[j]
        # Serve what waits, while a slot frees up before this arrival.
        while queued and free[0] <= a:
            t = free[0]
            dq = pop(t)
            assert dq is not None
            i = dq.task.item
            queued -= 1
            start[i] = t
            heapq.heapreplace(free, t + occupy[i])
            if on_dequeue is not None:
                on_dequeue(i, t)
        if not queued and free[0] <= a:
            start[j] = a  # idle server, empty queue: served at once
            heapq.heapreplace(free, a + occupy[j])
            if on_dequeue is not None:
                on_dequeue(j, a)
        else:
            push(QueuedTask("", j, deadline[j], slo_deadline[j], priority[j], a, j))
            queued += 1
    while queued:
        t = free[0]
        dq = pop(t)
        assert dq is not None
        i = dq.task.item
        queued -= 1
        start[i] = t
        heapq.heapreplace(free, t + occupy[i])
        if on_dequeue is not None:
            on_dequeue(i, t)
    return start
