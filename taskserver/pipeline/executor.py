"""PipelineExecutor: a multi-model ONNX pipeline behind the task server's Executor interface.

One ModuleWorker per module (queue, PARD decision, dynamic batching, model thread), routed
along the pipeline's DAG: an output goes to every sub (split), or, at a module with
``branches``, to the subs this request takes; a sub with several pres waits for every branch
the request took (merge, routing.py, tensors.py). A request completes when every sink it
reaches has finished. A request carries one id through every branch, so a drop or a
cancellation anywhere takes it out of every queue at once and discards what its other
branches still compute.

Stages (``PipelineConfig.local`` / ``peers``): a pipeline may be split across task servers,
each running one stage (a connected group of modules with one entry). Where a local module's
sub runs elsewhere, the request is handed on (remote.py) once all of that sub's pres are done
here, and counts as one of this request's ends until the later stage answers; its outputs
and module timings join this stage's result, and a drop there fails the request here at
once. Payloads with ``entry`` are hand-offs from the stage before; with ``branches``, a
hand-off enters only the modules the request took, and a later stage none of whose entry
modules it took is not one of its ends.

State exchange (PARD §4.1 ②): modules in this process merge each other's snapshots
directly; the states of modules in later stages arrive through each PeerLink's poll (at
most once per period) and are merged the same way. Each module publishes at most once per
``exchange_period_s`` (StateExchange); the publications are staggered over the period, one
module per tick, and a planner refreshes w_k (planner.refresh) in its tick when a state it
depends on was merged since its last refresh, so no tick holds the loop for more than one
refresh.

Serving: the executor queues and batches on its own, so the task server must hand it many
requests at once (``slots`` well above the largest batch size); with one slot every batch
would hold one request. A request's budget is the smaller of the payload's ``budget_ms``
and the one the task server passes (the SLO left after the task's wait in its queue).

Workers (PARD §4.1, §5.1): each local module starts with ``config.workers`` replicas (a
fixed count), or, with a ScalingConfig, a WorkerScaler decides every ``period_s`` from each
module's arrivals how many it needs (taskserver.pard.scaling); a new replica's session is
built and warmed in its own thread, off the serving path, and joins when that is done and
its cold start has passed; a stopped one finishes its running batch first. With
``worker_mode`` process (sessions.resolve_worker_mode), each replica's session runs in a
child process of its own (process.ProcessRunner): the starting replicas' children start
together, a new replica's child is spawned, loaded and warmed in that thread, a stopped
one's child is stopped, a lost one is replaced (worker.py), and close() stops them all.

Metrics: one PardMetrics per executor (goodput, drop rate, invalid rate, §5.1). A cancelled
request and one whose batch failed end there as drops at the pseudo-modules CANCELLED and
FAILED (so their compute counts as invalid); ``snapshot()`` reports them apart from the
policy's drops per module.

Result (JSON object)::

    {"pipeline": "traffic", "request": 17, "budget_ms": 400.0, "latency_ms": 41.2,
     "provider": "CPUExecutionProvider",   # comma-joined if modules differ
     "outputs": {"3": {"module": "text_recognition", "shape": [48, 37],
                       "top_k": [[flat_index, value], ...], "values": [...] (<= 16 values)}},
     "modules": {"1": {"name": "object_detection", "queue_ms": .., "batch_wait_ms": ..,
                       "prep_ms": .., "exec_ms": .., "batch": 4, "provider": ".."}, ...}}

``request`` is the executor's id of the request (batch records name it); ``outputs`` holds
the sinks; ``modules`` every module the request ran on, in visiting order.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from taskserver import jsonbody
from taskserver.abc import Executor, ExecutorError, TaskDropped
from taskserver.pard import (
    Decision,
    ModuleState,
    PardMetrics,
    ScalingConfig,
    ScalingDecision,
    StateExchange,
    StatePlanner,
    UnknownModule,
    WorkerScaler,
    create_dropper,
)
from taskserver.pipeline.config import ModuleConfig, PipelineConfig
from taskserver.pipeline.errors import (
    BadPayload,
    InferenceFailed,
    PipelineClosed,
    PipelineConfigError,
    PipelineDropped,
)
from taskserver.pipeline.flight import BatchRecord, Flight
from taskserver.pipeline.process import ProcessRunner
from taskserver.pipeline.remote import PeerLink, PeerResult, PeerUnavailable, encode_states
from taskserver.pipeline.routing import route_key
from taskserver.pipeline.sessions import (
    ModelRunner,
    OnnxModel,
    default_intra_op_threads,
    resolve_providers,
    resolve_worker_mode,
    usable_cpus,
)
from taskserver.pipeline.tensors import (
    FULL_REGION,
    HANDOFF_MAGIC,
    Region,
    detection_region,
    handoff_payload,
    parse_payload,
    summarize_output,
    union_region,
)
from taskserver.pipeline.worker import ModuleWorker, close_runner

__all__ = ["CANCELLED", "FAILED", "LATER_STAGE", "PipelineExecutor"]

# Pseudo-modules under which PardMetrics counts requests that ended without a policy drop.
CANCELLED = "(cancelled)"
FAILED = "(failed)"
# Payloads larger than this are parsed in a thread: a nested-list frame of 3x224x224 takes
# ~35 ms to parse here, which would stall every other task and result on the loop.
_PARSE_IN_THREAD_BYTES = 64 * 1024
# ... and those dropped by a later stage (which counts the drop at its own module).
LATER_STAGE = "(later stage)"

log = logging.getLogger(__name__)


def _forget(tasks: list[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    if task in tasks:
        tasks.remove(task)


def _build_runner(factory: Callable[[ModuleConfig], ModelRunner], module: ModuleConfig) -> Any:
    """In a new replica's own thread: load its model and warm it up there (worker.warm_up)."""
    runner = factory(module)
    warm_up = getattr(runner, "warm_up", None)
    if warm_up is not None:
        warm_up()
    return runner


def _start_processes(
    modules: list[ModuleConfig], count: int, factory: Callable[..., ProcessRunner]
) -> dict[str, list[ProcessRunner]]:
    """`count` ProcessRunners per module, their children started at once, then waited for."""
    started: list[ProcessRunner] = []
    try:
        for m in modules:
            started.extend(factory(m, wait=False) for _ in range(count))
        for runner in started:
            runner.wait_ready()
    except BaseException:
        for runner in started:
            runner.close()
        raise
    by_module: dict[str, list[ProcessRunner]] = {m.id: [] for m in modules}
    for runner in started:
        by_module[runner.module.id].append(runner)
    return by_module


class PipelineExecutor(Executor):
    """Runs each task payload through the pipeline; see the module docstring."""

    name = "pipeline"

    def __init__(
        self,
        config: PipelineConfig,
        *,
        runners: Mapping[str, ModelRunner] | None = None,
        runner_factory: Callable[[ModuleConfig], ModelRunner] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Load one session per module (or take `runners`, by module id) and wire the workers.

        Replicas beyond the first come from `runner_factory` (default, without `runners`: a
        new OnnxModel of the module, with the same providers and threads, or a ProcessRunner
        holding one in its own process, as ``config.worker_mode`` resolves).
        """
        self.config = config
        self.clock = clock
        workers = config.workers
        first = workers.min_workers if isinstance(workers, ScalingConfig) else workers
        spare: dict[str, list[ProcessRunner]] = {}  # started with the first, for replicas 2..
        if runners is None:
            here = [m for m in config.modules if config.runs_here(m.id)]
            if runner_factory is None:
                providers = resolve_providers(config.providers)
                threads = config.intra_op_threads or default_intra_op_threads(len(here))
                mode = resolve_worker_mode(config.worker_mode, providers, usable_cpus())
                if mode == "process":
                    processes = functools.partial(
                        ProcessRunner, providers=providers, intra_op_threads=threads
                    )
                    runner_factory = processes
                    spare = _start_processes(here, first, processes)
                    runners = {mid: started.pop(0) for mid, started in spare.items()}
                else:

                    def runner_factory(module: ModuleConfig) -> ModelRunner:
                        return OnnxModel(module, providers, intra_op_threads=threads)

            if runners is None:
                runners = {m.id: runner_factory(m) for m in here}
        # where the workers' models run, as config.worker_mode resolved (or the runners given)
        self.worker_mode = (
            "process" if any(isinstance(r, ProcessRunner) for r in runners.values()) else "thread"
        )
        try:
            self._wire(config, runners, runner_factory, spare, first)
        except BaseException:  # no child process outlives a failed start
            owned = [*runners.values(), *(r for left in spare.values() for r in left)]
            for worker in getattr(self, "workers", {}).values():
                owned.extend(r.runner for r in worker.replicas)
            for runner in owned:
                if isinstance(runner, ProcessRunner):
                    runner.close()
            raise

    def _wire(
        self,
        config: PipelineConfig,
        runners: Mapping[str, ModelRunner],
        runner_factory: Callable[[ModuleConfig], ModelRunner] | None,
        spare: dict[str, list[ProcessRunner]],
        first: int,
    ) -> None:
        clock = self.clock
        local = [m for m in config.modules if config.runs_here(m.id)]
        missing = [m.id for m in local if m.id not in runners]
        if missing:
            raise PipelineConfigError(f"pipeline runners: none given for modules {missing}")
        graph = config.graph()
        knobs = config.pard
        first_sizes = {m.id: m.batch_sizes[0] for m in config.modules}
        # One incarnation per executor: states from a restarted stage (seq from 0 again)
        # replace what its predecessor published instead of being taken for old ones.
        incarnation = secrets.randbits(31)
        self.workers: dict[str, ModuleWorker] = {}
        self._downstream: dict[str, set[str]] = {}
        for m in local:
            planner = StatePlanner(
                m.id,
                graph,
                config.profile,
                window_s=knobs.window_s,
                wait_quantile=knobs.wait_quantile,
                wait_samples=knobs.wait_samples,
                batch_sizes=first_sizes,
                incarnation=incarnation,
                seed=knobs.seed,
            )
            try:
                dropper = create_dropper(config.dropper, planner, priority=knobs.priority)
            except ValueError as exc:
                raise PipelineConfigError(f"pipeline dropper: {exc}") from exc
            self.workers[m.id] = ModuleWorker(
                m,
                runners[m.id],
                planner,
                dropper,
                self,
                clock=clock,
                adapt_durations=knobs.adapt_durations,
            )
            self._downstream[m.id] = {x for p in graph.downstream_paths(m.id) for x in p}
        for worker in self.workers.values():
            seconds = worker.warm_up()
            if seconds is not None:
                log.info(
                    "module %s warmed up on %s in %.3f s",
                    worker.module.label,
                    worker.runner.provider,
                    seconds,
                )
        self._factory = runner_factory
        self._growing: dict[str, list[asyncio.Task[None]]] = {m.id: [] for m in local}
        workers = config.workers
        self.scaler: WorkerScaler | None = None
        if isinstance(workers, ScalingConfig):
            self.scaler = WorkerScaler(workers, [m.id for m in local])
        if first > 1 and runner_factory is None:
            raise PipelineConfigError(
                f"pipeline workers: {first} per module needs a runner_factory besides runners"
            )
        for worker in self.workers.values():  # the starting replicas, before any task
            started = spare.get(worker.id, [])
            for _ in range(first - 1):
                pool = ThreadPoolExecutor(1, thread_name_prefix=f"pipeline-{worker.id}")
                if started:  # a child started with the first one, warm already
                    runner: ModelRunner = started.pop(0)
                else:
                    assert runner_factory is not None
                    runner = pool.submit(_build_runner, runner_factory, worker.module).result()
                worker.add_replica(runner, pool, clock())
        self.metrics = PardMetrics(knobs.metrics_window_s)
        self.cancelled = 0
        self.failures = 0
        self.exchange_s = 0.0  # loop time spent publishing, merging and refreshing states
        self._entries = config.entries
        self._starts_here = any(not config.module(e).pres for e in self._entries)
        self.peers: dict[str, PeerLink] = {}  # by address: one link per later stage
        for addr in dict.fromkeys(config.peers.values()):
            self.peers[addr] = PeerLink(
                addr, config.name, self._merge_remote, period_s=knobs.exchange_period_s
            )
        self._peer_of = dict(config.peers)  # module id -> address of its stage
        self._ends = sum(1 for m in local if not m.subs) + len(self.peers)
        self.routing = config.routing()
        self._local_sinks = {m.id for m in local if not m.subs}
        self._peer_entries: dict[str, set[str]] = {}  # address -> the modules it is entered at
        for mid, address in self._peer_of.items():
            self._peer_entries.setdefault(address, set()).add(mid)
        self._exchanges = {m.id: StateExchange(knobs.exchange_period_s) for m in local}
        self._published: dict[str, ModuleState] = {}  # last state each local module published
        self._learnt: dict[str, ModuleState] = {}  # states from later stages
        self._stale: set[str] = set()  # planners that merged a downstream state since refresh
        self._flights: dict[int, Flight] = {}
        self._counted: dict[str, int] = {}  # arrivals per module handed to the scaler
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._handoffs: set[asyncio.Task[None]] = set()  # waiting on later stages
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        providers_used = list(dict.fromkeys(w.runner.provider for w in self.workers.values()))
        self.provider = ",".join(providers_used)

    # ---- the Executor interface -----------------------------------------------------------

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        """Run one request end to end; PipelineDropped when the policy drops it.

        The budget is the smaller of the payload's `budget_ms` and the task server's (what
        is left of the query's end-to-end SLO when the task starts, so time queued there
        counts), whichever are given, else the pipeline's SLO.
        """
        if self._closed:
            raise PipelineClosed("pipeline executor is closed")
        if len(payload) > _PARSE_IN_THREAD_BYTES and payload[:4] != HANDOFF_MAGIC:
            # a large JSON frame: keep the loop free (a binary hand-off parses in ~0.05 ms)
            request = await asyncio.to_thread(parse_payload, payload)
        else:
            request = parse_payload(payload)
        entries = self._entries
        given = entries if request.entries is None else tuple(request.entries)
        # With branches, a hand-off enters only the modules the request took.
        fits = set(given) <= set(entries) if self.routing.routed else set(given) == set(entries)
        if not fits:
            raise BadPayload(
                f"payload: entries: this stage of pipeline {self.config.name!r} is entered at "
                f"modules {list(entries)}, not {sorted(given)}"
            )
        if request.entries is None and not self._starts_here:
            raise BadPayload(
                f"payload: this task server runs the stage of pipeline {self.config.name!r} "
                f"from modules {list(entries)}; send whole requests to the stage with the source"
            )
        loop = self._start()
        now = self.clock()
        budgets = [b for b in (request.budget_ms, budget_ms) if b is not None]
        budget_ms = min(budgets) if budgets else self.config.slo_ms
        flight = Flight(
            request_id=next(self._ids),
            request=request,
            budget_s=budget_ms / 1000.0,
            received_s=now,
            future=loop.create_future(),
            sinks_left=self._ends,
            route=self.routing.start(),
        )
        self._flights[flight.request_id] = flight
        self.metrics.arrived(flight.request_id, self.config.name, flight.budget_s, now)
        if request.entries is not None:  # a hand-off: the frame as the source saw it
            flight.frame = request.array
            flight.regions.update(request.entries)
            skipped = [e for e in entries if e not in request.entries]
            if skipped:  # branches the request did not take: never reached here either
                self._skip_ends(flight, flight.route.skip(skipped)[1], now)
        else:
            flight.regions[entries[0]] = FULL_REGION
        for entry in given:
            self.workers[entry].submit(flight, now)
        try:
            await flight.future
        except asyncio.CancelledError:
            self._abandon(flight)
            raise
        finally:
            self._flights.pop(flight.request_id, None)
        return self._result(flight, self.clock())

    async def close(self) -> None:
        """Stop the workers, fail what is still in flight, release the model threads."""
        self._closed = True
        tasks = [*self._tasks, *self._handoffs, *(t for g in self._growing.values() for t in g)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._handoffs.clear()
        for flight in list(self._flights.values()):
            self._fail(flight, PipelineClosed("pipeline executor closed"))
        for worker in self.workers.values():
            await worker.close()
        for peer in self.peers.values():
            await peer.close()

    # ---- the Router interface (called by the workers) -------------------------------------

    def dropped(self, flight: Flight, module: ModuleConfig, decision: Decision, now: float) -> None:
        """Fail the whole request at once: PARD dropped it at `module`."""
        self.metrics.dropped(flight.request_id, module.id, now)
        error = PipelineDropped(
            module.id,
            module.name,
            decision.estimate_s * 1000.0,
            decision.limit_s * 1000.0,
            str(decision.reason),
        )
        self._fail(flight, error)

    def failed(self, flight: Flight, module: ModuleConfig, error: ExecutorError) -> None:
        """The batch holding `flight` failed at `module`."""
        self.failures += 1
        self.metrics.dropped(flight.request_id, FAILED, self.clock())
        self._fail(flight, error)

    def executed(self, module: ModuleConfig, ids: list[int], exec_s: float, now: float) -> None:
        """Count a batch's compute (PARD's invalid rate shares it among its requests)."""
        self.metrics.batch_executed(module.id, ids, exec_s, now)

    def forward(self, flight: Flight, module: ModuleConfig, output: np.ndarray, now: float) -> None:
        """Pass `module`'s output on: to every sub it takes (split; all but the branches this
        request skips), merging where a sub has several pres once every branch taken is in."""
        region = flight.regions[module.id]
        if self.workers[module.id].roi_output:
            region = detection_region(output, region)
        flight.passed[module.id] = region
        if not module.subs:
            flight.outputs[module.id] = output
            self._end_reached(flight, now)
            return
        route = flight.route
        taken = module.subs
        if self.routing.splits(module.id):  # decided now, from the request's identity
            if route.key is None:
                route.key = route_key(flight.request)
            taken = self.routing.taken(module.id, route.key)
        ready, gone = route.passed(module.id, taken)
        handoffs: dict[str, dict[str, Region]] = {}
        for sub_id in ready:
            pres = self.config.module(sub_id).pres
            if len(pres) > 1:  # a merge: the regions of the branches that reached it
                sent = route.senders(sub_id)
                flight.regions[sub_id] = union_region([flight.passed[p] for p in pres if p in sent])
            else:
                flight.regions[sub_id] = flight.passed[pres[0]]
            if sub_id in self._peer_of:  # subs bound for one stage get ready together
                handoffs.setdefault(self._peer_of[sub_id], {})[sub_id] = flight.regions[sub_id]
            else:
                self.workers[sub_id].submit(flight, now)
        for address, entries in handoffs.items():
            self._hand_off(flight, self.peers[address], entries, now)
        if gone:
            self._skip_ends(flight, gone, now)

    def _skip_ends(self, flight: Flight, gone: list[str], now: float) -> None:
        """Ends the request will never reach (`gone`: modules it no longer reaches) count as
        reached: local sinks, and later stages none of whose entry modules it takes."""
        stages = set()
        for module_id in gone:
            if module_id in self._local_sinks:
                self._end_reached(flight, now)
            elif module_id in self._peer_of:
                stages.add(self._peer_of[module_id])
        for address in stages:
            if self._peer_entries[address] <= flight.route.unreached:
                self._end_reached(flight, now)

    def _end_reached(self, flight: Flight, now: float) -> None:
        flight.sinks_left -= 1
        if flight.sinks_left == 0:
            flight.alive = False
            self.metrics.completed(flight.request_id, now - flight.received_s, now)
            if not flight.future.done():
                flight.future.set_result(None)

    # ---- later stages ---------------------------------------------------------------------

    def _hand_off(
        self, flight: Flight, peer: PeerLink, entries: dict[str, Region], now: float
    ) -> None:
        """Send the request on to a later stage, entering `entries`, with the budget left."""
        key = peer.new_key()
        flight.handoffs[key] = peer
        budget_ms = max((flight.deadline_s - now) * 1000.0, 1e-3)
        assert flight.frame is not None  # a local module ran, so the frame exists
        payload = handoff_payload(flight.frame, entries, budget_ms, flight.request.top_k)
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._await_stage(flight, peer, key, payload, budget_ms))
        self._handoffs.add(task)
        task.add_done_callback(self._handoffs.discard)

    async def _await_stage(
        self, flight: Flight, peer: PeerLink, key: str, payload: bytes, budget_ms: float
    ) -> None:
        try:
            answer = await peer.run(key, payload, budget_ms)
        except PeerUnavailable as exc:
            answer = PeerResult("failed", None, str(exc))
        finally:
            flight.handoffs.pop(key, None)
        if not flight.alive:
            return  # dropped, failed or cancelled meanwhile: the answer is moot
        now = self.clock()
        if answer.status == "ok" and answer.result is not None:
            try:
                body = jsonbody.loads(answer.result)
                outputs, modules = body["outputs"], body["modules"]
            except (ValueError, KeyError, TypeError) as exc:
                answer = PeerResult("failed", None, f"unreadable result: {exc}")
            else:
                flight.remote_outputs.update(outputs)
                for mid, timing in modules.items():
                    flight.remote_modules[mid] = {**timing, "stage": peer.address}
                self._end_reached(flight, now)
                return
        if answer.status == "dropped":
            self.metrics.dropped(flight.request_id, LATER_STAGE, now)
            self._fail(
                flight, TaskDropped(f"dropped by the stage at {peer.address}: {answer.error}")
            )
            return
        self.failures += 1
        self.metrics.dropped(flight.request_id, FAILED, now)
        self._fail(
            flight,
            InferenceFailed(f"stage at {peer.address} answered {answer.status}: {answer.error}"),
        )

    def _merge_remote(self, states: list[ModuleState]) -> None:
        """States polled from a later stage: merge them into every local planner."""
        start = time.perf_counter()
        for state in states:
            if self.config.runs_here(state.module_id):
                continue  # our own modules' states are fresher here
            known = self._learnt.get(state.module_id)
            if known is None or known.incarnation != state.incarnation or known.seq < state.seq:
                self._learnt[state.module_id] = state
            for other_id, worker in self.workers.items():
                try:
                    merged = worker.planner.merge(state)
                except UnknownModule:  # a peer serving another spec
                    continue
                if merged and state.module_id in self._downstream[other_id]:
                    self._stale.add(other_id)
        self.exchange_s += time.perf_counter() - start

    def published_state(self) -> bytes:
        """This stage's module states for the stage before it (``pipeline_state``)."""
        states = {**self._learnt, **self._published}
        return encode_states(self.config.name, list(states.values()))

    # ---- inspection ---------------------------------------------------------------------------

    def batches(self, module_id: str) -> list[BatchRecord]:
        """The last batches `module_id` ran (a few hundred at most), oldest first."""
        return list(self.workers[module_id].history)

    def snapshot(self) -> dict[str, Any]:
        """Goodput, drop and invalid rates and the counters behind them, drops per module,
        batch sizes, providers, overhead."""
        now = self.clock()
        summary = self.metrics.pipeline(self.config.name, now)
        drops = {m: n for m, n in summary.drops_by_module.items() if m not in (CANCELLED, FAILED)}
        modules: dict[str, Any] = {}
        decide_ns = 0
        decided = 0
        calls = 0
        for mid, w in self.workers.items():
            decide_ns += w.decide_ns
            decided += w.decided
            calls += w.decide_calls
            module = self.metrics.module(mid)
            modules[mid] = {
                "name": w.module.name,
                "provider": w.runner.provider,
                "batches": w.batches,
                "requests": w.requests,
                "batch_sizes": {str(b): n for b, n in sorted(w.sizes.items())},
                "short_batches": w.short_batches,
                "mean_batch": round(w.requests / w.batches, 3) if w.batches else 0.0,
                "busy_s": round(w.busy_s, 6),
                "exec_s": round(w.exec_s, 6),
                # > 1: batches ran slower than the profile says, so eq. (3) is optimistic
                "exec_vs_profile": round(w.exec_s / w.profiled_s, 3) if w.profiled_s else 0.0,
                "queued": len(w.queue),
                "open": w.open_count,
                "batch_size": w.planner.state(mid).batch_size,
                # d_k used in eq. (3) = profiled d_k x this (1.0 unless adapt_durations)
                "duration_scale": round(w.planner.state(mid).duration_scale, 3),
                "workers": w.workers,  # replicas serving
                # worker processes lost (kill -9, a crash) and replaced (worker_mode process)
                "worker_crashes": w.worker_crashes,
                "worker_restarts": sum(r.restarts for r in w.replicas),
                "worker_restart_failures": w.restart_failures,
                "worker_pids": [getattr(r.runner, "pid", None) for r in w.replicas],
                # the part of exec_s the process hop took: messages, copies, wake-ups
                "hop_s": round(w.hop_s, 6),
                "workers_starting": len(self._growing.get(mid, ())),
                "batches_by_worker": {str(r.index): r.batches for r in w.replicas},
                "scaling_actions": dict(
                    zip(
                        ("start", "stop"),
                        self.scaler.actions(mid) if self.scaler is not None else (0, 0),
                        strict=True,
                    )
                ),
                "invalid_rate": module.invalid_rate,
                "compute_s": module.compute_s,
                "invalid_s": module.invalid_s,
                # PARD decision time at this module (push, context, form_batch, recheck)
                "decide_s": w.decide_s,
                "decisions": w.decided,
            }
        return {
            "pipeline": self.config.name,
            "dropper": self.config.dropper,
            "provider": self.provider,
            "worker_mode": self.worker_mode,
            "arrived": summary.arrived,
            "on_time": summary.on_time,
            "late": summary.late,
            "dropped": sum(drops.values()),
            "cancelled": self.cancelled,
            "failed": self.failures,
            "in_flight": summary.in_flight,
            "goodput_rps": summary.goodput_rps,
            "drop_rate": summary.drop_rate,
            "invalid_rate": summary.invalid_rate,
            "drops_by_module": drops,
            # Counters behind the rates above (tailgate_pipeline_* take rates over them).
            "outcomes": {
                "on_time": summary.on_time,
                "late": summary.late,
                "dropped": sum(drops.values()),
                "cancelled": summary.drops_by_module.get(CANCELLED, 0),
                "failed": summary.drops_by_module.get(FAILED, 0),
            },
            "compute_s": summary.compute_s,
            "invalid_s": summary.invalid_s,
            "modules": modules,
            "scheduling": {
                "decisions": decided,
                "decide_calls": calls,
                "decide_s": decide_ns / 1e9,
                "decide_us_per_decision": decide_ns / decided / 1e3 if decided else 0.0,
                "exchange_s": self.exchange_s,
            },
        }

    # ---- internals ------------------------------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None:
            raise RuntimeError("PipelineExecutor: already bound to another event loop")
        self._loop = loop
        for worker in self.workers.values():
            worker.planner.refresh()  # w_k from the priors, before the first decision
            self._tasks.append(loop.create_task(worker.run(), name=f"pipeline-{worker.id}"))
        self._tasks.append(loop.create_task(self._exchange_loop(), name="pipeline-exchange"))
        if self.scaler is not None:
            self._tasks.append(loop.create_task(self._scale_loop(), name="pipeline-scaling"))
        for peer in self.peers.values():
            peer.start()
        return loop

    async def _scale_loop(self) -> None:
        assert self.scaler is not None
        self.scaler.start(self.clock())
        while True:
            await asyncio.sleep(self.scaler.config.period_s)
            self.scale(self.clock())

    def worker_rps(self, module_id: str) -> float:
        """mu_k: one replica's throughput at the module's largest feasible batch size, from
        the profile's d_k times the module's duration scale."""
        worker = self.workers[module_id]
        batch = worker.module.batch_sizes[-1]
        return batch / worker.planner.duration_s(module_id, batch)

    def scale(self, now: float) -> ScalingDecision | None:
        """One scaling decision at `now` and its actions (None without a scaler)."""
        scaler = self.scaler
        if scaler is None:
            return None
        for mid, worker in self.workers.items():
            scaler.record_arrivals(mid, worker.arrivals - self._counted.get(mid, 0), now)
            self._counted[mid] = worker.arrivals
        decision = scaler.decide(now, {mid: self.worker_rps(mid) for mid in self.workers})
        loop = asyncio.get_running_loop()
        for part in decision.modules:
            growing = self._growing[part.module_id]
            for _ in range(part.start):
                task = loop.create_task(self._grow(part.module_id, part.ready_at_s))
                growing.append(task)
                task.add_done_callback(functools.partial(_forget, growing))
            for _ in range(part.stop):
                if growing:  # not serving yet: the cheapest to stop
                    growing[-1].cancel()
                    growing.pop()
                else:
                    self.workers[part.module_id].retire_replica()
            if part.start or part.stop:
                log.info(
                    "module %s: %.1f req/s, %.1f per worker: %d wanted, +%d -%d",
                    self.workers[part.module_id].module.label,
                    part.rate_rps,
                    part.worker_rps,
                    part.wanted,
                    part.start,
                    part.stop,
                )
        return decision

    async def _grow(self, module_id: str, ready_at_s: float) -> None:
        """Build and warm a replica in its own thread, then let it join at `ready_at_s`.

        Cancelled (scaled in, or closing) while it starts, it lets the start finish and then
        closes what was started (a child process), before the task ends.
        """
        worker = self.workers[module_id]
        factory = self._factory
        assert factory is not None and self.scaler is not None
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"pipeline-{module_id}")
        loop = asyncio.get_running_loop()
        build = loop.run_in_executor(pool, _build_runner, factory, worker.module)
        runner: ModelRunner | None = None
        joined = False
        try:
            try:
                runner = await asyncio.shield(build)
            except asyncio.CancelledError:
                await asyncio.wait([build])
                if not build.cancelled() and build.exception() is None:
                    runner = build.result()
                raise
            wait_s = ready_at_s - self.clock()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            worker.add_replica(runner, pool, self.clock())
            joined = True
        except Exception as exc:  # a model that fails to load: the module keeps what it has
            log.warning("module %s: a new worker failed to start: %s", worker.module.label, exc)
            self.scaler.abandon(module_id)
        finally:
            if not joined:
                if runner is not None:
                    await loop.run_in_executor(pool, close_runner, runner)
                pool.shutdown(wait=False, cancel_futures=True)

    async def _exchange_loop(self) -> None:
        ids = list(self.workers)
        tick_s = self.config.pard.exchange_period_s / len(ids)
        for module_id in itertools.cycle(ids):
            await asyncio.sleep(tick_s)
            self.exchange(module_id, self.clock())

    def exchange(self, module_id: str, now: float) -> None:
        """One tick: publish `module_id`'s state if due, merge it, refresh its planner if stale."""
        start = time.perf_counter()
        worker = self.workers[module_id]
        state = self._exchanges[module_id].publish(worker.planner, now)
        if state is not None:
            self._published[module_id] = state
            for other_id, other in self.workers.items():
                if other is not worker and other.planner.merge(state):
                    if module_id in self._downstream[other_id]:
                        self._stale.add(other_id)
        if module_id in self._stale:
            self._stale.discard(module_id)
            worker.planner.refresh()
        self.exchange_s += time.perf_counter() - start

    def _fail(self, flight: Flight, error: ExecutorError) -> None:
        flight.alive = False
        for module_id in flight.where:
            self.workers[module_id].remove(flight.request_id)
        flight.where.clear()
        self._cancel_handoffs(flight)
        if not flight.future.done():
            flight.future.set_exception(error)

    def _abandon(self, flight: Flight) -> None:
        """The caller cancelled: take the request out of every queue, spend nothing more."""
        if flight.alive:
            self.cancelled += 1
            self.metrics.dropped(flight.request_id, CANCELLED, self.clock())
            flight.alive = False
        for module_id in flight.where:
            self.workers[module_id].remove(flight.request_id)
        flight.where.clear()
        self._cancel_handoffs(flight)

    def _cancel_handoffs(self, flight: Flight) -> None:
        """A lost request: later stages stop spending compute on it."""
        for key, peer in list(flight.handoffs.items()):
            peer.cancel(key)

    def _result(self, flight: Flight, now: float) -> bytes:
        top_k = flight.request.top_k
        outputs = {
            mid: {"module": self.workers[mid].module.name, **summarize_output(out, top_k)}
            for mid, out in flight.outputs.items()
        }
        outputs.update(flight.remote_outputs)
        modules = {}
        for mid, timing in flight.timings.items():
            worker = self.workers[mid]
            modules[mid] = {"name": worker.module.name, **timing.to_json(worker.runner.provider)}
        modules.update(flight.remote_modules)
        result = {
            "pipeline": self.config.name,
            "request": flight.request_id,
            "budget_ms": round(flight.budget_s * 1000.0, 3),
            "latency_ms": round((now - flight.received_s) * 1000.0, 3),
            "provider": self.provider,
            "outputs": outputs,
            "modules": modules,
        }
        return json.dumps(result, allow_nan=False).encode()
