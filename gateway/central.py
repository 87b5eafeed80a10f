"""Central queueing (TailGuard Fig. 2, §III.C.2): a server's policy queue kept in the gateway.

The gateway holds each server's tasks in that server's queue discipline and hands one over
only when the server has a free slot; a task's deadline outcome is decided here, at the
dequeue. `CentralQueue` is that pump, on its own: the link (`gateway.links.ServerLink`)
pushes tasks, sends what `ready` yields, and tells it when a slot frees (`done`). Given an
allocation arbiter (``[allocation]``), the queue is shared between flows (tenants or classes)
by it (gateway.allocation): the arbiter picks the flow, the policy the task within it.
"""

from __future__ import annotations

from collections.abc import Iterator

from admission.allocation import DrrArbiter, FairArbiter
from gateway.allocation import AllocatedQueue
from gateway.queries import PendingTask
from taskserver.queues import QueuedTask, QueuePolicy, create_task_queue

__all__ = ["CentralQueue"]


class CentralQueue:
    """One server's policy queue and its slots, as the gateway keeps them."""

    __slots__ = ("inflight", "queue", "slots")

    def __init__(
        self, policy: QueuePolicy, slots: int, arbiter: DrrArbiter | FairArbiter | None = None
    ) -> None:
        self.queue = (
            create_task_queue(policy) if arbiter is None else AllocatedQueue(policy, arbiter)
        )
        self.slots = slots
        self.inflight = 0
        """Tasks handed to the server and not yet back."""

    def __len__(self) -> int:
        return len(self.queue)

    def push(self, p: PendingTask, now: float) -> None:
        """Queue a task here (it arrives now)."""
        p.enqueued_s = now
        self.queue.push(
            QueuedTask(
                query_id=p.run.query_id,
                task_index=p.index,
                deadline_s=p.deadline_s,
                slo_deadline_s=p.slo_deadline_s,
                priority=p.priority,
                arrival_s=now,
                item=p,
                flow=p.flow,
                cost=p.cost,
            )
        )

    def ready(self, now: float) -> Iterator[PendingTask]:
        """The tasks to send now, one per free slot, in the queue's order; each one's miss
        is decided at this dequeue (TailGuard §III.D)."""
        while self.inflight < self.slots:
            dq = self.queue.pop(now)
            if dq is None:
                return
            p: PendingTask = dq.task.item
            p.missed_deadline = dq.missed_deadline
            p.gateway_queue_ms = dq.wait_s * 1000.0
            self.inflight += 1
            yield p

    def count_ahead(
        self,
        deadline_s: float,
        slo_deadline_s: float,
        priority: int,
        now: float,
        flow: str = "",
        cost: float = 1.0,
    ) -> int:
        """Queued tasks the queue would send before a task with these keys pushed now."""
        probe = QueuedTask("", 0, deadline_s, slo_deadline_s, priority, now, None, flow, cost)
        return len(self.queue.ahead_of(probe))

    def done(self) -> None:
        """A task sent from here came back (or was given up): its slot is free."""
        self.inflight -= 1

    def remove_query(self, query_id: str) -> bool:
        """Forget the query's task; True if it was still queued (the server never saw it)."""
        return bool(self.queue.remove_query(query_id))

    def drain(self) -> list[PendingTask]:
        """Empty the queue; the tasks that were in it."""
        return [qt.item for qt in self.queue.drain()]

    def reset(self) -> list[PendingTask]:
        """The server is gone: empty the queue and free every slot; the queued tasks."""
        self.inflight = 0
        return self.drain()
