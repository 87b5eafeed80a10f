"""One link per task server: a duplex Thrift connection, its heartbeat and its tasks.

In ``server`` queueing a task goes out at once with its remaining budgets; in
``central`` queueing the link holds the server's policy queue and sends a task
only when the server has a free slot (TailGuard Fig. 2: the queue may sit in
the query handler). Whatever happens to the connection, every outstanding
task gets an outcome: a result, or a failure the moment the link is lost.

The heartbeat is the server's ``status`` call: it measures the round trip, learns when
the server drains (it then leaves the selection until it is back), and in central
queueing claims the server for this gateway (taskserver.ownership): a server owned by
another gateway is connected but takes no task from this one. When the autoscaler sets
``load_per_s``, the heartbeat also reports this gateway's local request rate, and the reply's
list of every gateway's rate is kept in ``frontends`` (taskserver.frontends, Swayam §4.2).

A server that sends nothing (no result, no heartbeat reply) for ``heartbeat_timeout_s`` while
it holds tasks, or does not answer a heartbeat within it, is down at once: the connection
is dropped, every task it holds fails, and it leaves the selection. Heartbeats are paced
(gateway.pacing): while results come they stand in for heartbeats, and a server holding no
task is asked at its quiet period, which grows with the servers registered beyond a few
hundred; given work, its results stand in for the heartbeat, and one that is not heard
from within heartbeat_s is asked at once (the busy watch checks, not a wake-up of
the heartbeat's task per dispatch). A server that was down takes
tasks again once it answers a heartbeat on a new connection; what it held from the old one
is cancelled there when it sees that connection closed (or fails unrun, past its SLO plus
the grace). A successful TCP connect proves nothing: the kernel
completes it even for a stopped process.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from admission.allocation import DrrArbiter, FairArbiter
from gateway.central import CentralQueue
from gateway.hotpath import ResultFrames, ResultItem, TaskFrames
from gateway.pacing import JITTER, QUIET_TICK_S
from gateway.queries import PendingTask
from gateway.settle import take
from taskserver.backoff import Backoff, RetryLog
from taskserver.frontends import reported_loads
from taskserver.messages import result_problem
from taskserver.ownership import claim_proof
from taskserver.queues import QueuePolicy
from taskserver.tls import ReloadingContext, tls_problem
from taskserver.wire import (
    DEFAULT_LIMITS,
    ONEWAY,
    ProtocolViolation,
    TaskStatus,
    ThriftConnection,
    WireError,
    WireLimits,
    gateway_body_types,
    thrift,
)

log = logging.getLogger(__name__)

_REPOLL_S = 0.05
"""After a rejected task the heartbeat asks for the status this soon (once per burst)."""
SWEEPS_PER_HEARTBEAT = 4
"""How often, per heartbeat_s, the busy watch checks the quiet servers given work."""


class PollSignal:
    """A flag the heartbeat waits on for at most a period: `asyncio.Event` and `wait_for`
    made one future and one timer. wait_for wraps the event's wait in a task and, on the
    timeout that ends most waits (a quiet server is asked when its period is up), cancels
    that task and waits for it to finish: extra loop turns on every heartbeat, 50 a second
    at any N from 50 servers on (gateway.pacing). One waiter at a time (the heartbeat)."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[bool] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag and wake the waiter."""
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout_s: float, tick_s: float | None = None) -> bool:
        """True once the flag is set (at once when it is), False when timeout_s passed; with
        tick_s, on the next tick of that grid after it (`QuietTicks`)."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        if tick_s is None:
            timer = loop.call_later(timeout_s, _time_up, waiter)
            try:
                return await waiter
            finally:
                timer.cancel()
                if self._waiter is waiter:
                    self._waiter = None
        ticks = quiet_ticks(loop, tick_s)
        tick = ticks.add(loop.time() + timeout_s, waiter)
        try:
            return await waiter
        finally:
            ticks.discard(tick, waiter)
            if self._waiter is waiter:
                self._waiter = None


def _time_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class QuietTicks:
    """The ends of quiet periods, on one grid of ticks per event loop and tick size.

    Each quiet link's heartbeat waits its own jittered period, so at 50 heartbeats a second
    each woke the gateway on its own: a wake-up for the timer, one for the reply. Here a
    wait ends on the first tick at or after its period, with every other wait due on that
    tick, from one timer: at most 1 / tick_s such wake-ups a second, whatever N
    (gateway.pacing.QUIET_TICK_S has the measured cost). A wait ended early (its flag set)
    leaves its tick at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float) -> None:
        self.loop = loop
        self.tick_s = tick_s
        self._due: dict[int, set[asyncio.Future[bool]]] = {}
        self._ticks: list[int] = []
        """Ticks with waits (a heap); one whose waits all ended early stays until it passes."""
        self._timer: asyncio.TimerHandle | None = None
        self._armed = -1

    def add(self, deadline: float, waiter: asyncio.Future[bool]) -> int:
        """End `waiter` (False) on the first tick at or after `deadline` (loop time)."""
        tick = math.ceil(deadline / self.tick_s)
        waits = self._due.get(tick)
        if waits is None:
            waits = self._due[tick] = set()
            heapq.heappush(self._ticks, tick)
            if self._timer is None or tick < self._armed:
                self._arm(tick)
        waits.add(waiter)
        return tick

    def discard(self, tick: int, waiter: asyncio.Future[bool]) -> None:
        """A wait over before its tick: it leaves the tick."""
        waits = self._due.get(tick)
        if waits is not None:
            waits.discard(waiter)

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = tick
        self._timer = self.loop.call_at(tick * self.tick_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        # uvloop's timers fire up to a millisecond early (whole ms): a tick within 2 ms
        # counts as come.
        now_tick = math.floor((self.loop.time() + 0.002) / self.tick_s)
        ticks = self._ticks
        while ticks and ticks[0] <= now_tick:
            for waiter in self._due.pop(heapq.heappop(ticks), ()):
                if not waiter.done():
                    waiter.set_result(False)
        if ticks:
            self._arm(ticks[0])
        else:
            _TICKS.pop((id(self.loop), self.tick_s), None)


_TICKS: dict[tuple[int, float], QuietTicks] = {}
"""The quiet ticks of each running event loop and tick size (they leave when empty)."""


def quiet_ticks(loop: asyncio.AbstractEventLoop, tick_s: float) -> QuietTicks:
    """The loop's grid of ticks of this size."""
    ticks = _TICKS.get((id(loop), tick_s))
    if ticks is None or ticks.loop is not loop:
        ticks = _TICKS[(id(loop), tick_s)] = QuietTicks(loop, tick_s)
    return ticks


class BusyWatch:
    """Quiet servers given work, checked together a few times per heartbeat_s.

    A quiet server's heartbeat waits a long quiet period; given work, it must be heard
    from within heartbeat_s or be asked for its status at once. One timer per such server
    (armed at each quiet-to-busy change) cost a timer a task at 10,000 servers, each busy
    for a moment a second (the arming line of `ServerLink.dispatch` and the timer's
    callback: 2.1% of the gateway's py-spy samples, against 0.6% at 1,000; one run each).
    Here a server given work joins a set, and one timer per event loop checks the set
    every heartbeat_s / SWEEPS_PER_HEARTBEAT while it is not empty: a silent server is
    asked between heartbeat_s and 1.25 heartbeat_s after it was given work (exactly
    heartbeat_s before), and its heartbeat's own timeout still runs from then, so it is
    found down as before.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.links: dict[ServerLink, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._period_s = math.inf

    def add(self, link: ServerLink) -> None:
        """Watch a quiet server given work until it is quiet again or heard from."""
        self.links[link] = None
        period = link.heartbeat_s / SWEEPS_PER_HEARTBEAT
        if self._timer is None or period < self._period_s:
            if self._timer is not None:
                self._timer.cancel()
            self._period_s = period
            self._timer = self.loop.call_later(period, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        done = []
        for link in self.links:
            if link._watch_due():
                done.append(link)
        for link in done:
            del self.links[link]
        if self.links:
            self._timer = self.loop.call_later(self._period_s, self._sweep)
        else:
            self._period_s = math.inf
            _WATCHES.pop(id(self.loop), None)


_WATCHES: dict[int, BusyWatch] = {}
"""The busy watch of each running event loop, by id (it leaves when its set empties)."""


def busy_watch() -> BusyWatch:
    """The running loop's busy watch."""
    loop = asyncio.get_running_loop()
    watch = _WATCHES.get(id(loop))
    if watch is None or watch.loop is not loop:
        watch = _WATCHES[id(loop)] = BusyWatch(loop)
    return watch


RECONNECT_BASE_S = 0.05
"""The first reconnect comes within this long; the bound doubles per failure..."""
RECONNECT_CAP_S = 2.0
"""...up to this (taskserver.backoff.Backoff, full jitter)."""
RTT_SAMPLES = 16
"""Heartbeat round trips the dispatch delay is estimated from: half their minimum."""


class RoundTrips:
    """Heartbeat round trips: smoothed for people to read, and the dispatch delay.

    The dispatch delay is half the least of the last RTT_SAMPLES round trips, not of their
    mean: a reply held up by a stalled server (SIGSTOP, a long GC pause, a reconnect that
    waited in its listen queue) measures the stall, not the wire, and subtracted from every
    task's budget it would turn each of them into a deadline miss. The samples outlive a
    reconnect, so the first reply after a stall is one sample among many.
    """

    __slots__ = ("_max", "_next", "_samples", "one_way_ms", "smoothed_ms")

    def __init__(self, samples: int = RTT_SAMPLES) -> None:
        # A list used as a ring, not a deque: a deque's first block is ~0.5 KB a server.
        self._samples: list[float] = []
        self._max = samples
        self._next = 0
        self.one_way_ms = 0.0
        self.smoothed_ms: float | None = None

    def observe(self, rtt_ms: float) -> None:
        """Take one round trip."""
        s = self.smoothed_ms
        self.smoothed_ms = rtt_ms if s is None else 0.8 * s + 0.2 * rtt_ms
        if len(self._samples) < self._max:
            self._samples.append(rtt_ms)
        else:
            self._samples[self._next] = rtt_ms
            self._next = (self._next + 1) % self._max
        self.one_way_ms = min(self._samples) / 2.0


class LinkDown(Exception):
    """The server is not connected; the task cannot be sent."""


class TaskReport(NamedTuple):
    """A task server's result for one task, in our own types (the link converts the wire's
    TaskResult once it has checked it: the query path never sees Thrift objects). A tuple,
    so that the result decoder (gateway.hotpath) builds it in C."""

    status: TaskStatus
    queue_ms: float
    """Time in the server's queue."""
    service_ms: float
    """Time the executor ran."""
    server_ms: float
    """From receipt to the result leaving the server."""
    missed_deadline: bool
    """Dequeued after its deadline t_D (the server's own clock)."""
    result: bytes | None
    error: str | None


_STATUS = {s.value: s for s in TaskStatus}
_REJECTED = TaskStatus.REJECTED

ResultCallback = Callable[["ServerLink", PendingTask, TaskReport, float], None]
ResultsCallback = Callable[["ServerLink", list[tuple[PendingTask, TaskReport]], float], None]
"""Told the results of one frame at once: (task, report) pairs in the order they came."""
FailureCallback = Callable[["ServerLink", PendingTask, str, str], None]
ChangeCallback = Callable[["ServerLink"], None]
ViolationCallback = Callable[["ServerLink", ProtocolViolation], None]
DequeueCallback = Callable[["ServerLink", PendingTask], None]


class TaskLink(Protocol):
    """What the gateway's query path and server registry use of a link to one server.

    `ServerLink` is the real one (Thrift over TCP); unit tests of the query path pass fakes
    through `GatewayService(link_factory=...)`. A link reports each task's fate through the
    callbacks it was built with: `on_result(link, task, TaskReport, now)` (or, when given,
    `on_results(link, [(task, TaskReport), ...], now)` once per frame of results),
    `on_failure(link, task, status, reason)` and, with central queueing,
    `on_dequeue(link, task)`. The autoscaler sets `load_per_s` (this gateway's local rate,
    sent with the heartbeat) and reads `frontends` (every gateway's, as the server listed
    them at `frontends_s`).
    """

    server_id: str
    pool: str
    cluster: str | None
    slots: int
    central: bool
    registered_s: float
    draining: bool
    server_draining: bool
    owner: str | None
    last_error: str
    outstanding: dict[str, PendingTask]
    queue: Any
    policy: QueuePolicy
    tasks_sent: int
    results: int
    gateway_id: str
    load_per_s: float | None
    frontends: list[tuple[str, float]]
    frontends_s: float | None
    executor: str | None

    @property
    def address(self) -> str: ...
    @property
    def is_up(self) -> bool: ...
    @property
    def display_state(self) -> str: ...
    @property
    def owned_elsewhere(self) -> str | None: ...
    @property
    def one_way_ms(self) -> float: ...
    @property
    def rtt_ms(self) -> float | None: ...
    @property
    def silent_s(self) -> float: ...

    def start(self) -> None: ...
    async def wait_up(self, timeout_s: float) -> bool: ...
    async def wait_idle(self, timeout_s: float) -> bool: ...
    async def close(self, reason: str = ...) -> None: ...
    def dispatch(self, p: PendingTask) -> None:
        """Send the task (or queue it here); raise LinkDown when the server is not up."""
        ...

    def cancel_query(self, query_id: str) -> None: ...


class ServerLink:
    """The gateway's connection to one task server (a `TaskLink`)."""

    # Slots, not a __dict__: a query touches the link of every task it fans out to, one
    # link after another, on the dispatch and on the result; with the attributes in the
    # object itself each link costs fewer cold cache lines (bench_latency, fanout 100:
    # resolve, the up check and dispatch 18-52% faster; bench_scale: 1.3 KiB less a
    # registered server).
    __slots__ = (
        "__weakref__",  # a weak reference tells whether a closed one was freed (tests)
        "_backoff",
        "_busy_since",
        "_closing",
        "_conn",
        "_down_since",
        "_idle_waiters",
        "_last_heard_s",
        "_lost_exc",
        "_poll_now",
        "_repoll",
        "_results",
        "_retry",
        "_rng",
        "_runner",
        "_silent",
        "_stretched",
        "_t",
        "_types",
        "_up",
        "_watched",
        "central",
        "claim_error",
        "clock",
        "cluster",
        "draining",
        "executor",
        "frontends",
        "frontends_s",
        "gateway_id",
        "heartbeat_s",
        "heartbeat_timeout_s",
        "host",
        "last_error",
        "limits",
        "load_per_s",
        "on_change",
        "on_dequeue",
        "on_failure",
        "on_result",
        "on_results",
        "on_violation",
        "outstanding",
        "owner",
        "policy",
        "pool",
        "port",
        "queue",
        "quiet_period",
        "registered_s",
        "results",
        "round_trips",
        "server_draining",
        "server_id",
        "server_name",
        "slots",
        "state",
        "tasks_sent",
        "tls",
        "token",
    )

    def __init__(
        self,
        server_id: str,
        host: str,
        port: int,
        *,
        pool: str,
        cluster: str | None = None,
        slots: int = 1,
        central: bool = False,
        policy: QueuePolicy = QueuePolicy.TF_EDFQ,
        on_result: ResultCallback,
        on_failure: FailureCallback,
        clock: Callable[[], float] = time.perf_counter,
        heartbeat_s: float = 1.0,
        heartbeat_timeout_s: float = 3.0,
        gateway_id: str = "",
        on_change: ChangeCallback | None = None,
        token: str | None = None,
        on_violation: ViolationCallback | None = None,
        on_dequeue: DequeueCallback | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
        arbiter: DrrArbiter | FairArbiter | None = None,
        rng: random.Random | None = None,
        tls: ReloadingContext | None = None,
        server_name: str | None = None,
        on_results: ResultsCallback | None = None,
        quiet_period: Callable[[], float] | None = None,
    ) -> None:
        self.server_id = server_id
        self.host = host
        self.port = port
        self.pool = pool
        self.cluster = cluster
        self.slots = slots
        self.central = central
        self.on_result = on_result
        self.on_results = on_results
        """Told a whole frame's results at once (None: `on_result`, one by one): the query
        path then updates its CDF rows, windows and counts once per frame, not per task."""
        self.on_failure = on_failure
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.state = "connecting"
        self.registered_s = clock()
        """When the server last registered or refreshed its registration (clock time)."""
        self.draining = False
        """Being deregistered: finishes what it has, takes nothing new."""
        self.gateway_id = gateway_id
        """This gateway's instance id, sent with ownership claims (central queueing)."""
        self.on_change = on_change
        """Called when server_draining or owner changes."""
        self.token = token
        """The registration token this gateway's ownership claims prove (central queueing)."""
        self.on_violation = on_violation
        """Told when the server broke the protocol (its connection is then closed)."""
        self.limits = limits
        """What a frame from the server may be and declare (taskserver.framecheck)."""
        self.on_dequeue = on_dequeue
        """Central queueing: told of each task as it leaves this link's queue (its miss is
        decided then)."""
        self.claim_error: str | None = None
        """Why the server refused this gateway's last ownership claim (None: granted)."""
        self.server_draining = False
        """The server said (heartbeat) that it drains: it takes no new task."""
        self.owner: str | None = None
        """The gateway the server says owns its slots (None: no owner, or an older server)."""
        self.load_per_s: float | None = None
        """This gateway's local request rate for the pool (Swayam §4.2's λ_i), sent with every
        heartbeat; set by the autoscaler (None: nothing is sent)."""
        self.frontends: list[tuple[str, float]] = []
        """(gateway id, rate) of every gateway the server heard from, this one included, as
        its last heartbeat reply listed them (at most taskserver.frontends.MAX_FRONTENDS)."""
        self.frontends_s: float | None = None
        """When that reply came (clock time; None before the first)."""
        self.executor: str | None = None
        """The executor the server names in its heartbeat ("emulated", "pipeline", "sensing";
        None before the first reply, or from a server that names none)."""
        self.last_error = ""
        self.outstanding: dict[str, PendingTask] = {}
        self.queue = CentralQueue(policy, slots, arbiter) if central else None
        """Central queueing: this server's policy queue, kept here (gateway.central); shared
        between flows by `arbiter` when [allocation] is on."""
        self.policy = policy
        """The order tasks wait in for this server: the gateway's queue's (central), else the
        one the server reports in its heartbeat (the pool's until it does); the wait
        estimates (gateway.waits) read it."""
        self.round_trips = RoundTrips()
        self._last_heard_s = clock()
        """When the server last sent anything: a result or a heartbeat reply."""
        self.tasks_sent = 0
        self.results = 0
        self._conn: ThriftConnection | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self._up = asyncio.Event()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._poll_now = PollSignal()
        """Set to make the heartbeat ask for the status at once (a task was rejected, or a
        quiet server given work was not heard from within heartbeat_s: `_watch_due`)."""
        self.quiet_period = quiet_period
        """Seconds between heartbeats while the server holds no task of this gateway
        (gateway.pacing; None: heartbeat_s)."""
        self._stretched = False
        """The heartbeat waits a quiet period longer than heartbeat_s."""
        self._repoll = False
        """A rejected task asked for the status (`_poll_now` is set for it)."""
        self._busy_since = 0.0
        """When the server was last given work while it held none (clock time)."""
        self._watched = False
        """While the heartbeat waits a quiet period and the server holds work: in the busy
        watch, which checks its results come (`_watch_due`)."""
        self._silent = False
        """`_watch_due` ended the quiet wait: the server was given work and went silent."""
        self._rng = rng or random.Random()
        self._backoff = Backoff(RECONNECT_BASE_S, RECONNECT_CAP_S, self._rng)
        """Delays between reconnects (full jitter: links to servers lost together spread)."""
        self._retry = RetryLog(f"server {server_id}: connect to {host}:{port}")
        """What to log of failed reconnects: the first, a new error, one line a minute."""
        self._down_since: float | None = None
        """When the server was last seen to go down (clock time; None: up, or not yet)."""
        self.tls = tls
        """TLS on this link (taskserver.tls): each connect takes its newest context."""
        self.server_name = server_name
        """The name the server's certificate must carry (None: `host`)."""
        self._lost_exc: Exception | None = None
        """Why the last connection ended (None: closed without an error)."""
        self._t = thrift()
        self._types = gateway_body_types()
        self._results = ResultFrames(limits, TaskReport)
        """Takes the frames of results whole, without Thrift objects (gateway.hotpath)."""

    @property
    def one_way_ms(self) -> float:
        """Estimated dispatch delay, spent before the server sees a task's budgets."""
        return self.round_trips.one_way_ms

    @property
    def rtt_ms(self) -> float | None:
        """Heartbeat round trip, smoothed (None before the first)."""
        return self.round_trips.smoothed_ms

    @property
    def silent_s(self) -> float:
        """Seconds since the server last sent anything (a result or a heartbeat reply)."""
        return max(self.clock() - self._last_heard_s, 0.0)

    @property
    def address(self) -> str:
        """host:port of the server."""
        return f"{self.host}:{self.port}"

    @property
    def owned_elsewhere(self) -> str | None:
        """The id of another gateway that owns this server now, if one does."""
        owner = self.owner
        return owner if owner is not None and owner != self.gateway_id else None

    @property
    def display_state(self) -> str:
        """The state shown to people: /v1/servers, tailgate_servers and the history agree."""
        if self.draining or (self.server_draining and self.state == "up"):
            return "draining"
        if self.state == "up" and self.owned_elsewhere is not None:
            return "owned_elsewhere"
        return self.state

    @property
    def is_up(self) -> bool:
        """Connected, answering heartbeats and taking new tasks from this gateway."""
        if self.state != "up" or self.draining or self.server_draining:
            return False
        owner = self.owner  # owned_elsewhere, inlined: asked of every target of a query
        return owner is None or owner == self.gateway_id

    # -- lifecycle ------------------------------------------------------
    def start(self) -> None:
        """Connect in the background and keep reconnecting until closed."""
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def wait_up(self, timeout_s: float) -> bool:
        """Wait until connected; False on timeout."""
        try:
            await asyncio.wait_for(self._up.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no task is outstanding here; False on timeout."""
        if not self.outstanding:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        return True

    def _notify_idle(self) -> None:
        if not self.outstanding and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def close(self, reason: str = "server deregistered") -> None:
        """Stop the link and fail whatever it still holds."""
        self._closing = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._conn is not None:
            self._conn.close()
        self._fail_all("lost", reason)
        self.state = "closed"
        # The connection calls back into this link (link <-> connection): dropping our side
        # lets reference counting free a closed link even when its objects were frozen
        # out of the collector's sight (taskserver.heap.refreeze).
        self._conn = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            tls: dict[str, Any] = {}
            if self.tls is not None:
                tls = {"ssl": self.tls.current(), "server_hostname": self.server_name or self.host}
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: ThriftConnection(
                            self._types,
                            self._on_message,
                            self._on_lost,
                            batcher=TaskFrames(),
                            limits=self.limits,
                            on_violation=self._on_violation,
                            fast_frames=(self._results.decode, self._on_decoded),
                        ),
                        self.host,
                        self.port,
                        **tls,
                    ),
                    self.heartbeat_timeout_s,
                )
            except (TimeoutError, OSError) as exc:
                self.state = "down"
                self.last_error = f"connect failed: {tls_problem(exc) or exc or type(exc).__name__}"
                await asyncio.sleep(self._attempt_failed(self.clock()))
                continue
            self._conn = conn
            if not await self._heartbeat(conn) and not self._closing:
                # Connected, but no heartbeat answered (the kernel accepts even for a stopped
                # process): a failed try, as a refused connect is.
                await asyncio.sleep(self._attempt_failed(self.clock()))

    def _attempt_failed(self, now: float) -> float:
        """A connect failed, or a connection ended before its first heartbeat answer
        (`last_error` says how): log it if `RetryLog` says so; the delay before the next."""
        delay_s = self._backoff.failed()
        if self._down_since is None:
            self._down_since = now
        line = self._retry.failed(self.last_error, now, delay_s)
        if line is not None:
            log.warning("%s", line, extra={"server_id": self.server_id, "pool": self.pool})
        return delay_s

    def _came_up(self, now: float) -> None:
        """The first heartbeat on a connection answered: log the return of a server that was
        down (once), and start the next outage's backoff and log over."""
        self.state = "up"
        self._backoff.reset()
        self._retry.succeeded(now)
        if self._down_since is not None:
            log.info(
                "server %s is back up after %.1f s",
                self.server_id,
                now - self._down_since,
                extra={"server_id": self.server_id, "pool": self.pool, "outcome": "up"},
            )
            self._down_since = None

    def _status_args(self, nonce: bytes | None) -> Any:
        """The heartbeat's arguments: in central queueing, a claim proving the token on this
        connection (its nonce comes with the first reply, so the first call claims nothing);
        with `load_per_s` set, this gateway's local request rate."""
        load = None
        if self.load_per_s is not None and self.gateway_id:
            load = self._t.FrontendLoad(self.gateway_id, self.load_per_s)
        if not (self.central and self.gateway_id) or nonce is None:
            return self._t.TaskServer.status_args(load=load)
        # The lease outlives a missed heartbeat or two, not a dead gateway.
        lease_ms = self.heartbeat_timeout_s * 1000.0
        proof = None
        if self.token is not None:
            proof = claim_proof(self.token, nonce, self.gateway_id, lease_ms)
        claim = self._t.OwnerClaim(self.gateway_id, lease_ms, proof)
        return self._t.TaskServer.status_args(claim=claim, load=load)

    async def _heartbeat(self, conn: ThriftConnection) -> bool:
        """Heartbeats until the connection is lost or closed; whether the server answered."""
        nonce: bytes | None = None
        first = True
        self._last_heard_s = self.clock()
        # `_closing` is checked besides the cancellation close() sends: on Python 3.11 a
        # wait_for whose inner wait has just finished swallows a cancellation.
        while not conn.closed and not self._closing:
            start = self.clock()
            if not first and self._results_suffice(start):
                # Traffic is the liveness signal: a result came within the period.
                if await self._pause():
                    await asyncio.sleep(_REPOLL_S)
                continue
            self._poll_now.clear()
            self._repoll = False
            args = self._status_args(nonce)
            claimed = args.claim is not None
            # Down one heartbeat timeout after the server was last heard from while it had
            # work, not after this call's own timeout: a server that stops just after
            # answering is routed around within heartbeat_timeout_s, not heartbeat_s +
            # heartbeat_timeout_s. A quiet server has nothing to say between heartbeats.
            if self.outstanding:
                silent_s = start - max(self._last_heard_s, self._busy_since)
            else:
                silent_s = min(start - self._last_heard_s, self.heartbeat_s)
            timeout_s = max(self.heartbeat_timeout_s - silent_s, _REPOLL_S)
            try:
                st = await conn.call("status", args, timeout_s)
            except (TimeoutError, WireError) as exc:
                if not conn.closed:
                    silent_s = self.clock() - self._last_heard_s
                    self.last_error = (
                        f"heartbeat failed: {exc}"
                        if not isinstance(exc, TimeoutError)
                        else f"heartbeat failed: no word from the server for {silent_s:.1f} s"
                    )
                    conn.abort()
                    self._on_lost(None)
                elif first and self.tls is not None and self._lost_exc is None:
                    # TLS 1.3 checks a client's certificate after the client's side of the
                    # handshake is done: a server that refuses it closes before answering.
                    self.last_error = (
                        "the server closed the TLS connection before answering: if it requires "
                        "a client certificate (client_auth), this gateway's tls.cert_file must "
                        "be issued by the CA in the server's tls.ca_file"
                    )
                return not first
            if self._closing:
                return not first
            now = self.clock()
            self._last_heard_s = now
            self.round_trips.observe((now - start) * 1000.0)
            if claimed:
                self._on_claim_answer(getattr(st, "claim_error", None))
            self._on_status(st)
            # An older server lists none; more than MAX_FRONTENDS entries are ignored.
            self.frontends = reported_loads(getattr(st, "frontends", None))
            self.frontends_s = now
            got_nonce = getattr(st, "claim_nonce", None)
            if nonce is None and type(got_nonce) is bytes and got_nonce and self.central:
                nonce = got_nonce
                if self.gateway_id:
                    continue  # claim at once, before this link takes tasks
            if first:
                first = False
                self._came_up(now)
                self.last_error = ""
                self._up.set()
                self._pump()
            if await self._pause():
                await asyncio.sleep(_REPOLL_S)  # a burst of rejections: one status call
        return not first

    def _paced(self) -> bool:
        """Whether heartbeats may be skipped or spaced out (gateway.pacing): not where the
        heartbeat renews an ownership claim (central) or reports this gateway's load."""
        return not self.central and self.load_per_s is None

    def _results_suffice(self, now: float) -> bool:
        """The server was heard from within heartbeat_s and nothing asks for its status."""
        return (
            now - self._last_heard_s < self.heartbeat_s
            and not self._poll_now.is_set()
            and self._paced()
        )

    async def _pause(self) -> bool:
        """Wait until the next heartbeat is due: heartbeat_s, or the quiet period while the
        server holds no task, cut short when, given work, it is not heard from within
        heartbeat_s (`_watch_due`: then at once), or by a rejected task (then heartbeat_s
        from there); True when a rejected task asked for the status sooner."""
        period_s = self.heartbeat_s
        if self.quiet_period is not None and not self.outstanding and self._paced():
            quiet_s = self.quiet_period()
            if quiet_s > period_s:
                period_s = quiet_s * self._rng.uniform(1.0 - JITTER, 1.0 + JITTER)
        stretched = self._stretched = period_s > self.heartbeat_s
        # A quiet period ends on the loop's next quiet tick, with the others due then.
        tick_s = min(QUIET_TICK_S, self.heartbeat_s / 4) if stretched else None
        try:
            if not await self._poll_now.wait(period_s, tick_s):
                return False
        finally:
            self._stretched = False
        if stretched and self._silent:
            self._silent = False
            self._poll_now.clear()
            return False  # given work and not heard from since (_watch_due): ask now
        if stretched and not self._repoll:
            self._poll_now.clear()  # given work: the regular period from now
            if not await self._poll_now.wait(self.heartbeat_s):
                return False
        return True

    def _on_claim_answer(self, error: Any) -> None:
        """Log once when the server starts or stops refusing this gateway's claims."""
        error = error if type(error) is str else None
        if error == self.claim_error:
            return
        if error is not None:
            log.warning("server %s refused this gateway's ownership: %s", self.server_id, error)
        self.claim_error = error

    def _on_violation(self, violation: ProtocolViolation, peer: str) -> None:
        self.last_error = f"protocol violation: {violation}"
        log.warning("server %s at %s broke the protocol: %s", self.server_id, peer, violation)
        if self.on_violation is not None:
            self.on_violation(self, violation)

    def _on_status(self, st: Any) -> None:
        """Learn from a heartbeat whether the server drains, who owns it and its order."""
        executor = getattr(st, "executor", None)
        if type(executor) is str and executor:
            self.executor = executor
        reported = getattr(st, "policy", None)
        if self.queue is None and type(reported) is str and reported != self.policy:
            with contextlib.suppress(ValueError):
                self.policy = QueuePolicy(reported)
        draining = bool(st is not None and st.draining)
        owner = st.owner if st is not None and type(st.owner) is str else None
        if (draining, owner) == (self.server_draining, self.owner):
            return
        before = self.owned_elsewhere
        began_draining = draining and not self.server_draining
        self.server_draining, self.owner = draining, owner
        if began_draining:
            self._reject_queued(f"server {self.server_id} is draining")
        if self.owned_elsewhere != before:
            if self.owned_elsewhere is not None:
                log.warning(
                    "server %s is owned by gateway %s: no tasks from this gateway (%s)",
                    self.server_id,
                    self.owned_elsewhere,
                    self.gateway_id,
                )
                self._reject_queued(
                    f"server {self.server_id} is owned by gateway {self.owned_elsewhere}"
                )
            else:
                log.info("server %s: this gateway (%s) owns it", self.server_id, self.gateway_id)
        if self.on_change is not None:
            self.on_change(self)

    def _on_lost(self, exc: Exception | None) -> None:
        if self.state == "closed":
            return
        was_up = self.state == "up"
        self.state = "down"
        self._up.clear()
        self._lost_exc = exc
        if exc is not None:
            self.last_error = f"connection lost: {tls_problem(exc) or exc}"
        elif not self.last_error:
            self.last_error = "connection closed by server"
        if was_up:  # logged once per outage; the reconnects are logged by _attempt_failed
            self._down_since = self.clock()
            log.warning(
                "server %s is down: %s",
                self.server_id,
                self.last_error,
                extra={"server_id": self.server_id, "pool": self.pool, "outcome": "down"},
            )
        self._fail_all("lost", f"connection to server {self.server_id} lost")

    def _fail_one(self, query_id: str, p: PendingTask, reason: str) -> None:
        """One outstanding task ends as failed (its slot is counted free, central queueing)."""
        del self.outstanding[query_id]
        self._notify_idle()
        if self.queue is not None:
            self.queue.done()
            self._pump()
        self.on_failure(self, p, "failed", reason)

    def _reject_queued(self, reason: str) -> None:
        """Central queueing: the tasks still queued here were never sent; reject them now."""
        if self.queue is None or not len(self.queue):
            return
        for p in self.queue.drain():
            self.outstanding.pop(p.run.query_id, None)
            self.on_failure(self, p, "rejected", reason)
        self._notify_idle()

    def _fail_all(self, status: str, reason: str) -> None:
        pending = list(self.outstanding.values())
        self.outstanding.clear()
        self._notify_idle()
        if self.queue is not None:
            self.queue.reset()
        for p in pending:
            self.on_failure(self, p, status, reason)

    # -- tasks ----------------------------------------------------------
    def dispatch(self, p: PendingTask) -> None:
        """Send a task now (server queueing) or queue it here (central queueing)."""
        if self.state != "up" or self._conn is None or self._conn.closed:
            raise LinkDown(f"server {self.server_id} is {self.state}: {self.last_error}")
        qid = p.run.query_id
        now = self.clock()  # one read: the busy mark and the budgets
        if not self.outstanding:
            self._busy_since = now
            if self._stretched and not self._watched:
                # A quiet server given work: its results stand in for the heartbeat, and the
                # busy watch (not a wake-up of the heartbeat's task, nor a timer of its own,
                # which thousands of quiet servers given work would queue on the event loop)
                # checks that they come.
                self._watched = True
                busy_watch().add(self)
        self.outstanding[qid] = p
        if self.queue is None:
            self._send(p, now)
            return
        self.queue.push(p, now)
        self._pump()

    def _watch_due(self) -> bool:
        """The busy watch's check: True when this server leaves it (quiet again, closing,
        or not heard from within heartbeat_s of being given work: then the heartbeat's
        quiet wait ends and it asks for the status now, as a server with work is asked)."""
        if not self._stretched or not self.outstanding or self._closing:
            self._watched = False
            return True  # quiet again, or the heartbeat is back on heartbeat_s by itself
        if self.clock() - max(self._last_heard_s, self._busy_since) < self.heartbeat_s:
            return False
        self._watched = False
        self._silent = True
        self._poll_now.set()
        return True

    def _pump(self) -> None:
        """Central queueing: send what the queue releases into the server's free slots."""
        if self.queue is None or self.state != "up":
            return
        now = self.clock()
        for p in self.queue.ready(now):
            self._send(p, now)
            if self.on_dequeue is not None:
                self.on_dequeue(self, p)

    def _send(self, p: PendingTask, now: float) -> None:
        assert self._conn is not None
        # Budgets are durations; the dispatch delay is spent before the server sees them.
        # Positional, in IDL field order (query_id, task_index, deadline_budget_ms,
        # slo_budget_ms, priority, class_name, payload): this runs once per task.
        one_way_ms = self.round_trips.one_way_ms
        trace = p.trace  # tracing on: the task's span context goes with it
        self._conn.send_item(
            (
                p.run.query_id,
                p.index,
                (p.deadline_s - now) * 1000.0 - one_way_ms,
                (p.slo_deadline_s - now) * 1000.0 - one_way_ms,
                p.priority,
                p.class_name,
                p.payload,
                None if trace is None else trace.traceparent,
                None if trace is None else trace.tracestate,
            )
        )
        p.sent_s = now
        self.tasks_sent += 1

    def cancel_query(self, query_id: str) -> None:
        """Forget the query's task here and cancel it on the server."""
        p = self.outstanding.pop(query_id, None)
        if p is None:
            return
        self._notify_idle()
        if self.queue is not None:
            if self.queue.remove_query(query_id):
                return  # still in our queue: the server never saw it
            self.queue.done()
        if self._conn is not None and not self._conn.closed:
            self._conn.send("cancel", ONEWAY, 0, self._t.TaskServer.cancel_args(query_id=query_id))
        self._pump()

    async def status(self, timeout_s: float = 2.0) -> Any:
        """The server's ServerStatus (a two-way call)."""
        if self._conn is None or self._conn.closed:
            raise LinkDown(f"server {self.server_id} is {self.state}")
        return await self._conn.call("status", self._t.TaskServer.status_args(), timeout_s)

    def _on_message(self, name: str, mtype: int, seqid: int, body: Any) -> None:
        # One clock read per frame: its results arrived together.
        self._last_heard_s = now = self.clock()
        if name == "result":
            results = (body.result,)
        elif name == "result_batch":
            results = body.results or ()
        else:
            return
        batch: list[tuple[PendingTask, TaskReport]] = []
        for r in results:
            report = self._take_result(r)
            if report is not None:
                batch.append(report)
        if not batch:
            return
        if self.on_results is not None:
            self.on_results(self, batch, now)
            return
        for p, report in batch:
            self.on_result(self, p, report, now)

    def _on_decoded(self, items: list[ResultItem]) -> None:
        """A frame of results the decoder took whole (gateway.hotpath: already checked as
        result_problem would), told to the query path at once."""
        self._last_heard_s = now = self.clock()
        batch, refused = take(items, self.outstanding, _REJECTED)
        if refused:
            self._repoll = True  # REJECTED: is the server draining, or owned elsewhere?
            self._poll_now.set()
        if self.queue is not None:
            for _ in batch:  # central queueing: each result frees a slot here
                self.queue.done()
                self._pump()
        if not batch:
            return
        self.results += len(batch)
        if self._idle_waiters:
            self._notify_idle()
        if self.on_results is not None:
            self.on_results(self, batch, now)
            return
        for p, report in batch:
            self.on_result(self, p, report, now)

    def _take_result(self, r: Any) -> tuple[PendingTask, TaskReport] | None:
        """The task a result is for, and the result in our own types; None when it is for
        no task outstanding here, or is not to be believed (the task then fails)."""
        outstanding = self.outstanding
        p = outstanding.get(r.query_id)
        if p is None or p.index != r.task_index:
            return None  # the query already ended (failed, timed out, or cancelled)
        problem = result_problem(r)
        if problem is not None:  # nothing of it is believed: not its timings, not its status
            self._fail_one(r.query_id, p, f"server {self.server_id} sent a bad result: {problem}")
            return None
        del outstanding[r.query_id]
        if self._idle_waiters:
            self._notify_idle()
        status = _STATUS[r.status]  # result_problem checked it is one
        if status is TaskStatus.REJECTED:
            self._repoll = True  # REJECTED: is the server draining, or owned elsewhere now?
            self._poll_now.set()
        self.results += 1
        if self.queue is not None:
            self.queue.done()
            self._pump()
        # Positional, in field order: this runs once per task.
        return p, TaskReport(
            status,
            r.queue_ms,
            r.service_ms,
            r.server_ms,
            bool(r.missed_deadline),
            r.result,
            r.error,
        )
