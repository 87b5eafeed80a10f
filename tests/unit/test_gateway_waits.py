"""Queue-wait estimates at a gateway link (gateway.waits): who is ahead, who is busy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from admission import Action, Decision, QueryInfo, ServiceMoments, estimate_wait
from admission.waiting import NO_WAIT
from gateway.app import retry_after_s
from gateway.central import CentralQueue
from gateway.errors import Unavailable
from gateway.links import ServerLink
from gateway.overload import admit
from gateway.waits import (
    NewTask,
    backlog_wait,
    count_not_after,
    link_wait,
    server_backlog,
)
from taskserver.queues import QueuedTask, QueuePolicy, TaskQueue

MOMENTS = ServiceMoments.exponential(10.0)


@dataclass
class Task:
    """What the estimator reads of an outstanding task."""

    deadline_s: float
    slo_deadline_s: float
    priority: int
    sent_s: float = 0.0


@dataclass
class Link:
    """What the estimator reads of a link."""

    slots: int = 1
    policy: QueuePolicy = QueuePolicy.TF_EDFQ
    outstanding: dict[str, Any] = field(default_factory=dict)
    queue: CentralQueue | None = None


def _tasks(n: int, seed: int = 1) -> list[Task]:
    rng = random.Random(seed)
    # Coarse values so that ties on every key occur.
    return [
        Task(rng.randint(0, 9) / 10, rng.randint(0, 9) / 10, rng.randint(0, 3), sent_s=i * 0.001)
        for i in range(n)
    ]


def _moments() -> ServiceMoments:
    return MOMENTS


def _unread() -> ServiceMoments:
    raise AssertionError("the moments are read only when the task would wait")


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_the_count_ahead_is_the_queue_disciplines_own(policy: QueuePolicy) -> None:
    tasks = _tasks(200)
    q = TaskQueue(policy)
    for t in tasks:
        q.push(QueuedTask("q", 0, t.deadline_s, t.slo_deadline_s, t.priority, t.sent_s))
    now = 1.0  # after every outstanding task arrived
    for new in (NewTask(0.45, 0.3, 2), NewTask(0.0, 0.9, 0), NewTask(0.9, 0.0, 3)):
        probe = QueuedTask("new", 0, new.deadline_s, new.slo_deadline_s, new.priority, now)
        assert count_not_after(policy, tasks, new) == len(q.ahead_of(probe))


def test_fifo_puts_every_outstanding_task_ahead_and_edf_only_the_earlier_deadlines() -> None:
    tasks = [Task(d, 9.0, 0) for d in (0.1, 0.2, 0.3, 0.3, 0.5)]
    assert count_not_after(QueuePolicy.FIFO, tasks, NewTask(0.0, 0.0, 0)) == 5
    # A tie on t_D goes to the task that arrived first: the outstanding one.
    assert count_not_after(QueuePolicy.TF_EDFQ, tasks, NewTask(0.3, 0.0, 0)) == 4
    assert count_not_after(QueuePolicy.T_EDFQ, tasks, NewTask(0.0, 8.0, 0)) == 0
    assert count_not_after(QueuePolicy.PRIQ, tasks, NewTask(9.0, 9.0, 0)) == 5


def test_the_earliest_keyed_tasks_are_taken_to_be_in_service() -> None:
    tasks = [Task(d, 9.0, 0) for d in (0.1, 0.2, 0.3, 0.4, 0.5)]
    tf = QueuePolicy.TF_EDFQ
    # No more tasks than slots: all in service, nothing queued, no order looked at.
    assert server_backlog(tf, tasks[:2], 2, NewTask(0.0, 0.0, 0)) == (2, 0)
    # Five outstanding on two slots: two busy; of the three queued, those due first are ahead.
    assert server_backlog(tf, tasks, 2, NewTask(0.35, 0.0, 0)) == (2, 1)
    assert server_backlog(tf, tasks, 2, NewTask(0.9, 0.0, 0)) == (2, 3)
    # Due before everything: only the busy slots stand in its way.
    assert server_backlog(tf, tasks, 2, NewTask(0.0, 0.0, 0)) == (2, 0)


def test_a_server_link_wait_is_the_estimator_on_its_backlog() -> None:
    link = Link(slots=2, outstanding={f"q{i}": Task(0.1 * i, 9.0, 0) for i in range(6)})
    new = NewTask(0.35, 9.0, 0)
    # Keys <= 0.35: 0.0 .. 0.3 (four), two of them in service: two queued ahead.
    expected = estimate_wait([(2, MOMENTS)], 2, 2, MOMENTS)
    assert link_wait(link, new, 1.0, _moments) == expected
    assert expected.ahead == 2 and expected.mean_ms == pytest.approx((2 * 10.0 + 10.0) / 2)
    # A free slot: it starts at once, and the moments are not even read.
    idle = Link(slots=2, outstanding={"q0": Task(0.0, 9.0, 0)})
    assert link_wait(idle, new, 1.0, _unread) is NO_WAIT


def test_a_central_link_counts_its_own_queue_exactly() -> None:
    central = CentralQueue(QueuePolicy.TF_EDFQ, slots=1)
    link = Link(slots=1, queue=central)
    new = NewTask(0.5, 9.0, 0)
    assert link_wait(link, new, 0.0, _unread) is NO_WAIT
    central.inflight = 1  # the one slot is busy
    for i, d in enumerate((0.2, 0.4, 0.6, 0.8)):
        central.queue.push(QueuedTask(f"q{i}", 0, d, 9.0, 0, 0.0))
    est = link_wait(link, new, 1.0, _moments)
    assert est == estimate_wait([(2, MOMENTS)], 1, 1, MOMENTS)
    # Joining at the back: all four queued tasks ahead.
    back = backlog_wait(link, _moments)
    assert back == estimate_wait([(4, MOMENTS)], 1, 1, MOMENTS)


def test_the_backlog_wait_puts_every_outstanding_task_ahead() -> None:
    link = Link(slots=2, outstanding={f"q{i}": Task(0.0, 0.0, 0) for i in range(5)})
    back = backlog_wait(link, _moments)
    # Three queued behind two busy slots, plus a residual (exponential: a whole mean), over 2.
    assert back.ahead == 3
    assert back.mean_ms == pytest.approx((3 * 10.0 + 10.0) / 2)
    assert backlog_wait(Link(slots=2), _unread) is NO_WAIT


def test_retry_after_comes_from_the_estimate_in_whole_seconds() -> None:
    def rejected(retry_s: float) -> Unavailable:
        return Unavailable("predicted miss", extra={"retry_after_s": retry_s})

    assert retry_after_s(rejected(2.01), 1) == 3
    assert retry_after_s(rejected(0.0), 5) == 1  # never "retry at once"
    assert retry_after_s(Unavailable("servers down"), 5) == 5
    assert retry_after_s(None, 5) == 5


async def test_a_server_link_learns_the_order_its_server_reports() -> None:
    def link(central: bool) -> ServerLink:
        return ServerLink(
            "ts-1", "127.0.0.1", 9, pool="default", central=central,
            policy=QueuePolicy.TF_EDFQ, on_result=print, on_failure=print,
        )  # fmt: skip

    status = SimpleNamespace(policy="fifo", draining=False, owner=None)
    server = link(central=False)
    server._on_status(status)
    assert server.policy is QueuePolicy.FIFO
    server._on_status(SimpleNamespace(policy="no-such-order", draining=False, owner=None))
    assert server.policy is QueuePolicy.FIFO  # an unknown name changes nothing
    # With central queueing the order is the gateway's own queue's, whatever the server runs.
    central = link(central=True)
    central._on_status(status)
    assert central.policy is QueuePolicy.TF_EDFQ


async def test_admit_estimates_the_waits_again_after_each_deferral() -> None:
    decisions = iter([Decision(Action.DEFER, "held", 0.0, 0.02), Decision(Action.ADMIT, "ok")])
    asked: list[QueryInfo] = []

    class Gate:
        controller = SimpleNamespace(overloaded=False, overloaded_since=None)

        def decide(self, q: QueryInfo, queue_pressure: Any) -> Decision:
            asked.append(q)
            return next(decisions)

    async def no_sleep(_: float) -> None:
        return None

    def rewait(q: QueryInfo) -> QueryInfo:
        return replace(q, meet_prob=0.5, wait_ms=7.0)

    q = QueryInfo("A", 0, 1, 100.0, 10.0)
    gate: Any = Gate()
    reason, waited_s = await admit(gate, q, lambda: 0.0, sleep=no_sleep, rewait=rewait)
    assert (reason, waited_s) == ("ok", 0.02)
    seen = [(a.waited_s, a.meet_prob, a.wait_ms) for a in asked]
    assert seen == [(0.0, 1.0, 0.0), (0.02, 0.5, 7.0)]
