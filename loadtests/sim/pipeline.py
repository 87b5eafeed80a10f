"""Discrete-event simulator of one PARD inference pipeline, on the live policy objects.

A virtual clock (a heap of events) drives the modules of one pipeline (a chain or a DAG) with
the same PARD objects a task server runs: per module a StatePlanner and a dropper from
`create_dropper`, per worker a queue from ``dropper.new_queue()`` (a BudgetQueue with adaptive
HBF/LBF for PARD), and `dropper.form_batch` for every batch decision. Modelling choices:

- Batching: the rules of the live worker (taskserver/pipeline/worker.py, PARD Fig. 3b). A
  worker runs one batch at a time and collects the next one right after the previous one
  begins execution. The open batch has a target size, `feasible_target` (the live function) of
  admitted + queued over the module's feasible sizes up to b_k; it only grows while the batch
  is open, and requests beyond it wait in the queue. Each request is decided by
  `dropper.form_batch` with d_k at the target and t_e = max(expected end of the running batch,
  now) (now for an idle worker). When the running batch ends, the worker collects again and
  the open batch starts; at that start the requests whose decision it outdated (decided at a
  smaller target, or with a t_e more than the worker's `RECHECK_SLACK_S` before the start)
  are decided again with `dropper.decide` (W_k = 0, d_k at the final target), as the live
  `_recheck` does, and the dropped ones leave the batch. A batch of n runs d_k(max(n, b_1))
  from the profile (n need not be a profiled size: the profile interpolates linearly).
- b_k (Nexus's rule, `nexus_batch_sizes`, or `SimConfig.max_batch`): the SLO is split over the
  longest path through each module in proportion to d_k at its largest feasible size, and b_k
  is the largest feasible size whose worst case, a full batch wait plus execution (2 d_k(b)),
  fits that share; the smallest feasible size when none does. It stands for the largest size
  of a live module's ``batch_sizes``.
- Workers: a fixed number per module (default 1), provisioned before the run, or, with
  `SimConfig.scaling`, as many as the live runtime's WorkerScaler (taskserver.pard.scaling)
  decides every ``period_s`` of virtual time from each module's arrivals and one worker's
  profiled throughput b_k / d_k(b_k) (PARD §5.1 resource scaling). A started worker takes
  requests only after its cold start (§2: bursts are exactly when scaling cannot follow in
  time); a stopped one that is still starting goes at once, a serving one takes nothing new
  and leaves once its queue, open batch and running batch are done. A module with several
  serving workers sends each request to the one with the fewest requests queued, collecting
  or running (first such worker on ties).
- Durations: the profile's d_k(n) times a seeded log-normal factor of mean 1 and coefficient
  of variation `duration_cv` (default 0.05); t_e uses the profiled duration, without noise.
- DAG: a module with several ``subs`` sends the request to each (split), or, with
  ``branches``, to the subs it takes, drawn per request from the seed and the request's index
  with the live draw (taskserver/pipeline/routing.py), so every policy sees the same routes;
  one with several ``pres`` takes it when every branch it took has arrived (merge; t_r is the
  last arrival). A request completes when every sink it reaches has finished it. A drop in
  one branch drops the request: its sibling sub-requests leave their queues and open batches
  at once (already running ones run to the end, and that compute is invalid).
- State exchange every `exchange_period_s` of virtual time: each module sets its batch size to
  the mean size it ran in the last period, publishes its snapshot through its StateExchange,
  every other planner merges it, and PARD-family planners refresh w_k. Messages take no time.
- Metrics: a PardMetrics fed with every arrival, batch, drop and completion; goodput over time
  is sampled from it once a second (window `goodput_window_s`).

What still differs from the live worker: (1) the planner's published batch size is the mean
size run in the last exchange period (above), where the live worker sets it to the target at
every launch and starts from the smallest feasible size (this moves Clipper++'s SLO shares and
the downstream d_k of PARD's estimates); (2) no duration adaptation (`adapt_durations`), so t_e
and the recheck use the profiled d_k while batches run with noise; (3) for the droppers other
than PARD, the shell does not record Q_k and W_k in the planner (no decision of theirs reads
them); (4) the order at a batch end is collect, launch, collect again, then forward the
finished batch, where the live worker forwards before its second collect (the next module's
queue is another worker's, so no decision here sees the difference); (5) no model errors,
cancellations or process boundaries; (6) with several workers, each has its own queue and
takes requests at their arrival (PARD §4.1's dispatcher, ④ before ⑤), where a live module
keeps one queue and hands each batch to an idle worker.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadtests.sim.pipeline_model import PipelineModel, SimConfig, nexus_batch_sizes
from taskserver.pard import (
    Dropper,
    ModuleSummary,
    PardMetrics,
    PipelineRequest,
    PipelineSummary,
    Priority,
    RequestBroker,
    ScalingDecision,
    StateExchange,
    StatePlanner,
    WorkerScaler,
    create_dropper,
)
from taskserver.pipeline.routing import RouteState
from taskserver.pipeline.worker import RECHECK_SLACK_S, feasible_target

__all__ = [
    "DROPPED",
    "LATE",
    "ON_TIME",
    "BatchRecord",
    "PipelineModel",
    "PipelineRun",
    "PrioritySample",
    "SimConfig",
    "TimelinePoint",
    "nexus_batch_sizes",
    "simulate_pipeline",
]

ON_TIME, LATE, DROPPED = 1, 2, 3
"""Request outcome codes (0: still in flight)."""


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch execution."""

    module_id: str
    worker: int
    start_s: float
    duration_s: float
    size: int


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """PardMetrics sampled at the end of one second of the run."""

    time_s: float
    goodput_rps: float
    on_time: int
    dropped: int
    late: int


@dataclass(frozen=True, slots=True)
class PrioritySample:
    """One module's adaptive priority (PARD §4.3) at the end of one second of the run: the
    share of its serving workers popping HBF, and their mean mu and eps. Only modules whose
    queues adapt (PARD, instant-switch) are sampled."""

    time_s: float
    module_id: str
    serving: int
    hbf_share: float
    load_factor: float
    """Mean mu of the workers that have one (NaN: none yet)."""
    epsilon: float


@dataclass(slots=True)
class PipelineRun:
    """Everything one run produced: per-request outcomes, batches, metrics."""

    pipeline: str
    dropper: str
    slo_s: float
    max_batch: dict[str, int]
    arrivals_s: np.ndarray
    finish_s: np.ndarray
    """When each request completed or was dropped (NaN: never)."""
    outcome: np.ndarray
    """ON_TIME, LATE or DROPPED per request."""
    dropped_at: list[str | None]
    """The module that dropped each request (None: not dropped)."""
    batches: list[BatchRecord]
    summary: PipelineSummary
    modules: dict[str, ModuleSummary]
    timeline: list[TimelinePoint] = field(default_factory=list)
    wall_s: float = 0.0
    scaling: list[ScalingDecision] = field(default_factory=list)
    """Every decision of the worker scaler, in time order (empty with fixed workers)."""
    priority: list[PrioritySample] = field(default_factory=list)
    """Each adaptive module's HBF/LBF state, sampled every second (empty for other policies)."""

    @property
    def latency_s(self) -> np.ndarray:
        """End-to-end latency of each completed request (NaN for dropped ones)."""
        lat = self.finish_s - self.arrivals_s
        return np.where(self.outcome == DROPPED, np.nan, lat)

    def drops_by_module(self) -> dict[str, int]:
        """Requests dropped at each module (every module listed)."""
        return {m: s.drops for m, s in self.modules.items()}


class _Req:
    __slots__ = ("at", "dead", "index", "route", "sent_s", "sinks_left")

    def __init__(self, index: int, sent_s: float, sinks: int, route: RouteState) -> None:
        self.index = index
        self.sent_s = sent_s
        self.sinks_left = sinks
        self.dead = False
        self.route = route  # the branches it took, the merges it waits for
        self.at: dict[str, _Worker] = {}  # module -> worker where it is queued or collected


class _Worker:
    __slots__ = (
        "expected_end_s",
        "index",
        "module",
        "open",
        "queue",
        "ready_s",
        "retiring",
        "running",
        "target",
    )

    def __init__(self, module: _Module, index: int, ready_s: float = 0.0) -> None:
        self.module = module
        self.index = index
        self.ready_s = ready_s  # takes requests from then on (the end of its cold start)
        self.retiring = False
        self.queue = module.dropper.new_queue()
        # the batch being collected, in admission order: id -> (request, target, t_e decided at)
        self.open: dict[int, tuple[PipelineRequest, int, float]] = {}
        self.target = 0  # the open batch's target size; 0: none open
        self.running: list[PipelineRequest] | None = None
        self.expected_end_s = 0.0  # t_e: start + profiled duration of the running batch

    def load(self) -> int:
        return len(self.queue) + len(self.open) + len(self.running or ())


class _Module:
    __slots__ = (
        "arrived",
        "batch_items",
        "batches",
        "counted",
        "dropper",
        "exchange",
        "id",
        "max_batch",
        "planner",
        "serving",
        "sizes",
        "subs",
        "workers",
    )

    def __init__(self, module_id: str, planner: StatePlanner, dropper: Dropper) -> None:
        self.id = module_id
        self.planner = planner
        self.dropper = dropper
        self.exchange = StateExchange()
        self.workers: list[_Worker] = []  # every worker, starting and retiring ones too
        self.serving: list[_Worker] = []  # those that take requests
        self.arrived = 0  # requests delivered (the scaler's rate)
        self.counted = 0  # of which handed to the scaler
        self.max_batch = 1
        self.sizes: tuple[int, ...] = (1,)  # feasible sizes up to b_k, ascending
        self.subs: tuple[str, ...] = ()
        self.batches = 0  # batches started since the last exchange
        self.batch_items = 0


_END, _EXCHANGE, _SAMPLE, _SCALE, _READY = 0, 1, 2, 3, 4


class _Sim:
    def __init__(self, model: PipelineModel, arrivals: np.ndarray, dropper: str, cfg: SimConfig):
        self.model = model
        self.cfg = cfg
        self.arrivals = arrivals
        self.slo_s = model.slo_s
        self.max_batch = dict(cfg.max_batch or nexus_batch_sizes(model))
        self.rng = random.Random(cfg.seed)
        sigma2 = math.log1p(cfg.duration_cv**2)
        self.noise = (-sigma2 / 2.0, math.sqrt(sigma2))
        self.metrics = PardMetrics(window_s=cfg.goodput_window_s)
        self.modules: dict[str, _Module] = {}
        self.scaler: WorkerScaler | None = None
        if cfg.scaling is not None:
            initial = {m: cfg.workers_of(m) for m in model.modules}
            self.scaler = WorkerScaler(cfg.scaling, model.modules, initial=initial)
        self.scaling: list[ScalingDecision] = []
        self.worker_ids = 0
        for m in model.modules:
            planner = StatePlanner(
                m,
                model.graph,
                model.profile,
                window_s=cfg.queue_window_s,
                wait_quantile=cfg.wait_quantile,
                wait_samples=cfg.wait_samples,
                batch_sizes=self.max_batch,
                workers=cfg.workers_of(m),
                seed=cfg.seed,
            )
            mod = _Module(m, planner, create_dropper(dropper, planner))
            mod.max_batch = self.max_batch[m]
            mod.sizes = (*(b for b in model.batch_sizes[m] if b < mod.max_batch), mod.max_batch)
            mod.subs = model.subs[m]
            n = cfg.workers_of(m) if self.scaler is None else self.scaler.workers(m)[0]
            mod.workers = [_Worker(mod, i) for i in range(n)]
            mod.serving = list(mod.workers)
            self.worker_ids = max(self.worker_ids, n)
            self.modules[m] = mod
        self.dropper_name = self.modules[model.source].dropper.name
        self.refresh = isinstance(self.modules[model.source].dropper, RequestBroker)
        n = len(arrivals)
        self.finish = np.full(n, np.nan)
        self.outcome = np.zeros(n, dtype=np.int8)
        self.dropped_at: list[str | None] = [None] * n
        self.batches: list[BatchRecord] = []
        self.timeline: list[TimelinePoint] = []
        self.priority: list[PrioritySample] = []
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.in_flight = 0
        self.counts = [0, 0, 0]  # on time, late, dropped

    def push(self, t: float, kind: int, obj: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, obj))

    def run(self) -> None:
        arrivals, events = self.arrivals.tolist(), self.events
        self.push(self.cfg.exchange_period_s, _EXCHANGE, None)
        self.push(1.0, _SAMPLE, None)
        if self.scaler is not None:
            self.push(self.scaler.config.period_s, _SCALE, None)
        sinks = len(self.model.sinks)
        i, n = 0, len(arrivals)
        horizon = math.ceil(arrivals[-1]) if n else 0.0  # sample at least every trace second
        while True:
            t_next = arrivals[i] if i < n else math.inf
            if events and events[0][0] <= t_next:
                t, _, kind, obj = heapq.heappop(events)
                if kind == _END:
                    self.end_batch(obj, t)
                elif i >= n and not self.in_flight and t > horizon:
                    continue  # periodic events stop once every request has ended
                elif kind == _EXCHANGE:
                    self.exchange(t)
                elif kind == _SCALE:
                    self.scale(t)
                elif kind == _READY:
                    self.ready(obj, t)
                else:
                    self.sample(t)
            elif i < n:
                req = _Req(i, t_next, sinks, self.model.routing.start())
                self.metrics.arrived(i, self.model.name, self.slo_s, t_next)
                self.in_flight += 1
                self.deliver(req, self.model.source, t_next)
                i += 1
            else:
                return

    # ---- request flow ---------------------------------------------------------------------

    def deliver(self, req: _Req, module_id: str, now: float) -> None:
        if req.dead:
            return
        mod = self.modules[module_id]
        mod.arrived += 1
        workers = mod.serving
        w = workers[0] if len(workers) == 1 else min(workers, key=_Worker.load)
        w.queue.push(PipelineRequest(req.index, req.sent_s + self.slo_s, self.slo_s, now, req), now)
        req.at[module_id] = w
        if w.running is None:
            self.start_batch(w, now)
        else:
            self.fill(w, now)

    def fill(self, w: _Worker, now: float) -> None:
        """Decide queued requests into the open batch, up to its target (the live `_collect`)."""
        queued = len(w.queue)
        if not queued:
            return
        mod = w.module
        admitted = len(w.open)
        target = w.target = max(w.target, feasible_target(admitted + queued, mod.sizes))
        room = target - admitted
        if room <= 0:
            return
        expected_start = w.expected_end_s if w.running is not None else now
        ctx = mod.planner.context(max(expected_start, now), target)
        plan = mod.dropper.form_batch(w.queue, ctx, now, room)
        for request, _ in plan.admitted:
            w.open[request.request_id] = (request, target, ctx.expected_start_s)
        for request, _ in plan.dropped:
            self.drop(request.item, mod.id, now)

    def recheck(self, w: _Worker, now: float) -> None:
        """Decide again, at the batch's start, requests whose decision it outdated (`_recheck`)."""
        target, late = w.target, now - RECHECK_SLACK_S
        stale = [r for r, size, t_e in w.open.values() if size < target or t_e < late]
        if not stale:
            return
        mod = w.module
        ctx = mod.planner.context(now, target)
        decisions = [(r, mod.dropper.decide(r, ctx, now)) for r in stale]
        for request, decision in decisions:
            if not decision.admit:
                del w.open[request.request_id]
                self.drop(request.item, mod.id, now)

    def start_batch(self, w: _Worker, now: float) -> None:
        """An idle worker collects and launches until a batch runs or nothing is left."""
        self.fill(w, now)
        while w.running is None and w.open:
            self.launch(w, now)
            self.fill(w, now)  # Fig. 3b: collect the next batch right after this one begins

    def launch(self, w: _Worker, now: float) -> None:
        """Start the open batch, after the recheck; t_e = now + profiled d_k."""
        mod = w.module
        self.recheck(w, now)
        if not w.open:
            w.target = 0
            return
        batch = [r for r, _, _ in w.open.values()]
        w.open.clear()
        w.target = 0
        for r in batch:
            r.item.at.pop(mod.id, None)
        profiled_s = self.model.duration_s(mod.id, max(len(batch), mod.sizes[0]))
        mu, sigma = self.noise
        duration_s = (
            profiled_s * math.exp(mu + sigma * self.rng.gauss(0.0, 1.0)) if sigma else profiled_s
        )
        w.running = batch
        w.expected_end_s = now + profiled_s
        mod.batches += 1
        mod.batch_items += len(batch)
        self.batches.append(BatchRecord(mod.id, w.index, now, duration_s, len(batch)))
        self.push(now + duration_s, _END, (w, duration_s))

    def end_batch(self, obj: tuple[_Worker, float], now: float) -> None:
        w, duration_s = obj
        batch, w.running = w.running or [], None
        mod = w.module
        self.metrics.batch_executed(mod.id, [r.request_id for r in batch], duration_s, now)
        self.start_batch(w, now)
        if w.retiring and not w.load():
            mod.workers.remove(w)  # a stopped worker leaves once it has served what it held
        for r in batch:
            req: _Req = r.item
            if not req.dead:
                self.forward(req, mod, now)

    def forward(self, req: _Req, mod: _Module, now: float) -> None:
        """Hand a finished request on: to the subs it takes; merges once every branch it took
        is in (routing.py); done when every sink it reaches has finished."""
        if not mod.subs:
            req.sinks_left -= 1
            if req.sinks_left == 0:
                self.complete(req, now)
            return
        routing = self.model.routing
        taken = mod.subs
        if routing.splits(mod.id):
            if req.route.key is None:
                req.route.key = b"sim:%d:%d" % (self.cfg.seed, req.index)
            taken = routing.taken(mod.id, req.route.key)
        ready, gone = req.route.passed(mod.id, taken)
        # A sink it never reaches counts as reached (a split takes at least one sub, so some
        # sink is still ahead of it).
        for module_id in gone:
            if not self.modules[module_id].subs:
                req.sinks_left -= 1
        for sub in ready:
            self.deliver(req, sub, now)

    def complete(self, req: _Req, now: float) -> None:
        latency_s = now - req.sent_s
        self.metrics.completed(req.index, latency_s, now)
        on_time = latency_s <= self.slo_s
        self.outcome[req.index] = ON_TIME if on_time else LATE
        self.counts[0 if on_time else 1] += 1
        self.finish[req.index] = now
        self.in_flight -= 1

    def drop(self, req: _Req, module_id: str, now: float) -> None:
        req.at.pop(module_id, None)
        if req.dead:
            return
        req.dead = True
        self.metrics.dropped(req.index, module_id, now)
        self.outcome[req.index] = DROPPED
        self.counts[2] += 1
        self.finish[req.index] = now
        self.dropped_at[req.index] = module_id
        self.in_flight -= 1
        for w in req.at.values():  # sibling sub-requests of a DAG leave their queues
            if w.queue.remove(req.index) is None and w.open.pop(req.index, None) is not None:
                if not w.open:
                    w.target = 0  # an emptied open batch has no size to keep
        req.at.clear()

    # ---- periodic events ------------------------------------------------------------------

    def exchange(self, now: float) -> None:
        states = []
        for mod in self.modules.values():
            if mod.batches:
                mod.planner.set_batch_size(max(1, round(mod.batch_items / mod.batches)))
                mod.batches = mod.batch_items = 0
            state = mod.exchange.publish(mod.planner, now)
            if state is not None:
                states.append(state)
        for mod in self.modules.values():
            for state in states:
                mod.planner.merge(state)
            if self.refresh:
                mod.planner.refresh()
        self.push(now + self.cfg.exchange_period_s, _EXCHANGE, None)

    def scale(self, now: float) -> None:
        """One decision of the worker scaler (the live executor's `scale`)."""
        scaler = self.scaler
        assert scaler is not None
        rps = {}
        for mod in self.modules.values():
            scaler.record_arrivals(mod.id, mod.arrived - mod.counted, now)
            mod.counted = mod.arrived
            rps[mod.id] = mod.max_batch / self.model.duration_s(mod.id, mod.max_batch)
        decision = scaler.decide(now, rps)
        self.scaling.append(decision)
        for part in decision.modules:
            mod = self.modules[part.module_id]
            for _ in range(part.start):
                w = _Worker(mod, self.worker_ids, part.ready_at_s)
                self.worker_ids += 1
                mod.workers.append(w)
                self.push(part.ready_at_s, _READY, w)
            starting = [w for w in mod.workers if w not in mod.serving and not w.retiring]
            for w in starting[len(starting) - part.stop_starting :] if part.stop_starting else ():
                w.retiring = True  # still in its cold start: it holds nothing
                mod.workers.remove(w)
            for _ in range(part.stop - part.stop_starting):
                if len(mod.serving) <= 1:
                    break
                w = min(reversed(mod.serving), key=_Worker.load)  # the newest of the least loaded
                mod.serving.remove(w)
                w.retiring = True
                if not w.load():
                    mod.workers.remove(w)
        self.push(now + scaler.config.period_s, _SCALE, None)

    def ready(self, w: _Worker, now: float) -> None:
        """A started worker's cold start ended: it takes requests from now on."""
        if not w.retiring:
            w.module.serving.append(w)

    def sample(self, now: float) -> None:
        s = self.metrics.pipeline(self.model.name, now)
        self.timeline.append(TimelinePoint(now, s.goodput_rps, s.on_time, s.dropped, s.late))
        for mid, mod in self.modules.items():
            ctl = [c for w in mod.serving if (c := getattr(w.queue, "controller", None))]
            if not ctl:
                continue
            mus = [c.load_factor for c in ctl if c.load_factor is not None]
            self.priority.append(
                PrioritySample(
                    now,
                    mid,
                    len(ctl),
                    sum(c.priority is Priority.HBF for c in ctl) / len(ctl),
                    sum(mus) / len(mus) if mus else math.nan,
                    sum(c.epsilon for c in ctl) / len(ctl),
                )
            )
        self.push(now + 1.0, _SAMPLE, None)


def simulate_pipeline(
    model: PipelineModel,
    arrivals_s: Sequence[float] | np.ndarray,
    dropper: str = "pard",
    config: SimConfig | None = None,
) -> PipelineRun:
    """Run every arrival through the pipeline under `dropper` until the last request ends."""
    arrivals = np.sort(np.asarray(arrivals_s, dtype=float))
    if len(arrivals) and not (np.isfinite(arrivals).all() and arrivals[0] >= 0):
        raise ValueError("pipeline arrivals_s: need finite times >= 0")
    t0 = time.perf_counter()
    sim = _Sim(model, arrivals, dropper, config or SimConfig())
    sim.run()
    end = max([*sim.finish[np.isfinite(sim.finish)].tolist(), 0.0])
    return PipelineRun(
        pipeline=model.name,
        dropper=sim.dropper_name,
        slo_s=model.slo_s,
        max_batch=sim.max_batch,
        arrivals_s=arrivals,
        finish_s=sim.finish,
        outcome=sim.outcome,
        dropped_at=sim.dropped_at,
        batches=sim.batches,
        summary=sim.metrics.pipeline(model.name, end),
        modules={m: sim.metrics.module(m) for m in model.modules},
        timeline=sim.timeline,
        wall_s=time.perf_counter() - t0,
        scaling=sim.scaling,
        priority=sim.priority,
    )
