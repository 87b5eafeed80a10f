"""A server's task queue shared between flows by the allocation layer (client-side §3.1).

`AllocatedQueue` is what a central queue (gateway.central) and the simulator's servers hold
when ``[allocation] policy`` is drr or fair: one policy-ordered `TaskQueue` per flow (tenant
or class), and an arbiter (admission.allocation) that chooses which flow's head task is
released into the next free slot. The paper's layers map onto it as: allocation (the
arbiter) picks the flow, ordering (the queue policy, TF-EDFQ by default) picks the task
within it. A task's cost is its query's cost shared by its k_f tasks (QueuedTask.cost).

It answers the TaskQueue calls its users make (push, pop, ahead_of, remove_query,
remove_where, drain, len), so a deadline miss is still decided at the dequeue against the
task's own t_D (TailGuard §III.D).

Pure code: time comes in as `now`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from admission.allocation import DrrArbiter, FairArbiter
from taskserver.queues import Dequeued, QueuedTask, QueuePolicy, TaskQueue, create_task_queue

__all__ = ["AllocatedQueue"]

_EVERYTHING = QueuedTask("", 0, math.inf, math.inf, 1 << 62, math.inf)
"""A probe that every queued task is ahead of (its keys are the largest)."""


class AllocatedQueue:
    """Per-flow policy queues released in the arbiter's order."""

    __slots__ = ("_flows", "_live", "arbiter", "missed", "policy", "popped")

    def __init__(self, policy: QueuePolicy | str, arbiter: DrrArbiter | FairArbiter) -> None:
        self.policy = create_task_queue(policy).policy
        self.arbiter = arbiter
        self._flows: dict[str, TaskQueue] = {}
        self._live = 0
        self.popped = 0
        self.missed = 0

    def __len__(self) -> int:
        return self._live

    def backlog(self) -> dict[str, int]:
        """Tasks queued per flow (flows with none left out)."""
        return {f: len(q) for f, q in self._flows.items() if len(q)}

    def key(self, task: QueuedTask) -> tuple:
        """The task's sort key within its flow (the queue policy's)."""
        return self._queue(task.flow).key(task)

    def _queue(self, flow: str) -> TaskQueue:
        q = self._flows.get(flow)
        if q is None:
            q = self._flows[flow] = TaskQueue(self.policy)
        return q

    def push(self, task: QueuedTask) -> None:
        """Queue a task in its flow."""
        q = self._queue(task.flow)
        if not len(q):
            self.arbiter.backlogged(task.flow)
        q.push(task)
        self._live += 1

    def _head_cost(self, flow: object) -> float:
        head = self._flows[str(flow)].peek()
        assert head is not None  # the arbiter only asks for backlogged flows
        return head.cost

    def _head_key(self, flow: object) -> tuple:
        q = self._flows[str(flow)]
        head = q.peek()
        assert head is not None
        return q.key(head)

    def pop(self, now: float) -> Dequeued | None:
        """The head task of the flow the arbiter chooses; its miss decided now."""
        if isinstance(self.arbiter, DrrArbiter):
            flow = self.arbiter.choose(self._head_cost, self._head_key)
        else:
            flow = self.arbiter.choose(self._head_cost)
        if flow is None:
            return None
        q = self._flows[str(flow)]
        dq = q.pop(now)
        assert dq is not None
        if not len(q):
            self.arbiter.emptied(flow)
        self._live -= 1
        self.popped += 1
        self.missed += dq.missed_deadline
        return dq

    def ahead_of(self, task: QueuedTask) -> list[QueuedTask]:
        """The tasks released before `task`, were it pushed now, as the arbiter shares slots:
        those of its own flow ahead in policy order, and from every other backlogged flow the
        head tasks whose cost fits in that flow's weighted share of the same releases
        (cost ahead of and including `task`, times the other flow's weight over its own).
        An estimate for the wait estimator (QLM §6): the rounds' exact phase is not known."""
        own = self._flows.get(task.flow)
        out = own.ahead_of(task) if own is not None else []
        budget = sum(t.cost for t in out) + task.cost
        w_mine = self.arbiter.weight(task.flow)
        for flow, q in self._flows.items():
            if flow == task.flow or not len(q):
                continue
            allowance = budget * self.arbiter.weight(flow) / w_mine
            spent = 0.0
            for t in sorted(q.ahead_of(_EVERYTHING), key=q.key):
                spent += t.cost
                if spent > allowance:
                    break
                out.append(t)
        return out

    def remove_query(self, query_id: str) -> list[QueuedTask]:
        """Cancel every queued task of a query."""
        return self._remove(lambda q: q.remove_query(query_id))

    def remove_where(self, pred: Callable[[QueuedTask], bool]) -> list[QueuedTask]:
        """Cancel every queued task `pred` selects."""
        return self._remove(lambda q: q.remove_where(pred))

    def _remove(self, how: Callable[[TaskQueue], list[QueuedTask]]) -> list[QueuedTask]:
        out: list[QueuedTask] = []
        for flow, q in self._flows.items():
            if not len(q):
                continue
            gone = how(q)
            if gone:
                out.extend(gone)
                if not len(q):
                    self.arbiter.emptied(flow)
        self._live -= len(out)
        return out

    def drain(self) -> list[QueuedTask]:
        """Remove and return every task (flow by flow, each in policy order)."""
        out: list[QueuedTask] = []
        for flow, q in self._flows.items():
            if len(q):
                out.extend(q.drain())
                self.arbiter.emptied(flow)
        self._live = 0
        return out

    def __repr__(self) -> str:
        return (
            f"AllocatedQueue(policy={self.policy.value!r}, len={self._live}, "
            f"flows={len(self._flows)})"
        )
