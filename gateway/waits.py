"""Queue-wait estimates at one server link, from what the gateway knows (QLM §6).

`admission.waiting.estimate_wait` turns "n tasks queued ahead, b of c slots busy, service
moments" into a Normal wait (QLM eqs. (2)-(3)); this module finds n and b for a link:

- *central* queueing: the gateway holds the server's policy queue (`gateway.central`), so
  b is the tasks handed to the server and not yet back, and n is exactly the queued tasks
  the queue would pop before the new one (`TaskQueue.ahead_of`).
- *server* queueing: the gateway sees only the tasks outstanding on the link, not which of
  them the server has started. It assumes the server runs the earliest-keyed ones, so
  b = min(outstanding, slots) and n = max(0, #{outstanding with key <= the new key} - b).
  The order is the one the server reports in its heartbeat (the pool's `policy` until it
  does), with the keys of `taskserver.queues`.

The service moments are the server's post-queuing times in the CDF book (`CdfBook.moments`).
These run per target per query only when admission needs them or `[gateway]
wait_estimates` asks for them, so each is O(1) or one pass over the link's outstanding tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

from admission.waiting import NO_WAIT, ServiceMoments, WaitEstimate, estimate_wait
from taskserver.queues import QueuePolicy

if TYPE_CHECKING:
    from gateway.links import TaskLink

__all__ = [
    "KeyedTask",
    "NewTask",
    "backlog_wait",
    "count_not_after",
    "largest_mean_ms",
    "link_wait",
    "server_backlog",
]


class KeyedTask(Protocol):
    """What the queue policies order a task by (a `PendingTask` is one)."""

    @property
    def deadline_s(self) -> float: ...
    @property
    def slo_deadline_s(self) -> float: ...
    @property
    def priority(self) -> int: ...


@dataclass(frozen=True, slots=True)
class NewTask:
    """The keys of a query's tasks before they exist (one for all of its targets)."""

    deadline_s: float
    slo_deadline_s: float
    priority: int
    budget_ms: float = 0.0
    """Its task budget T_b (the TF-EDFQ key's offset from its arrival)."""
    slo_ms: float = 0.0
    """Its SLO (the T-EDFQ key's offset)."""
    flow: str = ""
    """Its allocation flow (tenant or class), for a central queue shared by flows."""
    cost: float = 1.0
    """Each of its tasks' cost units in the allocation layer."""


_FIRST_KEY: dict[QueuePolicy, Callable[[KeyedTask], float]] = {
    QueuePolicy.TF_EDFQ: attrgetter("deadline_s"),  # TailGuard: t_D = t0 + x_p^SLO - x_p^u
    QueuePolicy.T_EDFQ: attrgetter("slo_deadline_s"),  # t0 + x_p^SLO
    QueuePolicy.PRIQ: attrgetter("priority"),
}


def count_not_after(policy: QueuePolicy, tasks: Collection[KeyedTask], new: KeyedTask) -> int:
    """How many of `tasks` a policy queue would serve before `new`, a task arriving now.

    Every queue key of `taskserver.queues` is (x, arrival) or (arrival,): the tasks already
    outstanding arrived before `new`, so a tie on x goes to them, and under FIFO all of
    them are ahead.
    """
    if policy is QueuePolicy.FIFO:
        return len(tasks)
    first = _FIRST_KEY[policy]
    bound = first(new)
    return sum(1 for t in tasks if first(t) <= bound)


def server_backlog(
    policy: QueuePolicy, tasks: Collection[KeyedTask], slots: int, new: KeyedTask
) -> tuple[int, int]:
    """(busy, queued ahead of `new`) on a server from its outstanding tasks alone.

    The gateway cannot see which tasks are in service: it assumes the earliest-keyed ones,
    so busy = min(outstanding, slots) and ahead = max(0, #{key <= new key} - busy).
    """
    n = len(tasks)
    if n <= slots:
        return n, 0  # nothing is queued: no order to look at
    return slots, max(count_not_after(policy, tasks, new) - slots, 0)


def _estimate(
    ahead: int, busy: int, slots: int, moments: Callable[[], ServiceMoments]
) -> WaitEstimate:
    """`estimate_wait` for one server, whose tasks ahead share its own service law."""
    if ahead == 0 and busy < slots:
        return NO_WAIT  # a slot is free: it starts at once (the moments are not read)
    m = moments()
    return estimate_wait([(ahead, m)], busy, slots, m)


def link_wait(
    link: TaskLink, new: NewTask, now: float, moments: Callable[[], ServiceMoments]
) -> WaitEstimate:
    """The queue wait of `new` were it dispatched on the link now (QLM eqs. (2)-(3))."""
    central = link.queue
    if central is not None:
        ahead = central.count_ahead(
            new.deadline_s,
            new.slo_deadline_s,
            new.priority,
            now,
            new.flow,
            new.cost,
        )
        return _estimate(ahead, central.inflight, central.slots, moments)
    busy, ahead = server_backlog(link.policy, link.outstanding.values(), link.slots, new)
    return _estimate(ahead, busy, link.slots, moments)


def backlog_wait(link: TaskLink, moments: Callable[[], ServiceMoments]) -> WaitEstimate:
    """The queue wait of a task joining at the back of the link's queue now (all ahead)."""
    central = link.queue
    if central is not None:
        return _estimate(len(central), central.inflight, central.slots, moments)
    n = len(link.outstanding)
    busy = min(n, link.slots)
    return _estimate(n - busy, busy, link.slots, moments)


def largest_mean_ms(waits: Iterable[WaitEstimate]) -> float:
    """The largest mean wait among a query's targets (its busiest target's)."""
    return max((w.mean_ms for w in waits), default=0.0)
