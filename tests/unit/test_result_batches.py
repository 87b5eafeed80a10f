"""Results that come back together (one frame) are recorded together, as one by one would.

Real `ServerLink`s on in-memory connections (no server, no heartbeat), a fake clock, and
result frames built with the task servers' own `Batcher`: a frame of results reaches the
query path in one `on_results` call, and the CDF rows, miss windows, counters and request
groups end up as they do when the same results come one frame each.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from gateway.cdf import CdfBook
from gateway.config import GatewayConfig
from gateway.hotpath import TaskFrames
from gateway.links import ServerLink, TaskReport
from gateway.queries import PendingTask, QueryOutcome
from gateway.requests import QueryRequest, RegisterRequest, Targets
from gateway.service import GatewayService
from gateway.table_cdf import prior_of
from taskserver.service_time import ServiceSpec, make_distribution
from taskserver.wire import (
    ONEWAY,
    Batcher,
    TaskStatus,
    ThriftConnection,
    gateway_body_types,
    thrift,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class _Transport:
    """Where an in-memory ThriftConnection writes (nothing reads it)."""

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class WiredLink(ServerLink):
    """A ServerLink up at once on an in-memory connection: the test plays the server."""

    def start(self) -> None:
        # As ServerLink._run builds it: tasks out and result frames in through gateway.hotpath.
        conn = ThriftConnection(
            gateway_body_types(),
            self._on_message,
            self._on_lost,
            batcher=TaskFrames(),
            fast_frames=(self._results.decode, self._on_decoded),
        )
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        self._conn, self.state = conn, "up"
        self._up.set()

    def frame(self, results: list[Any]) -> None:
        """Results as one frame from the server."""
        assert self._conn is not None
        self._conn.data_received(Batcher.result().encode(results))


def result_of(p: PendingTask, *, missed: bool = False, status: int = 0, **kw: Any) -> Any:
    """The wire's TaskResult for a task (server time 2 ms, 0.5 of it queued)."""
    fields = dict(queue_ms=0.5, service_ms=1.5, server_ms=2.0, result=b'{"n": 1}', error=None)
    fields.update(kw)
    return thrift().TaskResult(
        query_id=p.run.query_id, task_index=p.index, status=status,
        missed_deadline=missed, **fields,
    )  # fmt: skip


async def _service(servers: int) -> tuple[GatewayService, FakeClock, list[WiredLink]]:
    clock = FakeClock()
    svc = GatewayService(GatewayConfig(storage_url=""), clock=clock, link_factory=WiredLink)
    for i in range(servers):
        await svc.register(RegisterRequest(f"s{i}", "default", f"127.0.0.1:{9000 + i}", 64))
    return svc, clock, [lk for lk in svc.links.values() if isinstance(lk, WiredLink)]


async def _run_queries(
    n: int, per_frame: bool
) -> tuple[GatewayService, list[Any], list[list[PendingTask]]]:
    """n queries of fanout 2 on 2 servers; every result comes back, in one frame per server
    (per_frame) or one frame per result. Every third task missed its deadline."""
    svc, clock, links = await _service(2)
    req = QueryRequest("B", 99.0, 300.0, 1, Targets(pool="default", fanout=2), b"{}")
    runs = [asyncio.create_task(svc.run_query(req)) for _ in range(n)]
    for _ in range(3):
        await asyncio.sleep(0)
    clock.now += 0.004
    sent = [sorted(lk.outstanding.values(), key=lambda p: p.run.query_id) for lk in links]
    for lk, tasks in zip(links, sent, strict=True):
        results = [result_of(p, missed=i % 3 == 0) for i, p in enumerate(tasks)]
        if per_frame:
            lk.frame(results)
        else:
            for r in results:
                lk.frame([r])
    return svc, await asyncio.gather(*runs), sent


async def test_a_frame_of_results_is_recorded_as_the_same_results_one_by_one() -> None:
    batched, answers, sent = await _run_queries(12, per_frame=True)
    single, _, _ = await _run_queries(12, per_frame=False)
    assert {a.outcome for a in answers} == {QueryOutcome.MET}
    assert len(sent[0]) == 12  # one frame of 12 results per server
    m, n = batched.metrics, single.metrics
    assert m.task_counts == n.task_counts == {("default", "ok"): 24}
    assert m.miss_counts == n.miss_counts == {("B", "default"): 8}
    assert m.server_windows.counts == n.server_windows.counts
    assert m.server_windows.counts[("s0", "default")] == [12, 4]
    assert batched.gate.window.snapshot(0.0) == single.gate.window.snapshot(0.0)
    assert batched.gate.miss_ratio("B") == pytest.approx(8 / 24)
    for sid in ("s0", "s1"):
        assert batched.book.samples_seen(sid) == single.book.samples_seen(sid) == 12
    (group,) = batched.query.groups.groups.values()
    (other,) = single.query.groups.groups.values()
    assert (group.tasks_outstanding, group.service_samples) == (0, 24)
    assert (other.tasks_outstanding, other.service_samples) == (0, 24)
    assert group.service_ms_sum == pytest.approx(other.service_ms_sum) == pytest.approx(36.0)


@pytest.mark.parametrize(
    ("bad_fields", "words"),
    [
        ({"server_ms": math.nan}, "queue_ms, service_ms, server_ms: must be finite"),
        # A queue wait longer than the server's whole time: a negative post-queuing time,
        # which once raised inside the CDF book and closed the link with all its tasks.
        ({"queue_ms": 50.0, "server_ms": 10.0}, "queue_ms: must not exceed server_ms"),
    ],
)
async def test_a_bad_result_in_a_frame_fails_its_task_and_the_others_arrive_together(
    bad_fields: dict[str, float], words: str
) -> None:
    svc, _, links = await _service(1)
    (link,) = links
    delivered: list[list[tuple[PendingTask, TaskReport]]] = []
    failed: list[tuple[PendingTask, str, str]] = []
    link.on_results = lambda lk, batch, now: delivered.append(batch)
    link.on_failure = lambda lk, p, status, reason: failed.append((p, status, reason))
    req = QueryRequest("B", 99.0, 300.0, 1, Targets(pool="default", fanout=1), b"{}")
    runs = [asyncio.create_task(svc.run_query(req)) for _ in range(3)]
    for _ in range(3):
        await asyncio.sleep(0)
    tasks = sorted(link.outstanding.values(), key=lambda p: p.run.query_id)
    bad = result_of(tasks[1], **bad_fields)
    link.frame([result_of(tasks[0]), bad, result_of(tasks[2], status=TaskStatus.DROPPED)])
    assert [[p for p, _ in batch] for batch in delivered] == [[tasks[0], tasks[2]]]
    assert [r.status for _, r in delivered[0]] == [TaskStatus.OK, TaskStatus.DROPPED]
    assert [(p, status) for p, status, _ in failed] == [(tasks[1], "failed")]
    assert "sent a bad result" in failed[0][2] and words in failed[0][2]
    assert link.outstanding == {} and link.results == 2
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


async def test_a_link_without_a_batch_callback_reports_each_result() -> None:
    svc, _, links = await _service(1)
    (link,) = links
    link.on_results = None
    seen: list[PendingTask] = []
    link.on_result = lambda lk, p, r, now: seen.append(p)
    req = QueryRequest("B", 99.0, 300.0, 1, Targets(pool="default", fanout=1), b"{}")
    runs = [asyncio.create_task(svc.run_query(req)) for _ in range(2)]
    for _ in range(3):
        await asyncio.sleep(0)
    tasks = sorted(link.outstanding.values(), key=lambda p: p.run.query_id)
    body = thrift().TaskSink.result_batch_args(results=[result_of(p) for p in tasks])
    link._on_message("result_batch", ONEWAY, 0, body)
    assert seen == tasks
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


def _book(window: int) -> CdfBook:
    book = CdfBook(window_size=window, refresh_every=16)
    book.add_server("a", np.linspace(1.0, 2.0, window))
    return book


@pytest.mark.parametrize("sizes", [[3, 5, 9], [10, 30, 7, 50], [150], [64, 64, 1]])
def test_observe_many_fills_the_window_as_observe_does(sizes: list[int]) -> None:
    rng = np.random.default_rng(7)
    one, many = _book(64), _book(64)
    for n in sizes:
        values = rng.uniform(0.0, 5.0, n).tolist()
        for v in values:
            one.observe("a", v)
        many.observe_many("a", values)
    a, b = one._row_of("a"), many._row_of("a")
    assert np.array_equal(a.window, b.window)
    assert (a.pos, a.filled, a.seen) == (b.pos, b.filled, b.seen)
    # The snapshot is rebuilt at most once a batch, from the window it then holds.
    assert many.cdf_of("a").n == 64
    assert many.version <= one.version


def test_observe_many_refuses_a_bad_value_before_writing_any() -> None:
    book = _book(64)
    before = book._row_of("a").window.copy()
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="post_queue_ms"):
            book.observe_many("a", [1.0] * 10 + [bad])
    assert np.array_equal(book._row_of("a").window, before)
    assert book.samples_seen("a") == 0
    book.observe_many("gone", [1.0] * 10)  # an unknown server: ignored, as observe does


def test_rows_of_one_model_prior_share_its_window_until_their_first_sample() -> None:
    prior = prior_of(make_distribution(ServiceSpec(kind="exponential", mean_ms=2.0)), points=256)
    book = CdfBook(window_size=256, refresh_every=16)
    for i in range(3):
        book.add_server(f"s{i}", prior)
    rows = [book._row_of(f"s{i}") for i in range(3)]
    assert rows[0].window is rows[1].window is rows[2].window  # one window, not three
    seeded = rows[0].window.copy()
    book.observe("s1", 7.0)
    book.observe_many("s2", [7.0] * 20)
    assert rows[0].window is not rows[1].window and rows[1].window is not rows[2].window
    assert np.array_equal(rows[0].window, seeded)  # the others' samples did not leak into it
    assert rows[1].window[rows[1].pos - 1] == 7.0 and book.samples_seen("s0") == 0
