"""The gateway's history: a compact time series of its figures, behind the dashboard.

Every ``history_interval_s`` the recorder reads the service (`read_figures`: windows as
they stand, counters since start), the pure `HistorySampler` turns that into one sample
(rates over the interval, tail latencies of the queries answered in it), and
`HistoryStore` writes it and deletes what is older than ``history_retention_s``.

Layout: one row per sample, ``gateway_history(id, t, replica, data)``, the sample's
figures as compact JSON text. ``replica`` names the gateway that wrote it, so replicas
that share one database (PostgreSQL) each read back their own series; a table from
before that column gets it added on open, its rows under "" (read by every replica).
Narrow ``(t, series, value)`` rows were the alternative; they lose here
because the set of series changes as servers come and go, the dashboard always reads
whole samples over a time range, and one row per sample (4,320 rows for 6 h at 5 s) keeps
the insert and the retention delete to one indexed statement each. Per-series queries
are Prometheus's job.

Times: ``t`` is wall-clock unix seconds (``time.time``): samples are for people, and they
must line up across gateway restarts, which the service's monotonic clock does not. Rates
are measured on the monotonic clock.

Errors::

    HistoryError        the store cannot be opened, or a read or a write failed
                        (SQLAlchemy's errors are translated here)
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from admission import nearest_rank

if TYPE_CHECKING:
    from gateway.links import TaskLink
    from gateway.view import GatewayView

log = logging.getLogger(__name__)

TOP_SERVERS = 16
"""Servers whose queue depth a sample keeps (the deepest); pools are always summed. Also the
most pipeline servers whose goodput a sample keeps (the busiest)."""
PIPELINE_EXECUTOR = "pipeline"
"""The executor name of a pipeline task server (taskserver.pipeline.PipelineExecutor)."""
EDGE_EXECUTOR = "sensing"
"""The executor name of an edge agent (edge_agent.SensingExecutor)."""
MAX_SAMPLES = 2000
"""Most samples one read returns; longer ranges are thinned evenly."""
PASS_SLICE = 500
"""Servers a sample's pass reads before it lets the event loop run."""

metadata = MetaData()
history_table = Table(
    "gateway_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("t", Float, nullable=False, index=True),
    Column("replica", String(128), nullable=False, server_default=""),
    Column("data", Text, nullable=False),
)


class HistoryError(Exception):
    """The history store cannot be opened, or a read or a write failed."""


# -- the pure part -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    """The gateway at one moment: windows as they stand, counters since start."""

    miss: dict[str, float]
    """Windowed task deadline-miss ratio per class; "all" overall (the admission window)."""
    pool_miss: dict[str, float]
    """Windowed task deadline-miss ratio per pool."""
    latencies_ms: dict[str, list[float]]
    """Latencies of the queries answered (all tasks ok) since the last sample, per class."""
    percentiles: dict[str, float]
    """SLO percentile per class."""
    queries: dict[tuple[str, str], float]
    """(class, outcome) -> queries answered since start (tailgate_queries_total)."""
    deferred: dict[tuple[str, str], int]
    """(class, reason) -> admission DEFER decisions since start."""
    queue: dict[str, tuple[str, int]]
    """Server -> (pool, tasks outstanding for it), for the servers that hold any (an idle
    server adds nothing: with thousands of servers the pass stays cheap)."""
    servers: dict[str, int]
    """Server state -> servers."""
    replicas: dict[str, int]
    """Autoscaled pool -> servers now."""
    goodput: dict[str, int] = field(default_factory=dict)
    """Pipeline server -> tasks it ran (status ok) that met their deadline t_D, since start."""
    drops: dict[str, int] = field(default_factory=dict)
    """Pipeline module -> tasks dropped there (PARD), over all pools, since start."""
    edge: dict[str, tuple[float | None, float]] = field(default_factory=dict)
    """Edge-agent cluster -> (the worst post-queuing p99 of its agents' CDFs in ms, None
    before any; the longest time one of its agents has been silent, in seconds)."""
    pools: tuple[str, ...] = ()
    """Pools with at least one server: their queue total is reported, 0 when idle."""


def _delta(n: float, before: float) -> float:
    """What a cumulative count gained; a count that restarted (a server that came back)
    gained all of itself."""
    return n - before if n >= before else n


class HistorySampler:
    """Turns cumulative figures into compact samples: rates and tails over each interval."""

    def __init__(self, now: float, top_servers: int = TOP_SERVERS) -> None:
        self._last_now = now
        self._top = top_servers
        self._queries: dict[tuple[str, str], float] = {}
        self._deferred: dict[tuple[str, str], int] = {}
        self._goodput: dict[str, int] = {}
        self._drops: dict[str, int] = {}

    def sample(self, f: Figures, now: float, wall: float) -> dict[str, Any]:
        """One sample at wall-clock time `wall`; rates over the time since the last one."""
        elapsed = max(now - self._last_now, 1e-9)
        answered: Counter[str] = Counter()
        rejected: Counter[str] = Counter()
        outcomes: dict[str, dict[str, float]] = {}
        for (cls, outcome), n in f.queries.items():
            delta = n - self._queries.get((cls, outcome), 0.0)
            outcomes.setdefault(cls, {})[outcome] = delta
            if outcome == "rejected":
                rejected[cls] += delta
            else:
                answered[cls] += delta
        deferred: Counter[str] = Counter()
        for (cls, reason), n in f.deferred.items():
            deferred[cls] += n - self._deferred.get((cls, reason), 0)
        classes = sorted({*f.percentiles, *answered, *rejected, *deferred, *f.latencies_ms})
        tail_ms: dict[str, float] = {}
        p99_ms: dict[str, float] = {}
        for cls, unsorted in sorted(f.latencies_ms.items()):
            if unsorted:
                xs = sorted(unsorted)  # once per class; both percentiles read it
                tail_ms[cls] = round(nearest_rank(xs, f.percentiles.get(cls, 99.0)), 3)
                p99_ms[cls] = round(nearest_rank(xs, 99.0), 3)
        pools: Counter[str] = Counter(dict.fromkeys(f.pools, 0))
        for pool, depth in f.queue.values():
            pools[pool] += depth
        # The deepest of the servers holding tasks (not a sort of every server).
        busy = [kv for kv in f.queue.items() if kv[1][1] > 0]
        deepest = heapq.nsmallest(self._top, busy, key=lambda kv: (-kv[1][1], kv[0]))
        goodput = {s: _delta(n, self._goodput.get(s, 0)) / elapsed for s, n in f.goodput.items()}
        busiest = sorted(goodput.items(), key=lambda kv: (-kv[1], kv[0]))[: self._top]
        drops = {m: _delta(n, self._drops.get(m, 0)) / elapsed for m, n in f.drops.items()}
        self._last_now = now
        self._queries = dict(f.queries)
        self._deferred = dict(f.deferred)
        self._goodput = dict(f.goodput)
        self._drops = dict(f.drops)
        return {
            "t": round(wall, 3),
            "miss": {k: round(v, 6) for k, v in sorted(f.miss.items())},
            "pool_miss": {k: round(v, 6) for k, v in sorted(f.pool_miss.items())},
            "tail_ms": tail_ms,
            "p99_ms": p99_ms,
            "qps": {c: round(answered[c] / elapsed, 3) for c in classes},
            "rejected_per_s": {c: round(rejected[c] / elapsed, 3) for c in classes},
            "deferred_per_s": {c: round(deferred[c] / elapsed, 3) for c in classes},
            "queue": dict(sorted(pools.items())),
            "server_queue": {sid: depth for sid, (_, depth) in sorted(deepest)},
            "servers": dict(sorted(f.servers.items())),
            "replicas": dict(sorted(f.replicas.items())),
            "outcome_per_s": {
                c: {o: round(d / elapsed, 3) for o, d in sorted(per.items())}
                for c, per in sorted(outcomes.items())
            },
            "goodput_per_s": {s: round(r, 3) for s, r in sorted(busiest)},
            "drops_per_s": {m: round(r, 3) for m, r in sorted(drops.items())},
            "edge_p99_ms": {
                c: round(p99, 3) for c, (p99, _) in sorted(f.edge.items()) if p99 is not None
            },
            "edge_silent_s": {c: round(silent, 3) for c, (_, silent) in sorted(f.edge.items())},
        }


def thin(samples: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most `limit` samples, evenly spaced, always keeping the newest."""
    if len(samples) <= limit:
        return samples
    step = len(samples) / limit
    picked = [samples[int(i * step)] for i in range(limit - 1)]
    return [*picked, samples[-1]]


# -- the store -----------------------------------------------------------------------------


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn SQLAlchemy's errors into HistoryError at this boundary."""
    try:
        yield
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        detail = str(orig if orig is not None else exc).splitlines()[0]
        raise HistoryError(f"{what}: {exc.__class__.__name__}: {detail}") from exc


def _has_index(engine: Engine, name: str | None) -> bool:
    """Whether the history table has an index of this name (another replica made it)."""
    return any(i["name"] == name for i in inspect(engine).get_indexes(history_table.name))


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: the dashboard's reads never wait for the sampler's write; a crash loses no
    # committed sample. Another gateway on the same file waits instead of failing.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


class HistoryStore:
    """Samples by wall-clock time in one table of any SQLAlchemy database; thread-safe."""

    def __init__(self, url: str, replica: str = "") -> None:
        """Open (creating the table if needed) the database at `url`; "" is in memory.

        `replica` tags what this store writes and filters what it reads.
        """
        self.replica = replica
        try:
            parsed = make_url(url or "sqlite://")
        except (ArgumentError, ValueError) as exc:
            raise HistoryError(f"storage_url: not a database URL: {url!r}") from exc
        self.where = parsed.render_as_string(hide_password=True)
        dialect = parsed.get_backend_name()
        memory = dialect == "sqlite" and parsed.database in (None, "", ":memory:")
        kwargs: dict[str, Any] = {}
        if memory:
            # One shared connection, or every thread would see its own empty database.
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        try:
            self.engine: Engine = create_engine(parsed, **kwargs)
        except (ArgumentError, ImportError) as exc:
            raise HistoryError(f"storage_url: cannot use {self.where!r}: {exc}") from exc
        if dialect == "sqlite" and not memory:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        # One statement at a time: the in-memory database has a single connection, and a
        # file database gains nothing from two writers.
        self._lock = threading.Lock()
        try:
            with _translated(f"history store {self.where}: cannot open"), self._lock:
                self._create_table()
                self._add_replica_column()
        except BaseException:
            self.engine.dispose()
            raise

    def _create_table(self) -> None:
        """The table and its index, where they are missing. Replicas sharing one database
        start together: between another one's check and its CREATE this one may create the
        table, and its CREATE then fails ("already exists"). What exists after such a failure
        is checked again, item by item, and kept."""
        try:
            metadata.create_all(self.engine)
        except SQLAlchemyError:
            if not inspect(self.engine).has_table(history_table.name):
                raise  # not the race: the database refused for another reason
            for index in history_table.indexes:
                try:
                    index.create(self.engine, checkfirst=True)
                except SQLAlchemyError:
                    if not _has_index(self.engine, index.name):
                        raise

    def _add_replica_column(self) -> None:
        """A table written before replicas were told apart gets the column (rows: "")."""
        columns = {c["name"] for c in inspect(self.engine).get_columns("gateway_history")}
        if "replica" not in columns:
            with self.engine.begin() as conn:
                conn.execute(
                    text(
                        "ALTER TABLE gateway_history "
                        "ADD COLUMN replica VARCHAR(128) NOT NULL DEFAULT ''"
                    )
                )

    def append(self, sample: dict[str, Any], keep_after: float) -> None:
        """Write one sample (its "t" is the row's time) and delete rows older than keep_after."""
        data = {k: v for k, v in sample.items() if k != "t"}
        blob = json.dumps(data, separators=(",", ":"))
        row = {"t": float(sample["t"]), "replica": self.replica, "data": blob}
        with _translated(f"history store {self.where}: write failed"), self._lock:
            with self.engine.begin() as conn:
                conn.execute(insert(history_table).values(**row))
                conn.execute(delete(history_table).where(history_table.c.t < keep_after))

    def since(self, t0: float, limit: int = MAX_SAMPLES) -> list[dict[str, Any]]:
        """Samples at or after wall-clock time t0, oldest first, thinned to `limit`."""
        query = (
            select(history_table.c.t, history_table.c.data)
            .where(history_table.c.t >= t0)
            .where(history_table.c.replica.in_((self.replica, "")))
            .order_by(history_table.c.t, history_table.c.id)
        )
        with _translated(f"history store {self.where}: read failed"), self._lock:
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
        return thin([{"t": t, **json.loads(data)} for t, data in rows], limit)

    def close(self) -> None:
        """Release the database connections."""
        with self._lock:
            self.engine.dispose()


# -- the shell -----------------------------------------------------------------------------


def read_figures(service: GatewayView) -> Figures:
    """The service's figures now (drains the latencies answered since the last read)."""
    servers = _ServerPass(service)
    servers.take(service.links.values())
    return servers.figures()


async def read_figures_spread(service: GatewayView, slice_size: int = PASS_SLICE) -> Figures:
    """`read_figures`, its pass over the servers cut into slices of `slice_size` with the
    event loop run between them: with 10,000 servers one pass held the loop ~25 ms (the
    2-core VM), and every query in flight waited that long. The servers are those
    registered when it starts; the windows and counters are read at its end."""
    links = list(service.links.values())
    servers = _ServerPass(service)
    for i in range(0, len(links), slice_size):
        if i:
            await asyncio.sleep(0)
        servers.take(links[i : i + slice_size])
    return servers.figures()


class _ServerPass:
    """What `read_figures` gathers from every server, a slice of them at a time."""

    def __init__(self, service: GatewayView) -> None:
        self.service = service
        self.queue: dict[str, tuple[str, int]] = {}
        self.pools: dict[str, None] = {}
        self.states: dict[str, int] = {}
        self.pipelines: list[tuple[str, str]] = []
        self.edge: dict[str, tuple[float | None, float]] = {}

    def take(self, links: Iterable[TaskLink]) -> None:
        """Add these servers' queues, states, pipelines and edge clusters."""
        book = self.service.book
        queue, pools, states, edge = self.queue, self.pools, self.states, self.edge
        for lk in links:
            pool = lk.pool
            pools[pool] = None
            depth = len(lk.outstanding)
            if depth:
                queue[lk.server_id] = (pool, depth)
            state = lk.display_state
            states[state] = states.get(state, 0) + 1
            executor = lk.executor
            if executor is None:
                continue
            if executor == PIPELINE_EXECUTOR:
                self.pipelines.append((lk.server_id, pool))
            elif executor == EDGE_EXECUTOR:
                cluster = lk.cluster or pool
                worst, silent = edge.get(cluster, (None, 0.0))
                if book.has_server(lk.server_id):
                    p99 = book.cdf_of(lk.server_id).quantile(0.99)
                    worst = p99 if worst is None else max(worst, p99)
                edge[cluster] = (worst, max(silent, lk.silent_s))

    def figures(self) -> Figures:
        """The figures: the servers taken so far, the windows and counters as they are now."""
        service = self.service
        now = service.clock()
        m = service.metrics
        windows = service.server_windows
        windows.update(now)
        window = service.gate.window
        miss = {"all": window.ratio(now)}
        for c in service.config.classes:
            miss[c.name] = window.ratio(now, c.name)
        queries: dict[tuple[str, str], float] = {}
        for family in m.queries.collect():
            for s in family.samples:
                if s.name.endswith("_total"):
                    queries[(s.labels["class"], s.labels["outcome"])] = s.value
        goodput: dict[str, int] = {}
        for server_id, pool in self.pipelines:
            tasks, misses = windows.counts.get((server_id, pool), (0, 0))
            goodput[server_id] = tasks - misses
        drops: Counter[str] = Counter()
        for (_, module), n in m.drop_counts.items():
            drops[module] += n
        return Figures(
            miss=miss,
            pool_miss={p: windows.pool_ratio(p, now) for p in windows.pools()},
            latencies_ms=m.drain_latencies(),
            percentiles={c.name: c.percentile for c in service.config.classes},
            queries=queries,
            deferred=dict(service.gate.controller.deferred),
            queue=self.queue,
            servers=self.states,
            replicas=(
                {}
                if service.autoscaler is None
                else {service.autoscaler.config.pool: service.autoscaler.replicas_now()}
            ),
            goodput=goodput,
            drops=dict(drops),
            edge=self.edge,
            pools=tuple(self.pools),
        )


class HistoryRecorder:
    """Samples the service every interval into the store; started and stopped with it."""

    def __init__(
        self, service: GatewayView, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        config = service.config
        self.service = service
        self.wall_clock = wall_clock
        self.url = config.storage_url
        self.interval_s = config.history_interval_s
        self.retention_s = config.history_retention_s
        self.replica = config.replica or socket.gethostname()
        self.store: HistoryStore | None = None
        self.samples_written = 0
        self.last_error = ""
        self.failed_writes = 0
        """Samples the store refused since it last took one."""
        self._sampler = HistorySampler(service.clock())
        self._task: asyncio.Task[None] | None = None

    @property
    def where(self) -> str:
        """The store's URL without its password ("" before start)."""
        return self.store.where if self.store is not None else ""

    async def start(self) -> None:
        """Open the store (in memory if it cannot be opened) and start sampling."""
        if self._task is not None:
            return
        try:
            self.store = await asyncio.to_thread(HistoryStore, self.url, self.replica)
        except HistoryError as exc:
            # The gateway's job is answering queries: it goes on, with history in memory.
            self.last_error = str(exc)
            log.error("%s; keeping the history in memory only", exc)
            self.store = await asyncio.to_thread(HistoryStore, "")
        self._sampler = HistorySampler(self.service.clock())
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling and close the store."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # The gateway is stopping: its links still have to close.
                log.exception("history sampler failed")
        store, self.store = self.store, None
        if store is not None:
            try:
                await asyncio.to_thread(store.close)
            except Exception:
                log.exception("history store %s: close failed", store.where)

    async def record(self) -> dict[str, Any]:
        """Take one sample now and write it."""
        figures = await read_figures_spread(self.service)
        sample = self._sampler.sample(figures, self.service.clock(), self.wall_clock())
        if self.store is not None:
            keep_after = sample["t"] - self.retention_s
            await asyncio.to_thread(self.store.append, sample, keep_after)
            self.samples_written += 1
        return sample

    async def since(self, since_s: float) -> list[dict[str, Any]]:
        """Samples of the last since_s seconds, oldest first (thinned to MAX_SAMPLES)."""
        if self.store is None:
            return []
        return await asyncio.to_thread(self.store.since, self.wall_clock() - since_s)

    async def _run(self) -> None:
        clock = self.service.clock
        next_s = clock() + self.interval_s
        while True:
            await asyncio.sleep(max(next_s - clock(), 0.0))
            # A fixed rate, skipping ticks a slow write ran over.
            next_s = max(next_s + self.interval_s, clock())
            try:
                await self.record()
            except HistoryError as exc:
                # Once per distinct error (a full disk fails every write alike); the
                # gateway goes on answering, and the history resumes with the store.
                if str(exc) != self.last_error:
                    log.warning("%s; the gateway goes on without it", exc)
                self.last_error = str(exc)
                self.failed_writes += 1
            except Exception as exc:
                # A bug in one sample must not end the sampling for good.
                error = f"history sample failed: {exc!r}"
                if error != self.last_error:
                    log.exception("%s", error)
                self.last_error = error
            else:
                if self.failed_writes:
                    log.warning(
                        "history store %s: writing again after %d failed samples",
                        self.where,
                        self.failed_writes,
                    )
                self.last_error = ""
                self.failed_writes = 0
