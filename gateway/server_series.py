"""The gateway's per-server Prometheus families, gathered a slice of servers at a time.

Six families have one series (or four: the post-queuing quantiles) per registered server.
At 10,000 servers that is ~90,000 samples, and `prometheus_client.generate_latest` took
1.1-1.8 s to collect and format them (the 2-core VM), all of it on the event loop, every
scrape: every query in flight waited that long. So GET /metrics renders these families
itself (`server_text`), formatting each sample as it is taken, a slice of servers at a time
with the loop let run between slices; the rest of the registry goes through
`generate_latest` as before. The registry's collector takes the same samples
(`ServerSeries` with a `MetricSink`), so in-process readers see the same figures, and a test
holds the two texts equal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gateway.waits import backlog_wait

if TYPE_CHECKING:
    from gateway.links import TaskLink
    from gateway.server_windows import ServerMissRatios
    from gateway.view import GatewayView

__all__ = [
    "POST_QUEUING_QUANTILES",
    "SCRAPE_SLICE",
    "SERVER_FAMILIES",
    "MetricSink",
    "ServerSeries",
    "TextSink",
    "server_text",
    "servers_family",
]

POST_QUEUING_QUANTILES = (0.5, 0.9, 0.99, 0.999)
"""Quantiles of each server's post-queuing CDF exported at scrape time."""
SCRAPE_SLICE = 250
"""Servers a scrape renders before it lets the event loop run (7-18 ms a slice on the 2-core
VM, one run at 10,000 servers)."""

SERVER_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "tailgate_server_tasks",
        "counter",
        "Tasks that ran on a server (status ok): the denominator of its miss ratio.",
        ("server", "pool"),
    ),
    (
        "tailgate_server_task_deadline_misses",
        "counter",
        "Tasks a server dequeued after their deadline t_D.",
        ("server", "pool"),
    ),
    (
        "tailgate_server_task_miss_ratio",
        "gauge",
        "Task deadline-miss ratio of a server over the last minute.",
        ("server", "pool"),
    ),
    (
        "tailgate_server_queue_depth",
        "gauge",
        "Tasks outstanding for a server as the gateway sees them: in flight plus "
        "waiting in the gateway's central queue.",
        ("server", "pool"),
    ),
    (
        "tailgate_server_post_queuing_seconds",
        "gauge",
        "Quantiles of a server's post-queuing time CDF in the CDF book.",
        # "q", not "quantile": that label is reserved for summaries (promtool).
        ("server", "q"),
    ),
    (
        "tailgate_server_estimated_wait_seconds",
        "gauge",
        "Estimated mean queue wait of a task joining at the back of a server's queue now "
        "(QLM's estimator on the server's post-queuing times).",
        ("server", "pool"),
    ),
)
"""(name, type, help, label names) of each per-server family, in exposition order."""
TASKS, MISSES, MISS_RATIO, DEPTH, POST_QUEUING, EST_WAIT = range(len(SERVER_FAMILIES))

Emit = Callable[[int, str, str, float], None]
"""emit(family, first label value (the server), second label value, value)."""


class MetricSink:
    """Samples into prometheus_client families (the registry's collector)."""

    def __init__(self) -> None:
        self.families: list[Metric] = [
            (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=list(labels)
            )
            for name, kind, doc, labels in SERVER_FAMILIES
        ]

    def emit(self, family: int, a: str, b: str, value: float) -> None:
        """Add one sample."""
        self.families[family].add_metric([a, b], value)


def _escape(value: str) -> str:
    """A label value as the text format writes it (prometheus_client's escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class TextSink:
    """Samples formatted into the text exposition format as they come."""

    def __init__(self) -> None:
        self.lines: list[list[str]] = [[] for _ in SERVER_FAMILIES]
        # Everything of a line up to the first label value, and between the two values;
        # labels in the order of their names, as generate_latest writes them.
        self._swap = [labels[0] > labels[1] for _, _, _, labels in SERVER_FAMILIES]
        names = [sorted(labels) for _, _, _, labels in SERVER_FAMILIES]
        self._heads = [
            f'{name}{"_total" if kind == "counter" else ""}{{{first}="'
            for (name, kind, _, _), (first, _) in zip(SERVER_FAMILIES, names, strict=True)
        ]
        self._mids = [f'",{second}="' for _, second in names]
        self._escaped: dict[str, str] = {}

    def emit(self, family: int, a: str, b: str, value: float) -> None:
        """Format one sample."""
        escaped = self._escaped
        ea = escaped.get(a)
        if ea is None:
            ea = escaped[a] = _escape(a)
        eb = escaped.get(b)
        if eb is None:
            eb = escaped[b] = _escape(b)
        if self._swap[family]:
            ea, eb = eb, ea
        self.lines[family].append(
            f'{self._heads[family]}{ea}{self._mids[family]}{eb}"}} {floatToGoString(value)}\n'
        )

    def text(self) -> str:
        """The families, each with its HELP and TYPE lines (empty ones too, as
        generate_latest writes them)."""
        out: list[str] = []
        for (name, kind, doc, _), lines in zip(SERVER_FAMILIES, self.lines, strict=True):
            help_text = doc.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name}{'_total' if kind == 'counter' else ''} {help_text}\n")
            out.append(f"# TYPE {name}{'_total' if kind == 'counter' else ''} {kind}\n")
            out.extend(lines)
        return "".join(out)


class ServerSeries:
    """The samples of the per-server families, taken a slice of servers at a time."""

    def __init__(
        self, view: GatewayView, windows: ServerMissRatios, now: float, emit: Emit
    ) -> None:
        self.view = view
        self.windows = windows
        self.now = now
        self.emit = emit
        self._q_labels = [f"{q:g}" for q in POST_QUEUING_QUANTILES]
        # Servers of one pool or cluster row share a CDF: its quantiles are read once.
        # (The snapshot is kept with them so that its id is not reused while cached.)
        self._quantiles: dict[int, tuple[object, list[float]]] = {}
        self.states: dict[tuple[str, str], int] | None = None
        """When a dict: (pool, display state) -> servers, counted as their links are taken
        (tailgate_servers in the scrape's slices)."""

    def take_counts(self, items: Iterable[tuple[tuple[str, str], Sequence[int]]]) -> None:
        """Tasks and misses of these (server, pool) counts."""
        emit = self.emit
        for (server, pool), (n, missed) in items:
            emit(TASKS, server, pool, n)
            emit(MISSES, server, pool, missed)

    def take_links(self, links: Iterable[TaskLink]) -> None:
        """Miss ratio, queue depth, CDF quantiles and estimated wait of these servers."""
        emit, now, windows = self.emit, self.now, self.windows
        book = self.view.book
        q_labels = self._q_labels
        states = self.states
        for lk in links:
            sid, pool = lk.server_id, lk.pool
            if states is not None:
                key = (pool, lk.display_state)
                states[key] = states.get(key, 0) + 1
            emit(MISS_RATIO, sid, pool, windows.server_ratio(sid, pool, now))
            emit(DEPTH, sid, pool, len(lk.outstanding))
            if not book.has_server(sid):
                continue
            cdf = book.cdf_of(sid)
            cached = self._quantiles.get(id(cdf))
            if cached is None or cached[0] is not cdf:
                quantiles = [v / 1000.0 for v in cdf.quantiles(POST_QUEUING_QUANTILES)]
                self._quantiles[id(cdf)] = (cdf, quantiles)
            else:
                quantiles = cached[1]
            for q, value in zip(q_labels, quantiles, strict=True):
                emit(POST_QUEUING, sid, q, value)
            wait = backlog_wait(lk, partial(book.moments, sid))
            emit(EST_WAIT, sid, pool, wait.mean_ms / 1000.0)


def servers_family(states: dict[tuple[str, str], int]) -> GaugeMetricFamily:
    """tailgate_servers: registered servers by pool and (display) state."""
    fam = GaugeMetricFamily(
        "tailgate_servers",
        "Registered task servers by pool and state.",
        labels=["pool", "state"],
    )
    for (pool, state), n in sorted(states.items()):
        fam.add_metric([pool, state], n)
    return fam


class _Families:
    """Families as a registry (for generate_latest)."""

    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


async def server_text(
    view: GatewayView,
    windows: ServerMissRatios,
    slice_size: int = SCRAPE_SLICE,
    *,
    servers: bool = False,
) -> str:
    """The per-server families as exposition text, the event loop run between slices;
    with `servers`, tailgate_servers after them, counted in the same slices.

    The servers and counts are those at its start; each server's figures (its state too)
    are read when its slice is taken (a server removed meanwhile still shows, as at the
    start)."""
    now = view.clock()
    windows.update(now)
    counts = list(windows.counts.items())
    links = list(view.links.values())
    await asyncio.sleep(0)
    counts.sort()
    await asyncio.sleep(0)
    links.sort(key=lambda lk: lk.server_id)
    await asyncio.sleep(0)
    sink = TextSink()
    series = ServerSeries(view, windows, now, sink.emit)
    if servers:
        series.states = {}
    for i in range(0, len(counts), slice_size):
        series.take_counts(counts[i : i + slice_size])
        await asyncio.sleep(0)
    for i in range(0, len(links), slice_size):
        series.take_links(links[i : i + slice_size])
        await asyncio.sleep(0)
    text = sink.text()
    if series.states is not None:
        text += generate_latest(_Families(servers_family(series.states))).decode()  # type: ignore[arg-type]
    return text
