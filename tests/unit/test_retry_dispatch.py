"""Swayam's random dispatch with retries (§4.5): the settings, the decision, the pick of
another server, and the query path re-dispatching a task a busy server sent back.

The query path runs with the fake links of tests/unit/test_query_path.py and a fake clock;
the test plays the servers' part. Δ is 0 in the query-path tests, so a retry goes out on the
event loop's next turn.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from deploy.cli import build_parser
from gateway.config import ClassConfig, GatewayConfig, PoolConfig
from gateway.links import ServerLink
from gateway.queries import PendingTask, QueryOutcome, QueryRun
from gateway.requests import QueryRequest, RegisterRequest, Targets
from gateway.service import GatewayService
from gateway.targets import BusyRetry, TargetPicker
from taskserver.config import BUSY_PREFIX, TaskServerConfig
from taskserver.queues import create_task_queue
from taskserver.server import TaskService
from taskserver.tomlconfig import ConfigError, build
from taskserver.wire import TaskStatus
from tests.unit.test_query_path import FakeClock, FakeLink
from tests.unit.test_taskserver_drain import _Clock, _HeldExecutor, _settle, _task
from tests.unit.test_taskserver_drain import _Conn as _GatewayEnd

BUSY = f"{BUSY_PREFIX} all 1 slot(s) of server s0 are in use"

# -- settings ---------------------------------------------------------------------------------


def test_a_pool_queues_by_default_and_retries_only_when_asked() -> None:
    pool = PoolConfig()
    assert (pool.dispatch, pool.retry_delay_ms) == ("queue", 1.0)
    assert BusyRetry.of(pool) is None
    retry = BusyRetry.of(PoolConfig(dispatch="retry", retry_delay_ms=2.5))
    assert retry is not None and retry.delay_s == pytest.approx(0.0025)


@pytest.mark.parametrize(
    ("table", "key", "message"),
    [
        ({"dispatch": "random"}, "pools[0].dispatch", "must be 'queue' or 'retry', got 'random'"),
        (
            {"dispatch": "retry", "queueing": "central"},
            "pools[0].dispatch",
            "got queueing 'central'",
        ),
        ({"retry_delay_ms": -1}, "pools[0].retry_delay_ms", "must be in 0..60000, got -1"),
        ({"retry_delay_ms": 1e9}, "pools[0].retry_delay_ms", "got 1000000000.0"),
        ({"retry_delay_ms": "1"}, "pools[0].retry_delay_ms", "expected a number"),
    ],
)
def test_bad_retry_settings_name_the_key_and_the_value(
    table: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        build(PoolConfig, table, "pools[0]")
    assert err.value.key == key
    assert message in err.value.message


def test_a_task_server_rejects_when_busy_only_when_told() -> None:
    assert TaskServerConfig().reject_when_busy is False
    assert build(TaskServerConfig, {"reject_when_busy": True}).reject_when_busy is True
    parser = build_parser()
    assert parser.parse_args(["taskserver"]).reject_when_busy is None  # [taskserver] decides
    assert parser.parse_args(["taskserver", "--reject-when-busy"]).reject_when_busy is True


async def test_a_busy_task_server_sends_a_task_back_at_once_instead_of_queueing_it() -> None:
    ex = _HeldExecutor()
    svc = TaskService(
        "ts", create_task_queue("fifo"), ex, slots=2, clock=_Clock(), reject_when_busy=True
    )
    conn = _GatewayEnd()
    for q in ("q1", "q2", "q3"):
        svc.submit(conn, _task(q))  # type: ignore[arg-type]
    await _settle()
    assert (svc.busy, len(svc.queue)) == (2, 0)
    (refusal,) = conn.results
    assert (refusal.query_id, refusal.status) == ("q3", TaskStatus.REJECTED)
    assert refusal.error.startswith(BUSY_PREFIX) and "2 slot(s)" in refusal.error
    assert refusal.service_ms == 0.0
    ex.release_one()  # a slot frees: the next task is taken
    await _settle()
    svc.submit(conn, _task("q4"))  # type: ignore[arg-type]
    await _settle()
    assert svc.busy == 2 and [r.query_id for r in conn.results] == ["q3", "q1"]
    await svc.close()


# -- the decision -----------------------------------------------------------------------------


def test_a_busy_refusal_is_retried_delta_later_while_that_is_before_the_slo() -> None:
    retry = BusyRetry(retry_delay_ms=2.0)
    decision = retry.decide(BUSY, now=10.0, slo_deadline_s=10.1)
    assert (decision.action, decision.at_s) == ("retry", 10.002)
    # A retry that would land at or past the SLO is not made: the SLO decides the query.
    assert retry.decide(BUSY, now=10.098, slo_deadline_s=10.1).action == "hold"
    assert retry.decide(BUSY, now=10.2, slo_deadline_s=10.1).action == "hold"
    assert BusyRetry(0.0).decide(BUSY, now=10.0, slo_deadline_s=10.1).at_s == 10.0


@pytest.mark.parametrize(
    "error", [None, "server is draining", "queue full", "bad task: priority", "busy"]
)
def test_any_other_rejection_stands(error: str | None) -> None:
    assert BusyRetry(1.0).decide(error, now=0.0, slo_deadline_s=1.0).action == "fail"


# -- the pick of another server ---------------------------------------------------------------


class _Link:
    """The few TaskLink attributes `TargetPicker.replacement` reads."""

    def __init__(self, server_id: str, cluster: str | None = None) -> None:
        self.server_id = server_id
        self.pool = "default"
        self.cluster = cluster
        self.is_up = True
        self.outstanding: dict[str, Any] = {}


def _picker(
    n: int, clusters: list[str | None] | None = None, seed: int = 1
) -> tuple[TargetPicker, list[_Link]]:
    config = GatewayConfig(pools=(PoolConfig(dispatch="retry"),), storage_url="")
    links = [_Link(f"s{i}", (clusters or [None] * n)[i]) for i in range(n)]
    picker = TargetPicker(config, {lk.server_id: lk for lk in links}, random.Random(seed))  # type: ignore[arg-type]
    for lk in links:
        picker.join(lk)  # type: ignore[arg-type]
    return picker, links


def _again(picker: TargetPicker, t: Targets, refused: _Link, **kw: Any) -> set[str]:
    """Every server the pick may return (over many draws)."""
    out = set()
    for _ in range(200):
        lk = picker.replacement(t, refused, "q-1", **kw)  # type: ignore[arg-type]
        out.add(None if lk is None else lk.server_id)
    return out


def test_the_replacement_is_another_live_server_that_holds_no_task_of_the_query() -> None:
    picker, links = _picker(5)
    fanout = Targets(pool="default", fanout=1)
    links[1].outstanding["q-1"] = object()  # holds another task of the query
    links[2].is_up = False
    assert _again(picker, fanout, links[0]) == {"s3", "s4"}
    # Servers the query used before are taken only when no fresh one is left.
    assert _again(picker, fanout, links[0], used={"s3"}) == {"s4"}
    assert _again(picker, fanout, links[0], used={"s3", "s4"}) == {"s3", "s4"}
    links[3].is_up = links[4].is_up = False
    assert _again(picker, fanout, links[0]) == {None}


def test_a_prefix_routed_pool_retries_inside_its_prefix_first() -> None:
    picker, links = _picker(4)
    picker.prefix["default"] = lambda: 2  # Swayam: s0, s1 in use
    fanout = Targets(pool="default", fanout=1)
    assert _again(picker, fanout, links[0]) == {"s1"}
    links[1].outstanding["q-1"] = object()
    assert _again(picker, fanout, links[0]) == {"s2", "s3"}  # none left inside: the rest


def test_no_replacement_where_the_client_chose_the_servers() -> None:
    picker, links = _picker(3)
    assert _again(picker, Targets(servers=("s0",)), links[0]) == {None}
    assert _again(picker, Targets(pool="default", all=True), links[0]) == {None}


def test_a_cluster_bound_query_is_retried_in_its_cluster() -> None:
    picker, links = _picker(4, ["a", "a", "b", "b"])
    assert _again(picker, Targets(pool="default", fanout=1, cluster="b"), links[2]) == {"s3"}
    assert _again(picker, Targets(pool="default", per_cluster=1), links[0]) == {"s1"}
    outside = Targets(pool="default", fanout=1, exclude_cluster="a")
    assert _again(picker, outside, links[2]) == {"s3"}


# -- the budgets a retried task carries -------------------------------------------------------


class _Conn:
    closed = False

    def __init__(self) -> None:
        self.items: list[Any] = []

    def send_item(self, item: Any) -> None:
        self.items.append(item)


async def test_a_task_sent_again_carries_what_is_left_of_its_budgets() -> None:
    clock = FakeClock()
    link = ServerLink(
        "s1", "127.0.0.1", 1, pool="default", on_result=print, on_failure=print, clock=clock
    )
    conn = _Conn()
    link._conn = conn  # type: ignore[assignment]
    run = QueryRun("q-1", 1, t0=100.0)
    p = PendingTask(run, 0, "s1", deadline_s=100.080, slo_deadline_s=100.100, priority=0,
                    class_name="A", payload=b"")  # fmt: skip
    link._send(p, 100.030)  # 30 ms after t0, e.g. after a refusal and Δ
    (task,) = conn.items  # the task as it goes out (gateway.hotpath.TaskItem, IDL order)
    _, _, deadline_budget_ms, slo_budget_ms, *_ = task
    assert deadline_budget_ms == pytest.approx(50.0)
    assert slo_budget_ms == pytest.approx(70.0)
    assert p.sent_s == 100.030


# -- the query path ---------------------------------------------------------------------------


async def _service(
    n: int, dispatch: str = "retry", **kw: Any
) -> tuple[GatewayService, FakeClock, list[FakeLink]]:
    clock = FakeClock()
    links: list[FakeLink] = []

    def factory(*args: Any, **kwargs: Any) -> FakeLink:
        links.append(FakeLink(*args, **kwargs))
        return links[-1]

    config = GatewayConfig(
        classes=(ClassConfig("B", 300.0, 99.0, 1),),
        pools=(PoolConfig("default", dispatch=dispatch, retry_delay_ms=0.0),),
        grace_ms=50.0,
        storage_url="",
        **kw,
    )
    svc = GatewayService(config, clock=clock, link_factory=factory, rng=random.Random(7))
    for i in range(n):
        await svc.register(RegisterRequest(f"s{i}", "default", f"127.0.0.1:{9000 + i}", 1))
    return svc, clock, links


def _query(fanout: int, slo_ms: float = 300.0) -> QueryRequest:
    return QueryRequest("B", 99.0, slo_ms, 1, Targets(pool="default", fanout=fanout), b"{}")


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _holder(links: list[FakeLink]) -> list[FakeLink]:
    return [lk for lk in links if lk.outstanding]


def _retries(svc: GatewayService) -> float | None:
    return svc.registry.get_sample_value("tailgate_task_retries_total", {"pool": "default"})


async def test_a_busy_refusal_sends_the_task_to_another_server_and_the_query_succeeds() -> None:
    svc, clock, links = await _service(3)
    task = asyncio.create_task(svc.run_query(_query(1)))
    await _turns()
    (first,) = _holder(links)
    (p,) = first.sent
    before = {lk.server_id: svc.book.samples_seen(lk.server_id) for lk in links}
    clock.now += 0.002
    first.answer(clock, TaskStatus.REJECTED, error=BUSY)
    await _turns()
    (second,) = _holder(links)
    assert second is not first
    assert second.sent == [p] and p.server_id == second.server_id and p.retries == 1
    clock.now += 0.010
    second.answer(clock, service_ms=5.0)
    answer = await task
    assert answer.outcome is QueryOutcome.MET
    (out,) = answer.body["tasks"]
    assert out["server"] == second.server_id and out["status"] == "ok" and out["retries"] == 1
    assert out["service_ms"] == 5.0  # the last try's timings
    # Only the last try feeds the CDF book and the task counts; the retry is counted apart.
    after = {lk.server_id: svc.book.samples_seen(lk.server_id) for lk in links}
    assert after[first.server_id] == before[first.server_id]
    assert after[second.server_id] == before[second.server_id] + 1
    assert svc.metrics.task_counts == {("default", "ok"): 1}
    assert _retries(svc) == 1.0
    assert svc.query._placed == {}


async def test_an_answer_without_retries_shows_none() -> None:
    svc, clock, links = await _service(2)
    task = asyncio.create_task(svc.run_query(_query(1)))
    await _turns()
    _holder(links)[0].answer(clock)
    assert "retries" not in (await task).body["tasks"][0]


async def test_in_a_queue_pool_the_busy_refusal_rejects_the_query_as_before() -> None:
    svc, clock, links = await _service(3, dispatch="queue")
    task = asyncio.create_task(svc.run_query(_query(1)))
    await _turns()
    _holder(links)[0].answer(clock, TaskStatus.REJECTED, error=BUSY)
    answer = await task
    assert answer.outcome is QueryOutcome.REJECTED
    assert answer.summary["error"]["code"] == "task_rejected"
    assert sum(len(lk.sent) for lk in links) == 1 and _retries(svc) is None


async def test_another_rejection_in_a_retry_pool_rejects_the_query_as_before() -> None:
    svc, clock, links = await _service(3)
    task = asyncio.create_task(svc.run_query(_query(1)))
    await _turns()
    _holder(links)[0].answer(clock, TaskStatus.REJECTED, error="server is draining")
    assert (await task).outcome is QueryOutcome.REJECTED
    assert sum(len(lk.sent) for lk in links) == 1


async def test_a_retry_avoids_servers_holding_the_querys_other_tasks_or_fails() -> None:
    # Three servers, fanout 2: the one free server takes the refused task.
    svc, clock, links = await _service(3)
    task = asyncio.create_task(svc.run_query(_query(2)))
    await _turns()
    a, b = _holder(links)
    (free,) = [lk for lk in links if lk not in (a, b)]
    a.answer(clock, TaskStatus.REJECTED, error=BUSY)
    await _turns()
    assert len(free.sent) == 1 and free.sent[0].index == a.sent[0].index
    free.answer(clock)
    b.answer(clock)
    answer = await task
    assert answer.outcome is QueryOutcome.MET
    assert sorted(t.get("retries", 0) for t in answer.body["tasks"]) == [0, 1]
    # Two servers, fanout 2: the other one holds the sibling, so the refusal stands.
    svc, clock, links = await _service(2)
    task = asyncio.create_task(svc.run_query(_query(2)))
    await _turns()
    links[0].answer(clock, TaskStatus.REJECTED, error=BUSY)
    answer = await task
    assert answer.outcome is QueryOutcome.REJECTED
    assert links[1].cancelled == [answer.summary["query_id"]]


async def test_a_timeout_cancels_the_task_on_the_server_that_holds_it_now() -> None:
    svc, clock, links = await _service(2, prune_late=True)
    task = asyncio.create_task(svc.run_query(_query(1, slo_ms=20.0)))  # real SLO timer
    await _turns()
    (first,) = _holder(links)
    first.answer(clock, TaskStatus.REJECTED, error=BUSY)
    await _turns()
    (second,) = _holder(links)
    answer = await asyncio.wait_for(task, 2.0)
    assert answer.outcome is QueryOutcome.TIMEOUT
    qid = answer.summary["query_id"]
    assert second.cancelled == [qid] and first.cancelled == []
    (out,) = answer.body["tasks"]
    assert (out["server"], out["status"], out["retries"]) == (second.server_id, "timeout", 1)


async def test_no_retry_once_it_would_come_past_the_slo_the_slo_ends_the_query() -> None:
    svc, clock, links = await _service(2, prune_late=True)
    task = asyncio.create_task(svc.run_query(_query(1, slo_ms=20.0)))
    await _turns()
    (first,) = _holder(links)
    clock.now += 0.025  # the refusal comes back past the SLO
    first.answer(clock, TaskStatus.REJECTED, error=BUSY)
    answer = await asyncio.wait_for(task, 2.0)
    assert answer.outcome is QueryOutcome.TIMEOUT
    assert sum(len(lk.sent) for lk in links) == 1 and _retries(svc) is None
    assert "retries" not in answer.body["tasks"][0]
