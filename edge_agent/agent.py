"""The edge agent runtime: a task server with a sensing executor, a sampler and a pruner.

``run_agent`` opens the store (integrity check first), samples the reader every
``sample_interval_s``, prunes readings older than the retention every
``prune_interval_s``, and serves sensing tasks through ``taskserver.server.serve`` until
told to stop (SIGTERM in the CLI: it drains first, see ``run_agent``). Reader and store
faults while sampling are logged and counted (the ``status`` sensing task shows the
counts) and never stop the agent.

``run_agents`` runs several agents in one process (a dense loopback testbed): each with
its own identity, listener, queue and registration, all on one shared store.

A full disk refuses the sampler's writes (StoreFull): one WARNING when it starts and one
line when writes resume; meanwhile the readings of each sample are dropped, every committed
reading stays and sensing tasks are answered from it.

Errors: a StoreError from opening the store propagates (the CLI exits non-zero; an empty
store file without ``init_store``, or one that fails its check, says what to do); so does
an OSError from binding the Thrift port.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from edge_agent.config import AgentConfig
from edge_agent.profiles import make_profile
from edge_agent.readers import (
    CommandReader,
    IioReader,
    ReaderError,
    SensorReader,
    SimulatedReader,
)
from edge_agent.sensing import SensingExecutor
from edge_agent.store import SensorStore, StoreError, StoreFull
from taskserver.config import TaskServerConfig
from taskserver.server import serve, serve_together

if TYPE_CHECKING:  # loaded only with a metrics port
    from prometheus_client import CollectorRegistry

__all__ = [
    "Sampler",
    "SamplerStats",
    "build_reader",
    "run_agent",
    "run_agents",
    "task_server_config",
    "tune_malloc",
]

log = logging.getLogger(__name__)
_LOG_EVERY = 100
"""A fault that repeats is logged once, then every this many times."""


@dataclass(slots=True)
class SamplerStats:
    """What the sampler did so far (part of the agent's status)."""

    samples: int = 0
    readings: int = 0
    reader_faults: int = 0
    store_faults: int = 0
    last_fault: str | None = None
    last_sample_ts: int | None = None
    store_full: bool = False
    """The last write was refused by a full disk (its readings were dropped)."""
    dropped_full: int = 0
    """Readings dropped because the disk was full, since start."""


class Sampler:
    """Reads the reader and stores its readings; faults are counted, never raised."""

    def __init__(
        self,
        reader: SensorReader,
        store: SensorStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.store = store
        self.clock = clock
        self.stats = SamplerStats()
        self._last_logged: str | None = None

    async def sample_once(self) -> int:
        """Take one sample; returns the readings stored."""
        now = self.clock()
        try:
            values = await asyncio.to_thread(self.reader.read, now)
        except ReaderError as exc:
            values = exc.partial
            self._fault("reader", str(exc))
        except Exception as exc:  # a reader bug must not stop sampling
            values = {}
            self._fault("reader", f"internal error: {exc!r}")
        self.stats.samples += 1
        if not values:
            return 0
        written, error = await asyncio.to_thread(self._write, int(now), values)
        self.stats.readings += written
        if written:
            self.stats.last_sample_ts = int(now)
        if isinstance(error, StoreFull):
            self._full(str(error), len(values) - written)
            return written
        if written and self.stats.store_full:
            self.stats.store_full = False
            log.warning(
                "store writable again (%s): %d readings were dropped while the disk was full",
                self.reader.name,
                self.stats.dropped_full,
            )
        if error is not None:
            self._fault("store", str(error))
        return written

    def _write(self, ts: int, values: dict[str, float]) -> tuple[int, StoreError | None]:
        written = 0
        for sensor, value in values.items():
            try:
                self.store.insert(sensor, ts, value)  # one transaction per reading
            except StoreError as exc:
                return written, exc
            written += 1
        return written, None

    def _full(self, message: str, dropped: int) -> None:
        """A full disk refused a write: one WARNING when that starts, counted after."""
        self.stats.store_faults += 1
        self.stats.dropped_full += dropped
        self.stats.last_fault = f"store: {message}"
        if not self.stats.store_full:
            self.stats.store_full = True
            count = self.stats.store_faults
            log.warning("store fault #%d (%s): %s", count, self.reader.name, message)

    def _fault(self, kind: str, message: str) -> None:
        self.stats.last_fault = f"{kind}: {message}"
        if kind == "reader":
            self.stats.reader_faults += 1
            count = self.stats.reader_faults
        else:
            self.stats.store_faults += 1
            count = self.stats.store_faults
        if message != self._last_logged or count % _LOG_EVERY == 0:
            log.warning("%s fault #%d (%s): %s", kind, count, self.reader.name, message)
            self._last_logged = message

    async def run(self, interval_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        """Sample every interval_s until cancelled (a missed tick is skipped, not queued)."""
        next_at = monotonic()
        while True:
            await self.sample_once()
            next_at += interval_s
            now = monotonic()
            if next_at < now:
                next_at = now
            await asyncio.sleep(next_at - now)

    def status(self) -> dict[str, Any]:
        """The sampler's part of the agent's status."""
        return {"reader": self.reader.name, **asdict(self.stats)}


async def _prune_forever(
    store: SensorStore, retention_s: float, interval_s: float, clock: Callable[[], float]
) -> None:
    """Delete readings past the retention now and every interval_s."""
    while True:
        try:
            deleted = await asyncio.to_thread(store.prune, int(clock() - retention_s))
        except StoreError as exc:
            log.warning("prune failed: %s", exc)
        else:
            if deleted:
                log.info("pruned %d readings older than %.0f days", deleted, retention_s / 86400)
        await asyncio.sleep(interval_s)


def tune_malloc() -> bool:
    """Make glibc give freed memory back: one malloc arena, big buffers mmap-ed (Linux).

    A range answer is ~100 KB of text built in a worker thread and sent from the event
    loop. With glibc's defaults every thread gets an arena of its own and the mmap
    threshold rises after the first big free, so such buffers end up scattered over
    fragmented heaps: a serving agent grew by ~3.5 MB that way on the benchmark, ~1 MB
    with these settings. Call it once, before threads start; False where there is no
    glibc (the defaults then stay).
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # <malloc.h>
    ok = mallopt(m_arena_max, 1) == 1
    ok &= mallopt(m_mmap_threshold, 32 * 1024) == 1
    ok &= mallopt(m_trim_threshold, 128 * 1024) == 1
    return bool(ok)


def build_reader(config: AgentConfig) -> SensorReader:
    """The sensor reader the config names."""
    if config.reader == "iio":
        assert config.iio_device is not None
        return IioReader(config.iio_device)
    if config.reader == "command":
        assert config.command is not None
        return CommandReader(config.command, config.command_timeout_s)
    return SimulatedReader(config.seed, config.sensors)


def task_server_config(config: AgentConfig) -> TaskServerConfig:
    """The task server shell's config for this agent."""
    return TaskServerConfig(
        server_id=config.agent_id,
        host=config.host,
        port=config.port,
        metrics_port=config.metrics_port,
        policy=config.policy,
        slots=config.slots,
        gateway_url=config.gateway_url,
        pool=config.pool,
        advertise=config.advertise,
        register_interval_s=config.register_interval_s,
        drain_timeout_s=config.drain_timeout_s,
        token=config.token,
        cluster=config.cluster,
        seed=config.seed,
        max_frame_bytes=config.max_frame_bytes,
        tls=config.tls,
    )


def _open_store(config: AgentConfig) -> SensorStore:
    """The agent's store, opened and checked; a new one is said so in the log."""
    store = SensorStore(config.database, init=config.init_store)
    if store.created:
        log.info("store %s: a new, empty store", store)
    return store


def _metrics_registry(config: AgentConfig, sampler: Sampler) -> CollectorRegistry | None:
    """A registry with the sampler's metrics when the agent serves /metrics, else None."""
    if not config.metrics_port:
        return None  # prometheus_client is never imported then
    from prometheus_client import CollectorRegistry

    from edge_agent.metrics import SamplerCollector

    registry = CollectorRegistry()
    registry.register(SamplerCollector(sampler.status, config.agent_id, config.cluster))
    return registry


def _executor(
    config: AgentConfig, store: SensorStore, sampler: Sampler, clock: Callable[[], float]
) -> SensingExecutor:
    return SensingExecutor(
        store,
        agent_id=config.agent_id,
        retention_s=config.retention_s,
        profile=make_profile(config.profile),
        seed=config.seed,
        clock=clock,
        stats=sampler.status,
        read_sample=config.read_sample,
        time_scale=config.time_scale,
    )


async def run_agent(
    config: AgentConfig,
    ready: Callable[[str], None] | None = None,
    *,
    clock: Callable[[], float] = time.time,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the agent until `stop` is set (then drain) or until cancelled.

    `ready` gets the task server's JSON line once listening. Draining is the task server's
    (taskserver.lifecycle): no new task, the queue served within drain_timeout_s, the rest
    sent back REJECTED, the gateways told; sampling goes on until it is done.
    """
    # Store reads, writes and reader calls go through asyncio.to_thread: a few threads are
    # plenty for one SD card, and each extra thread would keep a malloc arena of its own.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=min(config.slots + 1, 4), thread_name_prefix="edge-io")
    )
    store = await asyncio.to_thread(_open_store, config)
    background: list[asyncio.Task[None]] = []
    sampler: Sampler | None = None
    try:
        sampler = Sampler(build_reader(config), store, clock=clock)
        executor = _executor(config, store, sampler, clock)
        log.info(
            "edge agent %s (cluster %s): store %s with sensors %s, reader %s, profile %s",
            config.agent_id,
            config.cluster,
            store,
            ", ".join(store.sensor_names()) or "none yet",
            sampler.reader,
            config.profile,
        )
        background.append(loop.create_task(sampler.run(config.sample_interval_s)))
        background.append(
            loop.create_task(
                _prune_forever(store, config.retention_s, config.prune_interval_s, clock)
            )
        )
        await serve(
            task_server_config(config),
            ready,
            executor=executor,
            registry=_metrics_registry(config, sampler),
            stop=stop,
        )
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        store.close()
        if sampler is not None:
            log.info("edge agent %s stopped: %s", config.agent_id, sampler.status())


async def run_agents(
    configs: Sequence[AgentConfig],
    ready: Callable[[str], None] | None = None,
    *,
    clock: Callable[[], float] = time.time,
    stop: asyncio.Event | None = None,
) -> None:
    """Run several agents in this event loop (`config.dense_agent_configs`) until `stop`.

    Each agent has its own id, cluster, listener, queue, slots, profile draws and
    registration, and announces itself on its own line, as a process of its own would. They
    share the first config's store, and one sampler and one pruner keep it (a dense
    testbed's agents read a store rather than own one). If one agent fails (a port taken),
    the others are stopped and drained, and its error is raised.
    """
    if not configs:
        raise ValueError("configs: need at least one agent")
    first = configs[0]
    if len({c.database for c in configs}) != 1:
        raise ValueError("configs: dense agents share one store; they name several")
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=4, thread_name_prefix="edge-io"))
    store = await asyncio.to_thread(_open_store, first)
    background: list[asyncio.Task[None]] = []
    try:
        sampler = Sampler(build_reader(first), store, clock=clock)
        background += [
            loop.create_task(sampler.run(first.sample_interval_s)),
            loop.create_task(
                _prune_forever(store, first.retention_s, first.prune_interval_s, clock)
            ),
        ]
        log.info(
            "%d edge agents %s..%s (cluster %s) in one process on store %s, profile %s, "
            "read sample %g, time scale %g",
            len(configs),
            first.agent_id,
            configs[-1].agent_id,
            ", ".join(dict.fromkeys(c.cluster for c in configs)),
            store,
            ", ".join(dict.fromkeys(c.profile for c in configs)),
            first.read_sample,
            first.time_scale,
        )
        agents = [
            functools.partial(
                serve,
                task_server_config(c),
                ready,
                executor=_executor(c, store, sampler, clock),
                registry=_metrics_registry(c, sampler),
            )
            for c in configs
        ]
        await serve_together(agents, stop=stop)
        log.info("%d edge agents stopped: %s", len(configs), sampler.status())
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        store.close()
