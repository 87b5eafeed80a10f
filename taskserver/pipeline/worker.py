"""A module's worker: its DEPQ, PARD's decision at t_b, dynamic batching, one model thread.

Batching follows PARD Fig. 3b: the next batch is *open* from the moment the previous one
starts until it ends, so the model never idles while requests wait. While a batch is open,
queued requests are fetched in the dropper's queue order (HBF/LBF for PARD) and each is
decided at t_b by ``dropper.form_batch`` with t_e = the running batch's expected end; an
admitted request holds its place, a dropped one fails its whole pipeline request at once.

Batch size rule. The open batch has a target size, a feasible size: the largest feasible
size <= (admitted + queued), or the smallest feasible size when fewer are there. The target
only grows while the batch is open, and requests beyond it wait in the DEPQ for a later one,
so under a burst every batch is a feasible size and under load the size follows the backlog
(arrivals during one batch make up the next: throughput b / d(b) rises to meet the load).
Decisions use d_k at the target size. Since the target may grow after a request was
admitted, and the running batch may overrun its profiled d_k, a request whose decision the
batch's real start outdated is decided once more at that start (`_recheck`): without that,
on an emulated traffic pipeline at its capacity, most drops came one module too late
(invalid rate 57% against 8%). A batch runs short of its target only when admitted requests
left it (rechecked, dropped on another branch, cancelled) or drops emptied the queue; it
then runs with the requests it has: never held back, never padded.

Workers (PARD §4.1: one controller and several workers per module). A module has one or
more replicas, each a model runner (its own onnxruntime session) with its own single thread,
so the event loop never blocks and a replica runs one batch at a time; the inputs are built
in that thread too. The module keeps one queue and one open batch; the dispatcher hands the
open batch to an idle replica (the one idle longest), and while every replica is busy the
open batch's t_e is the earliest expected end among them (the earliest-free replica takes
it). Replicas join (`add_replica`, once their session is built and warmed off the serving
path) and leave (`retire_replica`: no new batch, closed when its running batch ends) at run
time, as the pipeline's WorkerScaler decides (taskserver.pard.scaling).

A replica's runner may run its model in a child process (process.py: ``worker_mode``); the
replica's thread then builds the batch in the runner's shared buffer and waits for the
child, and everything above stays here. A runner that loses its process (WorkerLost) fails
that batch's requests; the replica then counts as busy until a new process is started,
loaded and warm (``restart()``, in the replica's thread: the decisions see it busy until
its expected end, the runner's last start time from now), and serves again. A retired or
closed replica's runner is closed (``close()``: its process stopped) in its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from taskserver.abc import ExecutorError
from taskserver.pard import Decision, Dropper, PipelineRequest, RequestBroker, StatePlanner
from taskserver.pipeline.config import ModuleConfig
from taskserver.pipeline.errors import InferenceFailed, WorkerLost
from taskserver.pipeline.flight import BatchRecord, Flight, ModuleTiming
from taskserver.pipeline.sessions import ModelRunner

__all__ = ["ModuleWorker", "Replica", "Router", "close_runner", "feasible_target"]

log = logging.getLogger(__name__)

_HISTORY = 256  # batches kept per module for inspection
RECHECK_SLACK_S = 0.001  # a batch that starts this late after its t_e is rechecked


_ADAPT_WEIGHT = 0.1  # EWMA weight of one batch in the duration scale
_ADAPT_STEP = 0.02  # relative change of the scale that reaches the planner
_SCALE_MIN, _SCALE_MAX = 0.5, 4.0
RESTART_RETRY_S = 1.0  # a replica whose new process failed to start tries again after this


def close_runner(runner: ModelRunner) -> None:
    """Release what a runner holds (a ProcessRunner's child); runners without close: nothing."""
    close = getattr(runner, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # a runner that fails to close must not stop the others closing
            log.exception("closing %r failed", runner)


def _restart_after(delay_s: float, runner: ModelRunner) -> None:
    """In a replica's thread: wait `delay_s`, then restart the runner's process."""
    if delay_s > 0:
        time.sleep(delay_s)
    runner.restart()  # type: ignore[attr-defined]


class Router(Protocol):
    """Where a worker sends what happened to its requests (the PipelineExecutor)."""

    def dropped(self, flight: Flight, module: ModuleConfig, decision: Decision, now: float) -> None:
        """The dropper dropped `flight` at `module`."""

    def failed(self, flight: Flight, module: ModuleConfig, error: ExecutorError) -> None:
        """The batch holding `flight` failed."""

    def executed(self, module: ModuleConfig, ids: list[int], exec_s: float, now: float) -> None:
        """A batch of `ids` ran for `exec_s`."""

    def forward(self, flight: Flight, module: ModuleConfig, output: np.ndarray, now: float) -> None:
        """`module` produced `output` for `flight`."""


class Replica:
    """One worker of a module: a model runner and the single thread that runs its batches."""

    __slots__ = (
        "batches",
        "end_s",
        "flights",
        "future",
        "idle_since_s",
        "index",
        "joined_s",
        "pool",
        "restarts",
        "retiring",
        "runner",
        "started_s",
        "target",
    )

    def __init__(self, index: int, runner: ModelRunner, pool: ThreadPoolExecutor) -> None:
        self.index = index
        self.runner = runner
        self.pool = pool
        self.future: asyncio.Future | None = None  # the running batch
        self.flights: list[Flight] = []
        self.target = 0
        self.started_s = 0.0
        self.end_s = 0.0  # t_e: the running batch's expected end
        self.idle_since_s = 0.0
        self.joined_s = 0.0  # when it began to serve (0: with the module)
        self.retiring = False
        self.batches = 0
        self.restarts = 0  # new processes after a lost one (its future: the restart)

    def release(self) -> concurrent.futures.Future[None]:
        """Close the runner in this replica's thread, after its running work; stop the thread."""
        done = self.pool.submit(close_runner, self.runner)
        self.pool.shutdown(wait=False)
        return done


def feasible_target(count: int, sizes: tuple[int, ...]) -> int:
    """The largest feasible size <= `count`, or the smallest when `count` is below it."""
    best = sizes[0]
    for size in sizes:
        if size > count:
            break
        best = size
    return best


class ModuleWorker:
    """One module's queue, open batch and model thread (PARD §4.1 ⑤ ⑥ ⑦)."""

    def __init__(
        self,
        module: ModuleConfig,
        runner: ModelRunner,
        planner: StatePlanner,
        dropper: Dropper,
        router: Router,
        *,
        clock: Callable[[], float] = time.perf_counter,
        adapt_durations: bool = False,
    ) -> None:
        self.module = module
        self.adapt_durations = adapt_durations
        self.runner = runner
        self.planner = planner
        self.dropper = dropper
        self.router = router
        self.clock = clock
        self.queue = dropper.new_queue()
        roi = module.roi_output
        self.roi_output = runner.output_name == "detections" if roi is None else roi
        # PARD's broker records Q_k and W_k itself; for the others the shell does.
        self._records = not isinstance(dropper, RequestBroker)
        # the open batch, in admission order: id -> (request, target and t_e it was decided at)
        self._open: dict[int, tuple[PipelineRequest, int, float]] = {}
        self._target = 0  # its target size; 0: none open
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"pipeline-{module.id}")
        self._pool = pool  # the first replica's thread
        self.replicas: list[Replica] = [Replica(0, runner, pool)]  # serving, in join order
        self._retired: list[Replica] = []  # left, still running their last batch
        self._replica_ids = 1
        self._finished: list[tuple[Replica, list[Flight], int, float, asyncio.Future]] = []
        self._completing: list[Flight] = []  # the finished batch being accounted for
        self._wake = asyncio.Event()
        self.arrivals = 0  # requests submitted here (the scaler's rate)
        self.worker_crashes = 0  # batches that lost their worker's process (WorkerLost)
        self.restart_failures = 0  # new processes that failed to start in a lost one's place
        self._closing = False
        self._releases: set[concurrent.futures.Future[None]] = set()  # runners closing
        self.sizes: Counter[int] = Counter()  # batch-size histogram
        self.batches = 0
        self.requests = 0
        self.short_batches = 0
        self.busy_s = 0.0  # prep + model time
        self.exec_s = 0.0  # model time alone
        self.hop_s = 0.0  # the part of exec_s a process runner's hop took (messages, copies)
        self.profiled_s = 0.0  # what the profile said those batches would take: d_k(target)
        self.duration_scale = 1.0  # EWMA of measured / profiled batch time (adapt_durations)
        # PARD decision cost on the loop: DEPQ push, planner context, form_batch / decide
        self.decide_ns = 0
        self.decided = 0  # requests decided (a recheck decides one again)
        self.decide_calls = 0  # timed calls (push, collect, recheck)
        self.decide_ns_by_request: dict[int, int] | None = None
        """Opt-in (a replay sets a dict): decision ns per request id, each call's time shared
        equally by the requests it decided. None: not kept."""
        self.history: deque[BatchRecord] = deque(maxlen=_HISTORY)

    def warm_up(self) -> float | None:
        """Warm the runner up on the thread that will run its batches; seconds, or None.

        On that thread, not the caller's: onnxruntime's CUDA provider keeps its cuBLAS and
        cuDNN handles per thread (a session's first run on a new thread took 2.3-3.6 ms
        where the next took 0.4-1.6 ms, on an H200). Runners without ``warm_up`` (stand-ins
        in tests) are skipped.
        """
        warm_up = getattr(self.runner, "warm_up", None)
        if warm_up is None:
            return None
        return self._pool.submit(warm_up).result()

    @property
    def id(self) -> str:
        """The module id."""
        return self.module.id

    @property
    def decide_s(self) -> float:
        """Seconds spent in PARD decisions (``decide_ns``)."""
        return self.decide_ns / 1e9

    def _charge(self, ns: int, *decided: Sequence[tuple[PipelineRequest, object]]) -> None:
        """Account one timed decision call of `ns` over the (request, decision) it made."""
        self.decide_ns += ns
        self.decide_calls += 1
        by_request = self.decide_ns_by_request
        if by_request is None:
            return
        count = sum(len(group) for group in decided)
        for group in decided:
            for request, _ in group:
                rid = request.request_id
                by_request[rid] = by_request.get(rid, 0) + ns // count

    @property
    def _running(self) -> asyncio.Future | None:
        """A running batch's future (the first replica's that runs one), or None."""
        return next((r.future for r in self.replicas if r.future is not None), None)

    @property
    def workers(self) -> int:
        """Replicas serving this module."""
        return len(self.replicas)

    def add_replica(self, runner: ModelRunner, pool: ThreadPoolExecutor, now: float) -> Replica:
        """A warmed runner and its thread join the module; the next batch may run on it."""
        replica = Replica(self._replica_ids, runner, pool)
        replica.idle_since_s = replica.joined_s = now
        self._replica_ids += 1
        self.replicas.append(replica)
        self.planner.set_workers(len(self.replicas))
        self._wake.set()
        return replica

    def retire_replica(self) -> Replica | None:
        """Take the newest replica out of service (an idle one first); None if one is left.

        It takes no new batch; its thread stops once its running batch has ended.
        """
        if len(self.replicas) <= 1:
            return None
        idle = [r for r in self.replicas if r.future is None]
        replica = (idle or self.replicas)[-1]
        self.replicas.remove(replica)
        replica.retiring = True
        self.planner.set_workers(len(self.replicas))
        if replica.future is None:
            self._release(replica)
        else:
            self._retired.append(replica)
        return replica

    def _release(self, replica: Replica) -> None:
        done = replica.release()
        self._releases.add(done)
        done.add_done_callback(self._releases.discard)

    @property
    def open_count(self) -> int:
        """Requests admitted into the open batch."""
        return len(self._open)

    def submit(self, flight: Flight, now: float) -> None:
        """Queue `flight` at this module (t_r = `now`)."""
        request = PipelineRequest(
            flight.request_id, flight.deadline_s, flight.budget_s, now, item=flight
        )
        start = time.perf_counter_ns()
        self.queue.push(request, now)
        self._charge(time.perf_counter_ns() - start, ((request, None),))
        flight.timings[self.id] = ModuleTiming(received_s=now)
        flight.where.add(self.id)
        self.arrivals += 1
        self._wake.set()

    def remove(self, request_id: int) -> bool:
        """Take a request out of the queue or the open batch; False when it holds neither."""
        if self.queue.remove(request_id) is not None:
            return True
        if self._open.pop(request_id, None) is None:
            return False
        if not self._open:
            self._target = 0  # an emptied open batch has no size to keep
        return True

    async def run(self) -> None:
        """The worker loop: decide, launch, forward; wakes on arrivals and batch ends."""
        while True:
            self._wake.clear()
            try:
                self._step()
            except Exception:  # a bug here must not strand the requests this worker holds
                log.exception("pipeline worker %s failed", self.module.label)
                self._fail_all(InferenceFailed(f"module {self.module.label}: internal error"))
            await self._wake.wait()

    def _step(self) -> None:
        finished, self._finished = self._finished, []
        for replica, flights, target, started_s, future in finished:
            self._completing = flights
            self._collect()
            self._dispatch()  # the model first, then the bookkeeping of the last batch
            self._complete(replica, flights, target, started_s, future)
            self._completing = []
        self._collect()
        self._dispatch()

    def _idle_replica(self) -> Replica | None:
        """The replica idle longest, or None while every one runs a batch."""
        idle = [r for r in self.replicas if r.future is None]
        return min(idle, key=lambda r: r.idle_since_s) if idle else None

    def _dispatch(self) -> None:
        """Launch the open batch on idle replicas until none is idle or nothing is open."""
        while self._open:
            replica = self._idle_replica()
            if replica is None:
                return
            runner = replica.runner
            if not getattr(runner, "alive", True) and hasattr(runner, "restart"):
                # its process died while idle (kill -9, out of memory): no batch is lost, but
                # it is counted and replaced as one that died running a batch
                self.worker_crashes += 1
                log.warning("module %s: %r died; starting a new one", self.module.label, runner)
                self._restart(replica, 0.0)
                continue
            self._launch(replica)  # none starts when the recheck dropped all: collect again
            self._collect()  # the next batch opens as this one starts (Fig. 3b)

    def _collect(self) -> None:
        """Decide queued requests into the open batch, up to its target (PARD t_b)."""
        queued = len(self.queue)
        if not queued:
            return
        admitted = len(self._open)
        target = max(self._target, feasible_target(admitted + queued, self.module.batch_sizes))
        self._target = target
        room = target - admitted
        if room <= 0:
            return
        now = self.clock()
        busy = [r.end_s for r in self.replicas if r.future is not None]
        expected_start = min(busy) if len(busy) == len(self.replicas) else now
        start = time.perf_counter_ns()
        context = self.planner.context(max(expected_start, now), target)
        plan = self.dropper.form_batch(self.queue, context, now, room)
        if self._records:
            for request, _ in plan.admitted:
                self.planner.record_queue_delay(now - request.received_s, now)
                self.planner.record_batch_wait(context.expected_start_s - now, context.duration_s)
        self._charge(time.perf_counter_ns() - start, plan.admitted, plan.dropped)
        self.decided += len(plan.admitted) + len(plan.dropped)
        for request, _ in plan.admitted:
            self._open[request.request_id] = (request, target, context.expected_start_s)
            flight: Flight = request.item  # type: ignore[assignment]
            flight.timings[self.id].joined_s = now
        for request, decision in plan.dropped:
            flight = request.item  # type: ignore[assignment]
            flight.where.discard(self.id)
            self.router.dropped(flight, self.module, decision, now)

    def _recheck(self, now: float) -> None:
        """Decide again, at the batch's start, requests whose decision the start outdated.

        Beyond the paper: the open batch's target grows with the backlog, so a request
        admitted early was estimated with d_k at a smaller size than the batch that runs; and
        when the running batch overruns its profiled d_k, the batch starts after the t_e the
        request was decided with. Eq. (3) at the start (W_k = 0, d_k at the final size) then
        drops it here, before this module spends compute on it, not at the next module.
        """
        target = self._target
        late = now - RECHECK_SLACK_S
        stale = [r for r, size, t_e in self._open.values() if size < target or t_e < late]
        if not stale:
            return
        start = time.perf_counter_ns()
        context = self.planner.context(now, target)
        decisions = [(r, self.dropper.decide(r, context, now)) for r in stale]
        self._charge(time.perf_counter_ns() - start, decisions)
        self.decided += len(decisions)
        for request, decision in decisions:
            if decision.admit:
                continue
            del self._open[request.request_id]
            flight: Flight = request.item  # type: ignore[assignment]
            flight.where.discard(self.id)
            self.router.dropped(flight, self.module, decision, now)

    def _launch(self, replica: Replica) -> None:
        """Hand the open batch to `replica`'s thread; t_e = now + d_k(target)."""
        now = self.clock()
        self._recheck(now)
        if not self._open:
            self._target = 0
            return
        flights: list[Flight] = [r.item for r, _, _ in self._open.values()]  # type: ignore[misc]
        target = self._target
        self._open.clear()
        self._target = 0
        for flight in flights:
            flight.where.discard(self.id)
            timing = flight.timings[self.id]
            timing.started_s = now
            timing.batch = len(flights)
        replica.started_s = now
        replica.end_s = now + self._duration_s(len(flights), target)
        if self.planner.state(self.id).batch_size != target:
            self.planner.set_batch_size(target)
        replica.flights = flights
        replica.target = target
        run = functools.partial(self._execute, replica.runner, flights)
        future = asyncio.get_running_loop().run_in_executor(replica.pool, run)
        future.add_done_callback(functools.partial(self._on_done, replica))
        replica.future = future

    def _duration_s(self, size: int, target: int) -> float:
        """d_k (the profile's, times the module's duration scale) of a batch of `size`."""
        return self._profiled_s(size, target) * self.planner.state(self.id).duration_scale

    def _profiled_s(self, size: int, target: int) -> float:
        """Profiled d_k of a batch of `size` (a short batch ends sooner), else of its target."""
        if size < target:
            try:
                return self.planner.profiled_s(self.id, max(size, self.module.batch_sizes[0]))
            except Exception:  # a profile that knows the feasible sizes only
                pass
        return self.planner.profiled_s(self.id, target)

    def _execute(
        self, runner: ModelRunner, flights: list[Flight]
    ) -> tuple[np.ndarray, float, float, int]:
        """In a replica's thread: build the batch's inputs, run the model; the last item is
        what a process runner's hop took of the model's time (ns; 0 in this process)."""
        shape, dtype = runner.input_shape, runner.input_dtype
        start = self.clock()
        inputs = [f.input_for(self.id, shape, dtype) for f in flights]
        lend = getattr(runner, "batch_buffer", None)  # a process runner's shared buffer
        buffer = lend(len(inputs)) if lend is not None else None
        batch = np.stack(inputs) if buffer is None else np.stack(inputs, out=buffer)
        ran = self.clock()
        hop_ns = getattr(runner, "hop_ns", 0)
        output = runner.run(batch)
        exec_s = self.clock() - ran
        hop_ns = getattr(runner, "hop_ns", 0) - hop_ns
        if not isinstance(output, np.ndarray) or output.shape[:1] != (len(flights),):
            raise InferenceFailed(
                f"module {self.module.label}: model returned shape "
                f"{getattr(output, 'shape', None)} for a batch of {len(flights)}"
            )
        return output, ran - start, exec_s, hop_ns

    def _on_done(self, replica: Replica, future: asyncio.Future) -> None:
        self._finished.append((replica, replica.flights, replica.target, replica.started_s, future))
        replica.future = None
        replica.flights = []
        replica.idle_since_s = self.clock()
        lost = not future.cancelled() and isinstance(future.exception(), WorkerLost)
        if lost:
            self.worker_crashes += 1
            log.warning("%s; starting a new one", future.exception())
        if lost and hasattr(replica.runner, "restart") and not (replica.retiring or self._closing):
            self._restart(replica, 0.0)
        elif replica.retiring:
            self._retired.remove(replica)
            self._release(replica)
        self._wake.set()

    def _restart(self, replica: Replica, delay_s: float) -> None:
        """Start a new process for `replica` in its thread; busy until then (module docstring)."""
        now = self.clock()
        replica.started_s = now
        replica.end_s = now + delay_s + getattr(replica.runner, "start_s", 0.0)
        run = functools.partial(_restart_after, delay_s, replica.runner)
        future = asyncio.get_running_loop().run_in_executor(replica.pool, run)
        future.add_done_callback(functools.partial(self._on_restarted, replica))
        replica.future = future

    def _on_restarted(self, replica: Replica, future: asyncio.Future) -> None:
        replica.future = None
        replica.idle_since_s = self.clock()
        error = None if future.cancelled() else future.exception()
        if replica.retiring:
            self._retired.remove(replica)
            self._release(replica)
        elif self._closing:
            pass  # close() closes it with the others
        elif error is None and not future.cancelled():
            replica.restarts += 1
        else:
            self.restart_failures += 1
            log.error("module %s: a new worker process failed: %s", self.module.label, error)
            if len(self.replicas) > 1:  # the others serve on; this one goes
                self.replicas.remove(replica)
                self.planner.set_workers(len(self.replicas))
                self._release(replica)
            else:  # the last one: nobody waits on it meanwhile, then it tries again
                self._fail_all(InferenceFailed(f"module {self.module.label}: no worker: {error}"))
                self._restart(replica, RESTART_RETRY_S)
        self._wake.set()

    def _complete(
        self,
        replica: Replica,
        flights: list[Flight],
        target: int,
        started_s: float,
        future: asyncio.Future,
    ) -> None:
        """Account for a finished batch and forward each live request's output."""
        now = self.clock()
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            if not isinstance(error, ExecutorError):
                error = InferenceFailed(f"module {self.module.label}: {error!r}")
            for flight in flights:
                if flight.alive:
                    self.router.failed(flight, self.module, error)
            return
        output, prep_s, exec_s, hop_ns = future.result()
        self.hop_s += hop_ns / 1e9
        ids = [f.request_id for f in flights]
        self.batches += 1
        replica.batches += 1
        self.requests += len(flights)
        self.sizes[len(flights)] += 1
        self.short_batches += len(flights) < target
        self.busy_s += prep_s + exec_s
        self.exec_s += exec_s
        self.profiled_s += self.planner.profiled_s(self.id, target)
        if self.adapt_durations:
            self._adapt(prep_s + exec_s, len(flights), target)
        self.history.append(
            BatchRecord(self.id, tuple(ids), target, started_s, now, exec_s, replica.index)
        )
        self.router.executed(self.module, ids, exec_s, now)
        for i, flight in enumerate(flights):
            timing = flight.timings[self.id]
            timing.prep_s, timing.exec_s = prep_s, exec_s
            if flight.alive:
                self.router.forward(flight, self.module, output[i], now)

    def _adapt(self, took_s: float, size: int, target: int) -> None:
        """Follow how much slower (or faster) than profiled this module's batches run.

        Beyond the paper, whose d_k come from the offline profile alone: on a shared host the
        batches of a loaded pipeline ran 1.2-1.6x their profiled time, and eq. (3) with the
        profile's d_k then admits requests that end late. The scale is an EWMA (weight
        ``_ADAPT_WEIGHT`` per batch) of measured / profiled time, clipped to
        [``_SCALE_MIN``, ``_SCALE_MAX``]; it reaches the module's own planner at once when it
        moves by more than ``_ADAPT_STEP``, and the other modules' planners with the next
        state exchange (``ModuleState.duration_scale``).
        """
        ratio = min(max(took_s / self._profiled_s(size, target), _SCALE_MIN), _SCALE_MAX)
        self.duration_scale += _ADAPT_WEIGHT * (ratio - self.duration_scale)
        current = self.planner.state(self.id).duration_scale
        if abs(self.duration_scale - current) > _ADAPT_STEP * current:
            self.planner.set_duration_scale(self.duration_scale)

    def _fail_all(self, error: ExecutorError) -> None:
        held = [*self._completing, *(r.item for r, _, _ in self._open.values())]
        self._completing = []
        self._open.clear()
        self._target = 0
        while (request := self.queue.pop(self.clock())) is not None:
            held.append(request.item)
        for flight in held:
            if isinstance(flight, Flight) and flight.alive:
                flight.where.discard(self.id)
                self.router.failed(flight, self.module, error)

    async def close(self) -> None:
        """Wait for the running batches, then close the runners and stop the model threads."""
        if self._closing:
            return
        self._closing = True
        replicas = [*self.replicas, *self._retired]
        running = [r.future for r in replicas if r.future is not None]
        if running:
            await asyncio.wait(running)
        # each in its own thread, so the processes stop together; and those retired before
        closing = [r.release() for r in (*self.replicas, *self._retired)]
        pending = [*closing, *self._releases]
        if pending:
            await asyncio.gather(*map(asyncio.wrap_future, pending), return_exceptions=True)
