"""The gateway's query path (`GatewayService.run_query`) with fake links and a fake clock.

The links are `TaskLink` fakes built by the service's `link_factory`: they record what is
dispatched and cancelled, and the test plays the servers' part by calling back the
service as a real link does (`on_result` with a `TaskReport`, `on_failure`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from admission import AdmissionConfig, Rule
from gateway.config import ClassConfig, GatewayConfig, PoolConfig
from gateway.errors import Unavailable
from gateway.links import LinkDown, TaskReport
from gateway.queries import PendingTask, QueryOutcome
from gateway.requests import QueryRequest, RegisterRequest, Targets
from gateway.service import GatewayService
from taskserver.queues import QueuePolicy
from taskserver.wire import TaskStatus


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeLink:
    """A TaskLink that sends nothing anywhere."""

    def __init__(self, server_id: str, host: str, port: int, **kw: Any) -> None:
        self.server_id = server_id
        self.host, self.port = host, port
        self.pool: str = kw["pool"]
        self.cluster: str | None = kw.get("cluster")
        self.slots: int = kw.get("slots", 1)
        self.central: bool = kw.get("central", False)
        self.on_result = kw["on_result"]
        self.on_failure = kw["on_failure"]
        self.on_dequeue = kw.get("on_dequeue")
        self.registered_s = 0.0
        self.draining = False
        self.server_draining = False
        self.owner: str | None = None
        self.last_error = ""
        self.outstanding: dict[str, PendingTask] = {}
        self.queue = None
        self.policy: QueuePolicy = kw.get("policy", QueuePolicy.TF_EDFQ)
        self.tasks_sent = 0
        self.results = 0
        self.executor: str | None = None
        self.up = True
        self.sent: list[PendingTask] = []
        self.cancelled: list[str] = []

    address = property(lambda self: f"{self.host}:{self.port}")
    is_up = property(lambda self: self.up)
    display_state = property(lambda self: "up" if self.up else "down")
    owned_elsewhere = property(lambda self: None)
    one_way_ms = property(lambda self: 0.0)
    rtt_ms = property(lambda self: None)
    silent_s = property(lambda self: 0.0)

    def start(self) -> None:
        pass

    async def wait_up(self, timeout_s: float) -> bool:
        return self.up

    async def wait_idle(self, timeout_s: float) -> bool:
        return True

    async def close(self, reason: str = "") -> None:
        self.up = False

    def dispatch(self, p: PendingTask) -> None:
        if not self.up:
            raise LinkDown(f"server {self.server_id} is down")
        self.outstanding[p.run.query_id] = p
        self.sent.append(p)
        self.tasks_sent += 1

    def cancel_query(self, query_id: str) -> None:
        if self.outstanding.pop(query_id, None) is not None:
            self.cancelled.append(query_id)

    # -- the server's part ------------------------------------------------------------------

    def answer(
        self, clock: FakeClock, status: TaskStatus = TaskStatus.OK, *, service_ms: float = 5.0,
        missed: bool = False, error: str | None = None,
    ) -> None:  # fmt: skip
        """The result of the one outstanding task, as the wire would bring it."""
        (qid, p), = self.outstanding.items()  # fmt: skip
        del self.outstanding[qid]
        report = TaskReport(status, 1.0, service_ms, service_ms + 1.0, missed, b"{}", error)
        self.on_result(self, p, report, clock())


def _config(**kw: Any) -> GatewayConfig:
    return GatewayConfig(
        classes=(ClassConfig("A", 100.0, 99.0, 0), ClassConfig("B", 300.0, 99.0, 1)),
        pools=(PoolConfig("default"),),
        grace_ms=50.0,
        storage_url="",
        **kw,
    )


async def _service(n: int, **kw: Any) -> tuple[GatewayService, FakeClock, list[FakeLink]]:
    clock = FakeClock()
    links: list[FakeLink] = []

    def factory(*args: Any, **kwargs: Any) -> FakeLink:
        links.append(FakeLink(*args, **kwargs))
        return links[-1]

    svc = GatewayService(_config(**kw), clock=clock, link_factory=factory)
    for i in range(n):
        await svc.register(RegisterRequest(f"s{i}", "default", f"127.0.0.1:{9000 + i}", 1))
    return svc, clock, links


def _query(fanout: int, cls: str = "B", slo_ms: float = 300.0) -> QueryRequest:
    return QueryRequest(cls, 99.0, slo_ms, 1, Targets(pool="default", fanout=fanout), b"{}")


async def _started(svc: GatewayService, req: QueryRequest) -> asyncio.Task[Any]:
    task = asyncio.create_task(svc.run_query(req))
    for _ in range(5):
        await asyncio.sleep(0)
    return task


async def test_every_task_ok_within_the_slo_meets_it_and_teaches_the_cdfs() -> None:
    svc, clock, links = await _service(3)
    task = await _started(svc, _query(3))
    sent = [p for lk in links for p in lk.sent]
    assert len(sent) == 3
    (p,) = links[0].sent
    # TailGuard eq. (4): every task of the query carries t_D = t0 + T_b.
    assert {q.deadline_s for q in sent} == {p.deadline_s}
    clock.now += 0.040
    samples_before = svc.book.samples_seen("s0")
    for lk in links:
        lk.answer(clock)
    answer = await task
    assert answer.outcome is QueryOutcome.MET
    assert answer.summary["fanout"] == 3
    assert answer.summary["latency_ms"] == pytest.approx(40.0)
    assert p.deadline_s == pytest.approx(100.0 + answer.summary["budget_ms"] / 1000.0)
    assert [t["status"] for t in answer.body["tasks"]] == ["ok"] * 3
    assert svc.book.samples_seen("s0") == samples_before + 1


async def test_late_answers_miss_the_slo_but_still_answer_200_worth() -> None:
    svc, clock, links = await _service(2)
    task = await _started(svc, _query(2, slo_ms=300.0))
    clock.now += 0.350
    for lk in links:
        lk.answer(clock)
    answer = await task
    assert answer.outcome is QueryOutcome.MISSED_SLO
    assert answer.summary["met_slo"] is False


async def test_a_failed_task_fails_the_query_and_cancels_its_siblings() -> None:
    svc, clock, links = await _service(3)
    task = await _started(svc, _query(3))
    links[1].answer(clock, TaskStatus.FAILED, error="boom")
    answer = await task
    assert answer.outcome is QueryOutcome.FAILED
    assert answer.summary["error"]["code"] == "task_failed"
    assert "boom" in answer.summary["error"]["message"]
    qid = answer.summary["query_id"]
    assert links[0].cancelled == [qid] and links[2].cancelled == [qid]
    statuses = sorted(t["status"] for t in answer.body["tasks"])
    assert statuses == ["cancelled", "cancelled", "failed"]


async def test_a_dropped_task_is_a_retryable_drop() -> None:
    svc, clock, links = await _service(2)
    task = await _started(svc, _query(2))
    links[0].answer(clock, TaskStatus.DROPPED, error="budget spent at detect")
    answer = await task
    assert answer.outcome is QueryOutcome.DROPPED and answer.outcome.may_retry
    assert answer.summary["cancelled_siblings"] == 1


async def test_all_rejections_are_retryable_and_a_missing_result_times_out() -> None:
    svc, clock, links = await _service(1)
    task = await _started(svc, _query(1))
    links[0].answer(clock, TaskStatus.REJECTED, error="queue full")
    assert (await task).outcome is QueryOutcome.REJECTED
    # No result at all: the query ends at SLO + grace (real timers: a 20 ms SLO).
    task = await _started(svc, _query(1, slo_ms=20.0))
    answer = await asyncio.wait_for(task, 2.0)
    assert answer.outcome is QueryOutcome.TIMEOUT
    assert answer.body["tasks"][0]["status"] == "timeout"
    assert links[0].cancelled


async def test_a_server_down_before_dispatch_is_a_503_naming_it() -> None:
    svc, _, links = await _service(2)
    links[1].up = False
    with pytest.raises(Unavailable) as err:
        await svc.run_query(_query(2))
    assert err.value.code == "servers_down" and err.value.extra["servers_down"] == ["s1"]
    assert links[0].sent == []  # nothing half-done: no task went out


async def test_admission_turns_the_query_away_before_any_task_goes_out() -> None:
    admission = AdmissionConfig(rule=Rule.REJECT_ALL, threshold=0.01, window_tasks=100)
    svc, _, links = await _service(2, admission=admission)
    svc.gate.record_tasks(50, 100, "B")  # a miss ratio of 50%
    with pytest.raises(Unavailable) as err:
        await svc.run_query(_query(2))
    assert err.value.code == "admission_rejected"
    assert err.value.extra["miss_ratio"] == pytest.approx(0.5)
    assert all(lk.sent == [] for lk in links)


async def test_task_misses_reported_by_servers_feed_the_admission_window() -> None:
    svc, clock, links = await _service(2)
    task = await _started(svc, _query(2))
    links[0].answer(clock, missed=True)
    links[1].answer(clock, missed=False)
    await task
    window = svc.gate.window
    assert window.ratio(clock(), "B") == pytest.approx(0.5)
    assert not math.isnan(window.ratio(clock()))


# -- queue-wait estimates and predictive admission (QLM §6) -----------------------------------


def _answer_all(link: FakeLink, clock: FakeClock, queue_ms: float = 1.0) -> None:
    """Every outstanding task's result, each having waited queue_ms on the server."""
    for qid, p in list(link.outstanding.items()):
        del link.outstanding[qid]
        report = TaskReport(TaskStatus.OK, queue_ms, 5.0, 6.0, False, b"{}", None)
        link.on_result(link, p, report, clock())


async def test_predictive_admission_rejects_a_query_predicted_to_miss_before_dispatch() -> None:
    svc, clock, links = await _service(1, admission=AdmissionConfig(rule=Rule.PREDICTIVE))
    assert svc.gate.needs_wait
    # Idle: admitted, and its task carries its estimate (a free slot: no wait).
    started = [await _started(svc, _query(1, slo_ms=1000.0))]
    assert links[0].sent[0].est_wait_ms == 0.0
    # Nineteen more queue up behind it on the one slot (a 1 s SLO leaves room for them).
    for _ in range(19):
        started.append(await _started(svc, _query(1, slo_ms=1000.0)))
    assert len(links[0].sent) == 20
    # A 20 ms query due after all of them (TF-EDFQ: its t_D is later): the prior's service
    # is ~2.3 ms a task, so twenty ahead of it cannot make it.
    clock.now += 0.995
    with pytest.raises(Unavailable) as err:
        await svc.run_query(_query(1, slo_ms=20.0))
    extra = err.value.extra
    assert err.value.code == "admission_rejected" and extra["reason"] == "predicted_miss"
    assert extra["estimated_wait_ms"] > 30.0
    assert extra["meet_probability"] < extra["level"] == 0.99
    # Retry once the backlog is down to its queueing budget (SLO - x_p^u).
    budget_ms = 20.0 - svc.plan(_query(1, slo_ms=20.0), links).unloaded_ms
    assert extra["retry_after_s"] == pytest.approx(
        (extra["estimated_wait_ms"] - budget_ms) / 1000.0, abs=1e-3
    )
    assert extra["class"] == "B"
    assert "P(latency <= 20 ms)" in err.value.message
    assert len(links[0].sent) == 20  # nothing went out for it
    reject = {"class": "B", "reason": "predicted_miss"}
    assert svc.registry.get_sample_value("tailgate_admission_rejections_total", reject) == 1.0
    _answer_all(links[0], clock)
    for task in started:
        assert (await task).outcome is QueryOutcome.MET


async def test_wait_estimates_are_kept_per_task_and_their_error_is_measured() -> None:
    svc, clock, links = await _service(1, wait_estimates=True)
    assert not svc.gate.needs_wait
    first = await _started(svc, _query(1))
    second = await _started(svc, _query(1))  # behind the first, on the one slot
    est = [p.est_wait_ms for p in links[0].sent]
    assert est[0] == 0.0
    moments = svc.book.moments("s0")
    assert est[1] == pytest.approx(moments.residual_mean_ms)  # the task in service's residual
    _answer_all(links[0], clock, queue_ms=1.0)
    answers = [await first, await second]
    # Each task's answer carries its estimate beside the actual queue_ms.
    assert [a.body["tasks"][0]["estimated_wait_ms"] for a in answers] == [
        0.0,
        pytest.approx(est[1], abs=1e-4),
    ]
    value = svc.registry.get_sample_value
    pool = {"pool": "default"}
    errors = {"pool": "default", "le": "+Inf"}
    assert value("tailgate_wait_estimate_error_seconds_bucket", errors) == 2.0
    # Errors of both signs: the sums are two counters (a histogram _sum must not fall).
    assert value("tailgate_wait_estimated_seconds_total", pool) == pytest.approx(est[1] / 1000.0)
    assert value("tailgate_wait_actual_seconds_total", pool) == pytest.approx(2.0 / 1000.0)
    below = {"pool": "default", "le": "0.0"}
    assert value("tailgate_wait_estimate_error_seconds_bucket", below) == 1.0  # est[1] > 1 ms


async def test_by_default_no_task_carries_a_wait_estimate() -> None:
    svc, clock, links = await _service(1)
    task = await _started(svc, _query(1))
    assert links[0].sent[0].est_wait_ms is None
    _answer_all(links[0], clock)
    await task
    count = svc.registry.get_sample_value(
        "tailgate_wait_estimate_error_seconds_bucket", {"pool": "default", "le": "+Inf"}
    )
    assert count is None


async def test_a_wait_estimate_adds_the_tighter_groups_that_will_overtake() -> None:
    svc, clock, links = await _service(1, wait_estimates=True)
    started = []
    # Class A (SLO 100 ms) arrives at 200 queries/s for a second: its tasks, with the
    # tighter TF-EDFQ budget, go ahead of a class-B task (SLO 300 ms) that waits.
    for _ in range(200):
        started.append(await _started(svc, _query(1, cls="A", slo_ms=100.0)))
        _answer_all(links[0], clock)
        clock.now += 0.005
    started.append(await _started(svc, _query(1, cls="A", slo_ms=100.0)))  # one in service
    await _started(svc, _query(1, cls="B", slo_ms=300.0))
    b_task = links[0].sent[-1]
    m = svc.book.moments("s0")
    base = m.residual_mean_ms  # QLM's estimate: the one in service, nothing queued ahead
    assert b_task.class_name == "B" and b_task.est_wait_ms is not None
    # W = W0 / (1 - rho_A) with rho_A = 200/s x the mean service (the window, 200 ms of
    # budget difference, stays open at these waits).
    rho = 0.2 * m.mean_ms
    assert b_task.est_wait_ms == pytest.approx(base / (1.0 - rho), rel=0.05)
    assert b_task.est_wait_ms > base
    # A class-A task goes ahead of the waiting B task and is overtaken by nothing: its
    # estimate is QLM's, the residual of the one in service.
    await _started(svc, _query(1, cls="A", slo_ms=100.0))
    assert links[0].sent[-1].est_wait_ms == pytest.approx(base, rel=1e-9)
    _answer_all(links[0], clock)
    for t in started:
        await t


async def test_request_groups_count_arrivals_cost_and_outstanding_tasks() -> None:
    svc, clock, links = await _service(3)
    started = [await _started(svc, _query(1)), await _started(svc, _query(3))]
    started.append(await _started(svc, _query(3)))
    groups = {(g["class"], g["queries"]): g for g in svc.groups_view()}
    # Two cost buckets of class B in pool default: one fanout-1 query, two fanout-3 ones.
    assert set(groups) == {("B", 1), ("B", 2)}
    wide = groups[("B", 2)]
    assert wide["pool"] == "default" and wide["tasks_outstanding"] == 6
    lo, hi = wide["cost_bucket"]
    assert lo <= wide["mean_cost_ms"] < hi and wide["arrival_rate"] > 0
    for link in links:
        _answer_all(link, clock)
    for t in started:
        await t
    after = {(g["class"], g["queries"]): g for g in svc.groups_view()}
    assert after[("B", 2)]["tasks_outstanding"] == 0
    assert after[("B", 2)]["mean_service_ms"] == pytest.approx(5.0)  # the fake reports 5 ms
    assert after[("B", 2)]["estimated_drain_ms"] == 0.0
