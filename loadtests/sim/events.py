"""The simulator with feedback: admission and autoscaling learn each task's outcome in time.

TailGuard's admission control (§III.D) and autoscaling (§III.E) act on the task
deadline-miss ratio, which the query handler learns task by task: at the dequeue when the
queue sits in the handler (central queueing), with the task's result when it sits in the
task server (server queueing). So here every server runs on one shared virtual clock,
event by event: each dequeue is known at its moment, and each arriving query is put to
the admission gate the gateway runs (``admission.AdmissionGate``: the window, its age
reset, the tails, the fast path and the rule) against the window as it is at that
arrival, with the same inputs. A DEFER holds the query and asks again, as the gateway
does. The autoscaler steps the servers' speed on the same outcomes; a task runs at the
speed of the moment it starts.

Outcomes that arrive between two queries reach the window together, stamped with the
later query's arrival, which is the first moment a decision can see them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from admission import Action, AdmissionGate, QueryInfo, WaitEstimate, estimate_wait
from admission.allocation import Congestion, DrrArbiter, FairArbiter
from admission.waiting import overtake_window, with_overtaking
from gateway.allocation import AllocatedQueue
from gateway.stages import stage_slo_ms
from loadtests.sim.scenario import Scenario, class_priorities
from loadtests.sim.waits import SimWaits
from loadtests.sim.workload import Workload
from taskserver.queues import QueuedTask, TaskQueue, create_task_queue

__all__ = ["FeedbackRun", "run_with_feedback"]


@dataclass(slots=True)
class FeedbackRun:
    """Per-task and per-query outcomes of an event-driven run."""

    start: np.ndarray
    """Dequeue time of each task (NaN: never dispatched)."""
    occupy: np.ndarray
    """How long each task held its slot (at the speed of the moment it started)."""
    admitted: np.ndarray
    """Per query: dispatched (admitted at once or after deferrals)."""
    admission_rejected: np.ndarray
    """Per query: turned away by admission control."""
    deferred: int
    """DEFER decisions taken (a query may be deferred several times)."""
    scaling: list[dict[str, float]]
    budget_ms: np.ndarray | None = None
    """Per query: the T_b it ran with (changed from the caller's by least-wait choice or by
    multi-query stages)."""
    query_start_ms: np.ndarray | None = None
    """Multi-query requests: when each query (stage) started; NaN: never."""


class _Clock:
    """The virtual clock the admission gate reads (seconds)."""

    __slots__ = ("now_s",)

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class _Server:
    """One server's policy queue and slots on the shared virtual clock (ms); with an
    allocation arbiter the queue is shared between flows (gateway.allocation)."""

    __slots__ = ("free", "queue", "queued", "version")

    def __init__(
        self, policy: str, slots: int, arbiter: DrrArbiter | FairArbiter | None = None
    ) -> None:
        self.queue: TaskQueue | AllocatedQueue = (
            create_task_queue(policy) if arbiter is None else AllocatedQueue(policy, arbiter)
        )
        self.free = [-math.inf] * slots
        self.queued = 0
        self.version = 0


@dataclass(frozen=True, slots=True)
class _GateClass:
    """A scenario class as the admission gate reads it (admission.gate.AdmissionClass)."""

    name: str
    priority: int
    percentile: float


def gate_for(scn: Scenario, clock: Callable[[], float]) -> AdmissionGate:
    """The admission gate, configured as the scenario's [admission] table; its random draws
    (the throttle's) come from the run's seed, so a run repeats exactly."""
    prio = class_priorities(scn)
    classes = [_GateClass(c.name, int(prio[i]), c.percentile) for i, c in enumerate(scn.classes)]
    return AdmissionGate(scn.admission, classes, clock, seed=scn.run.seed)


def _cost_hints(scn: Scenario, w: Workload, unloaded_ms: np.ndarray) -> np.ndarray | None:
    """The cost admission sees per query at the scenario's level of cost information (None:
    its own estimate, k_f * x_p^u)."""
    level = scn.run.cost_information
    if level == "estimate":
        return None
    if level == "none":
        return np.ones(w.queries)  # every query alike: no magnitude to act on
    if level == "exact":  # an oracle: the service times its tasks will draw
        return np.add.reduceat(w.task_service_ms, w.offsets[:-1])
    estimate = np.nan_to_num(w.fanout * unloaded_ms)
    hints = np.empty(w.queries)
    for c in range(len(scn.classes)):
        mine = w.cls == c
        hints[mine] = estimate[mine].mean() if mine.any() else 1.0
    return hints


def run_with_feedback(
    scn: Scenario,
    w: Workload,
    policy: str,
    budget_ms: np.ndarray,
    unloaded_ms: np.ndarray,
    scaler: Any | None,
    waits: SimWaits | None = None,
    planner: Callable[[int, list[int]], tuple[float, float]] | None = None,
) -> FeedbackRun:
    """Simulate every query in arrival order with admission (scn.admission) and/or the
    vertical autoscaler `scaler` (engine._SimScaler) in the loop.

    budget_ms[q] is the query's T_b (NaN: SLO below x_p^u, never admitted); unloaded_ms[q]
    its x_p^u. `waits` (needed by the ``predictive`` rule, or recording for the
    wait-estimator experiment): each target's queue wait is estimated from its exact state
    as the query arrives (QLM §6, `admission.waiting`).

    `planner` (``pick = "least-wait"``, with `waits`): a query of k_f < N tasks goes to the
    k_f servers with the smallest estimated wait for a task joining at the back of their
    queue (QLM's load balancing across instances; ties go to the faster server, then to the
    workload's own random order), its service times follow the servers' scales, and
    planner(class, servers) gives its (T_b, x_p^u) over exactly those servers (TailGuard
    eq. 1-4; NaN T_b: unreachable, refused). `budget_ms`, `unloaded_ms` and `w` are then
    copied, not changed.

    Multi-query requests (``[requests] stages = M > 1``): queries M r .. M r + M - 1 are
    request r's stages; request r arrives at M times the r-th query's arrival (a Poisson
    stream at 1/M of the query rate, so the servers' load is unchanged), only its first
    stage meets admission, and each stage starts when the one before it has finished, with
    the SLO `gateway.stages.stage_slo_ms` gives it from what is left of the class's SLO.
    `unloaded_ms` must then hold every query's x_p^u (finite).
    """
    if planner is not None:
        if waits is None:
            raise ValueError("least-wait choice needs the servers' wait estimates")
        budget_ms, unloaded_ms = budget_ms.copy(), unloaded_ms.copy()
        w = replace(w, task_server=w.task_server.copy(), task_service_ms=w.task_service_ms.copy())
    scales = np.asarray(scn.servers.scales())
    hints = _cost_hints(scn, w, unloaded_ms)
    stages = scn.requests.stages
    staged = stages > 1
    query_start = np.full(w.queries if staged else 0, np.nan)
    if staged:
        budget_ms = budget_ms.copy()
        # Request r arrives at M x the r-th query's time: Poisson at 1/M of the query rate.
        first_arrival = w.arrival_ms[: w.queries // stages] * stages
    else:
        first_arrival = w.arrival_ms
    central = scn.run.queueing == "central"
    dispatch, ret = scn.overhead.dispatch_ms, scn.overhead.return_ms
    names = [c.name for c in scn.classes]
    slo_ms = np.array([c.slo_ms for c in scn.classes])
    prio = class_priorities(scn)
    slots_total = scn.servers.count * scn.servers.slots
    n_tasks = w.tasks
    start = np.full(n_tasks, np.nan)
    occupy = np.full(n_tasks, np.nan)
    admitted = np.zeros(w.queries, dtype=bool)
    rejected = np.zeros(w.queries, dtype=bool)
    service = w.task_service_ms
    extra = dispatch + ret if central else 0.0
    after = 0.0 if central else ret
    deadline = np.repeat(w.arrival_ms + np.nan_to_num(budget_ms), w.fanout)
    slo_deadline = np.repeat(w.arrival_ms + slo_ms[w.cls], w.fanout)
    task_prio = np.repeat(prio[w.cls], w.fanout)
    task_query = np.repeat(np.arange(w.queries), w.fanout)
    alloc = scn.allocation
    congestion = Congestion()
    servers = [
        _Server(policy, scn.servers.slots, alloc.arbiter(congestion) if alloc.enabled else None)
        for _ in range(scn.servers.count)
    ]
    flows = [c.flow for c in scn.classes]
    share = alloc.admission_share()
    # Cost units of a query (ms of server time): its hint, else k_f * x_p^u; per task / k_f.
    query_cost = np.maximum(
        hints if hints is not None else np.nan_to_num(w.fanout * unloaded_ms), 1e-9
    )
    task_cost = np.repeat(query_cost / w.fanout, w.fanout)
    task_flow = [flows[c] for c in np.repeat(w.cls, w.fanout)] if alloc.enabled else None
    clock = _Clock()
    gate = gate_for(scn, clock) if scn.admission.enabled else None
    # [allocation] share = windows: each flow is admitted on its own tasks' miss ratio.
    gate_of: list[AdmissionGate] = []
    if gate is not None:
        per_flow = {f: gate_for(scn, clock) for f in flows} if alloc.gate_per_flow else {}
        gate_of = [per_flow.get(f, gate) for f in flows]
    need_wait = gate is not None and gate.needs_wait
    if need_wait and waits is None:
        raise ValueError("the predictive admission rule needs the servers' wait estimates")
    estimating = waits is not None and (need_wait or waits.record)
    percentile = np.array([c.percentile for c in scn.classes])
    # Outcomes on their way to the handler: (known at ms, seq, task or ~query).
    notes: list[tuple[float, int, int]] = []
    # Servers with queued tasks: (when a slot frees, server, version).
    pending: list[tuple[float, int, int]] = []
    left = w.fanout.astype(np.int64).copy()  # tasks of each query not started yet
    done_ms = np.full(w.queries, -math.inf)
    queued_total = 0
    seq = 0
    deferred = 0
    scale = 1.0

    def begin(gid: int, s: int, t: float) -> None:
        nonlocal seq
        occ = service[gid] * scale + extra
        start[gid], occupy[gid] = t, occ
        known = t if central else t + occ + after
        seq += 1
        heapq.heappush(notes, (known, seq, gid))
        q = int(task_query[gid])
        done = t + occ + after
        if done > done_ms[q]:
            done_ms[q] = done
        left[q] -= 1
        if left[q] == 0:
            seq += 1
            heapq.heappush(notes, (float(done_ms[q]), seq, ~q))
            if staged and (q + 1) % stages:
                # The request's next stage starts when this one has finished.
                seq += 1
                heapq.heappush(events, (float(done_ms[q]), seq, q + 1, 0.0))

    def pop_one(s: int, srv: _Server) -> None:
        nonlocal queued_total
        t = srv.free[0]
        gid = srv.queue.pop(t).task.item  # type: ignore[union-attr]
        srv.queued -= 1
        queued_total -= 1
        begin(gid, s, t)
        heapq.heapreplace(srv.free, t + occupy[gid])

    def schedule(s: int, srv: _Server) -> None:
        srv.version += 1
        if srv.queued:
            heapq.heappush(pending, (srv.free[0], s, srv.version))

    def advance(t: float) -> None:
        """Every dequeue on any server up to time t; with multi-query requests, only up to
        a next stage that one of them starts before t (time never runs backwards)."""
        while pending and pending[0][0] <= t:
            _, s, version = heapq.heappop(pending)
            srv = servers[s]
            if version != srv.version:
                continue  # superseded
            pop_one(s, srv)
            schedule(s, srv)
            if staged and events and events[0][0] < t:
                t = events[0][0]

    def settle(s: int, srv: _Server, a: float) -> bool:
        """This server's dequeues up to time a (before a task joins its queue); whether it
        dequeued any (its pending entry is then stale)."""
        popped = False
        while srv.queued and srv.free[0] <= a:
            pop_one(s, srv)
            popped = True
        return popped

    def estimate(q: int, a: float) -> tuple[list[int], list[WaitEstimate]]:
        """Each target's queue wait for a task of query q joining at time a (QLM §6)."""
        assert waits is not None
        targets: list[int] = []
        out: list[WaitEstimate] = []
        slots = scn.servers.slots
        c = int(w.cls[q])
        mine = (float(budget_ms[q]), float(slo_ms[c]), int(prio[c]))
        for gid in range(int(w.offsets[q]), int(w.offsets[q + 1])):
            s = int(w.task_server[gid])
            srv = servers[s]
            if settle(s, srv, a):
                schedule(s, srv)
            busy = sum(1 for f in srv.free if f > a)
            probe = QueuedTask(
                "", gid, float(deadline[gid]), float(slo_deadline[gid]), int(task_prio[gid]), a
            )
            ahead = srv.queue.ahead_of(probe)
            m = waits.moments[s]
            e = base = estimate_wait([(len(ahead), m)], busy, slots, m)
            if waits.overtaking:
                e = with_overtaking(
                    e,
                    [
                        (rate, overtake_window(policy, mine, waits.group_keys[g]), m)  # type: ignore[index]
                        for g, rate in waits.rates[s].rates(a)
                    ],
                    slots,
                )
            targets.append(s)
            out.append(e)
            if waits.record:
                waits.est_mean[gid], waits.est_sd[gid] = e.mean_ms, e.sd_ms
                waits.base_mean[gid], waits.base_sd[gid] = base.mean_ms, base.sd_ms
                waits.est_ahead[gid] = e.ahead
                waits.est_groups[gid] = len({int(w.cls[task_query[t.item]]) for t in ahead})
        return targets, out

    def back_of_queue(s: int, a: float) -> WaitEstimate:
        """The wait of a task joining server s at time a behind everything queued there."""
        assert waits is not None
        srv = servers[s]
        if settle(s, srv, a):
            schedule(s, srv)
        m = waits.moments[s]
        busy = sum(1 for f in srv.free if f > a)
        return estimate_wait([(srv.queued, m)], busy, scn.servers.slots, m)

    def least_wait(q: int, a: float) -> None:
        """Move query q's tasks to the servers with the smallest estimated wait, re-plan."""
        assert planner is not None and waits is not None
        lo, hi = int(w.offsets[q]), int(w.offsets[q + 1])
        k = hi - lo
        if k >= len(servers):
            return
        mine = w.task_server[lo:hi]
        # Ties: the faster server, then the workload's random pick, then the server index.
        rank = np.full(len(servers), 1)
        rank[mine] = 0
        order = sorted(
            range(len(servers)),
            key=lambda s: (back_of_queue(s, a).mean_ms, scales[s], rank[s], s),
        )
        chosen = order[:k]
        for gid, s in zip(range(lo, hi), chosen, strict=True):
            old = int(w.task_server[gid])
            service[gid] = service[gid] / scales[old] * scales[s]
            w.task_server[gid] = s
        c = int(w.cls[q])
        budget_ms[q], unloaded_ms[q] = planner(c, chosen)
        t_d = w.arrival_ms[q] + (0.0 if math.isnan(budget_ms[q]) else budget_ms[q])
        deadline[lo:hi] = t_d

    def arrive(gid: int, a: float) -> None:
        nonlocal queued_total
        s = int(w.task_server[gid])
        srv = servers[s]
        settle(s, srv, a)
        if not srv.queued and srv.free[0] <= a:
            begin(gid, s, a)  # idle server, empty queue: served at once (§III.B)
            heapq.heapreplace(srv.free, a + occupy[gid])
        else:
            srv.queue.push(
                QueuedTask(
                    "", gid, float(deadline[gid]), float(slo_deadline[gid]),
                    int(task_prio[gid]), a, gid,
                    "" if task_flow is None else task_flow[gid], float(task_cost[gid]),
                )
            )  # fmt: skip
            srv.queued += 1
            queued_total += 1
        schedule(s, srv)

    def queue_pressure() -> float:
        """Tasks waiting beyond the servers' slots, per slot (the gateway's definition)."""
        return queued_total / slots_total

    def deliver(t: float) -> None:
        """Outcomes the handler knows by time t, into the window (and the autoscaler)."""
        misses: dict[int, list[int]] = {}
        while notes and notes[0][0] <= t:
            _, _, item = heapq.heappop(notes)
            if item >= 0:
                c = int(w.cls[task_query[item]])
                pair = misses.setdefault(c, [0, 0])
                pair[0] += bool(start[item] > deadline[item])
                pair[1] += 1
            elif gate is not None:
                q = ~item
                c = int(w.cls[q])
                if staged:  # a stage against its own SLO, from its own start
                    gate_of[c].record_query(
                        names[c], float(done_ms[q] - query_start[q]), float(stage_slo[q])
                    )
                else:
                    gate_of[c].record_query(
                        names[c], float(done_ms[q] - w.arrival_ms[q]), slo_ms[c]
                    )
        for c, (m, n) in misses.items():
            if gate is not None:
                gate_of[c].record_tasks(m, n, names[c])
            if scaler is not None:
                scaler.record(m, n, t)

    stage_slo = np.full(w.queries, np.nan)

    def plan_stage(q: int, t: float) -> bool:
        """Stage q of its request starts at t: its SLO and budget from what is left of the
        request's SLO (gateway.stages); False when even unloaded stages cannot meet it."""
        r0 = q - q % stages
        c = int(w.cls[r0])
        remaining = float(slo_ms[c]) - (t - float(first_arrival[r0 // stages]))
        us = [float(u) for u in unloaded_ms[q : r0 + stages]]
        if q == r0 and remaining <= sum(us):
            return False
        slo_s = stage_slo_ms(scn.requests.rule, remaining, us)
        budget_ms[q] = slo_s - us[0]
        stage_slo[q] = slo_s
        query_start[q] = t
        lo, hi = int(w.offsets[q]), int(w.offsets[q + 1])
        deadline[lo:hi] = t + budget_ms[q]
        slo_deadline[lo:hi] = t + slo_s
        return True

    def shared(q: int, c: int, *, rule_admits: bool) -> bool:
        """The allocation share's verdict on the rule's (admission.allocation)."""
        if share is None:
            return rule_admits
        return share.decide(flows[c], float(query_cost[q]), rule_admits, clock.now_s)

    # Arrivals, deferred retries and the next stages of requests, in time order:
    # (time ms, seq, query, waited s).
    events: list[tuple[float, int, int, float]] = []
    next_r = 0
    n_first = first_arrival.size
    while next_r < n_first or events or (staged and pending):
        if staged:
            # Dequeues come first: one may end a stage and start the next before the next
            # arrival (or, with nothing else left, the servers run on until one does).
            advance(
                min(
                    float(first_arrival[next_r]) if next_r < n_first else math.inf,
                    events[0][0] if events else math.inf,
                )
            )
            if not events and next_r >= n_first:
                continue
        if events and (next_r >= n_first or events[0][0] <= first_arrival[next_r]):
            t, _, q, waited = heapq.heappop(events)
        else:
            q, t, waited = next_r * stages, float(first_arrival[next_r]), 0.0
            next_r += 1
            if planner is not None:
                least_wait(q, t if central else t + dispatch)
        advance(t)
        clock.now_s = t / 1000.0
        deliver(t)
        if scaler is not None:
            scale = scaler.decide(t)
        if staged:
            later_stage = q % stages > 0
            if not later_stage and not plan_stage(q, t):
                continue  # the request's SLO is below its stages' x_p^u: the gateway's 422
            if later_stage:
                plan_stage(q, t)
        elif math.isnan(budget_ms[q]):
            continue  # its SLO is below x_p^u: the gateway's 422
        c = int(w.cls[q])
        a = t if central else t + dispatch
        meet, wait_ms = 1.0, 0.0
        if estimating:
            assert waits is not None
            targets, ests = estimate(q, a)
            if need_wait:
                # The slack left for queueing and post-queuing time: the SLO less the time
                # held on deferrals and, with server queueing, the way to the server.
                slack = float(slo_ms[c]) - waited * 1000.0 - (a - t)
                meet = waits.meet(targets, ests, slack)
                if waits.query_meet.size:
                    waits.query_meet[q] = meet
                wait_ms = max(e.mean_ms for e in ests)
        if gate is not None and not (staged and q % stages) and not gate_of[c].clearly_admitted():
            info = QueryInfo(
                names[c],
                int(prio[c]),
                int(w.fanout[q]),
                float(slo_ms[c]),
                float(unloaded_ms[q]),
                waited,
                float(percentile[c]),
                meet,
                wait_ms,
                None if hints is None else float(hints[q]),
            )
            d = gate_of[c].decide(info, queue_pressure)
            if d.action is Action.DEFER:
                deferred += 1
                seq += 1
                heapq.heappush(events, (t + d.defer_s * 1000.0, seq, q, waited + d.defer_s))
                continue
            if d.action is Action.REJECT:
                # The allocation share may move a refusal on the pool's signal to the flow
                # served most (not the predictive rule's, which is the query's own).
                if not (d.reason != "predicted_miss" and shared(q, c, rule_admits=False)):
                    rejected[q] = True
                    continue
            elif not shared(q, c, rule_admits=True):
                rejected[q] = True  # refused to repay its flow's share debt
                continue
        elif not (staged and q % stages) and not shared(q, c, rule_admits=True):
            rejected[q] = True
            continue
        if alloc.protected and gate is not None:
            congestion.set(gate_of[c].pressure().miss_ratio / scn.admission.threshold)
        admitted[q] = True
        if waits is not None:
            # The query's request group (class, fanout) arrives at each of its servers.
            group = (c, int(w.fanout[q]))
            waits.group_keys[group] = (float(budget_ms[q]), float(slo_ms[c]), int(prio[c]))
            for gid in range(int(w.offsets[q]), int(w.offsets[q + 1])):
                waits.rates[int(w.task_server[gid])].add(group, a)
        for gid in range(int(w.offsets[q]), int(w.offsets[q + 1])):
            arrive(gid, a)
    advance(math.inf)
    return FeedbackRun(
        start,
        occupy,
        admitted,
        rejected,
        deferred,
        scaler.actions if scaler is not None else [],
        budget_ms,
        query_start if staged else None,
    )
