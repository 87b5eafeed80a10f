"""Policy-ordered task queues: TF-EDFQ (TailGuard), T-EDFQ, PRIQ and FIFO.

Errors::

    Exception
     └── QueueFull      push() on a queue that holds max_len live tasks

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Dequeued",
    "QueueFull",
    "QueuePolicy",
    "QueuedTask",
    "TaskQueue",
    "create_task_queue",
]


class QueueFull(Exception):
    """The queue already holds max_len live tasks."""


class QueuePolicy(StrEnum):
    """Queue disciplines of TailGuard §III.B and §IV."""

    # key (deadline_s, arrival_s): fanout-aware EDF on t_D = t0 + x_p^SLO - x_p^u(k_f)
    TF_EDFQ = "tf-edfq"
    T_EDFQ = "t-edfq"  # key (slo_deadline_s, arrival_s): EDF on t0 + x_p^SLO, blind to fanout
    PRIQ = "priq"  # key (priority, arrival_s): smaller priority first, FIFO within a class
    FIFO = "fifo"  # key (arrival_s,)

    @classmethod
    def parse(cls, value: object, name: str = "policy") -> QueuePolicy:
        """The policy a config value names; ValueError "name: must be one of ..." if none."""
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(p.value for p in cls)
            raise ValueError(f"{name}: must be one of {valid}, got {value!r}") from None


@dataclass(slots=True, eq=False)
class QueuedTask:
    """One task waiting for its server; times are on the local clock, in seconds."""

    query_id: str
    task_index: int
    deadline_s: float  # local t_D: the miss reference for EVERY policy (miss ratio is on t_D)
    slo_deadline_s: float  # local t0 + SLO
    priority: int
    arrival_s: float
    item: object = None  # opaque payload carried for the shell
    flow: str = ""  # the tenant or class it is for (gateway.allocation; "" when unshared)
    cost: float = 1.0  # its cost units in the allocation layer (its query's cost / k_f)


@dataclass(frozen=True, slots=True)
class Dequeued:
    """A popped task with its queue wait and whether it left after its deadline."""

    task: QueuedTask
    wait_s: float  # now - arrival_s
    missed_deadline: bool  # now > deadline_s


# Heap entries are tuples (*key, seq, task): seq is unique and increasing, so it breaks every
# tie in insertion order and comparison never reaches the task. One builder per policy keeps
# push to a single call; TaskQueue.key() slices the key back out of it.
def _tf_edfq_entry(task: QueuedTask, seq: int) -> tuple:
    return (task.deadline_s, task.arrival_s, seq, task)  # TailGuard: t_D = t0 + x_p^SLO - x_p^u


def _t_edfq_entry(task: QueuedTask, seq: int) -> tuple:
    return (task.slo_deadline_s, task.arrival_s, seq, task)  # t0 + x_p^SLO


def _priq_entry(task: QueuedTask, seq: int) -> tuple:
    return (task.priority, task.arrival_s, seq, task)


def _fifo_entry(task: QueuedTask, seq: int) -> tuple:
    return (task.arrival_s, seq, task)


_ENTRIES: dict[QueuePolicy, Callable[[QueuedTask, int], tuple]] = {
    QueuePolicy.TF_EDFQ: _tf_edfq_entry,
    QueuePolicy.T_EDFQ: _t_edfq_entry,
    QueuePolicy.PRIQ: _priq_entry,
    QueuePolicy.FIFO: _fifo_entry,
}


def _parse_policy(policy: QueuePolicy | str) -> QueuePolicy:
    if isinstance(policy, QueuePolicy):
        return policy
    if isinstance(policy, str):
        name = policy.strip().lower().replace("_", "-")
        try:
            return QueuePolicy(name)
        except ValueError:
            pass
    valid = ", ".join(repr(p.value) for p in QueuePolicy)
    raise ValueError(f"queue policy: unknown {policy!r}, expected one of {valid}")


class TaskQueue:
    """A policy-ordered task queue (one per task server, or per server at a central gateway)."""

    __slots__ = (
        "_by_query",
        "_entry",
        "_heap",
        "_live",
        "_removed",
        "_seq",
        "max_len",
        "missed",
        "policy",
        "popped",
    )

    def __init__(
        self, policy: QueuePolicy | str = QueuePolicy.TF_EDFQ, max_len: int | None = None
    ) -> None:
        if max_len is not None and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1
        ):
            raise ValueError(f"queue max_len: must be an int >= 1 or None, got {max_len!r}")
        self.policy: QueuePolicy = _parse_policy(policy)
        self.max_len = max_len
        self._entry = _ENTRIES[self.policy]
        self._heap: list[tuple] = []
        self._by_query: dict[str, dict[int, QueuedTask]] = {}  # query_id -> {seq: live task}
        self._removed: set[int] = set()  # seqs of heap entries cancelled by remove_query()
        self._seq = 0
        self._live = 0
        self.popped = 0
        self.missed = 0

    def key(self, task: QueuedTask) -> tuple:
        """The policy's sort key; the queue appends an insertion seq as the final tie-breaker."""
        return self._entry(task, 0)[:-2]

    def push(self, task: QueuedTask) -> None:
        """Enqueue a task; raises QueueFull when max_len live tasks are queued."""
        if self.max_len is not None and self._live >= self.max_len:
            raise QueueFull(f"queue full: {self._live} tasks queued (max_len={self.max_len})")
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, self._entry(task, seq))
        same_query = self._by_query.get(task.query_id)
        if same_query is None:
            self._by_query[task.query_id] = {seq: task}
        else:
            same_query[seq] = task
        self._live += 1

    def pop(self, now: float) -> Dequeued | None:
        """Remove the next task in policy order and account whether it missed its deadline."""
        heap = self._heap
        removed = self._removed
        while heap:
            entry = heapq.heappop(heap)
            seq = entry[-2]
            if removed and seq in removed:
                removed.discard(seq)
                continue
            task: QueuedTask = entry[-1]
            query_id = task.query_id
            same_query = self._by_query[query_id]
            del same_query[seq]
            if not same_query:
                del self._by_query[query_id]
            self._live -= 1
            missed = now > task.deadline_s
            self.popped += 1
            if missed:
                self.missed += 1
            return Dequeued(task, now - task.arrival_s, missed)
        return None

    def peek(self) -> QueuedTask | None:
        """The task pop() would return next, left in the queue."""
        heap = self._heap
        removed = self._removed
        while heap and heap[0][-2] in removed:
            removed.discard(heapq.heappop(heap)[-2])
        return heap[0][-1] if heap else None

    def ahead_of(self, task: QueuedTask) -> list[QueuedTask]:
        """The queued tasks pop() would return before `task`, were it pushed now (any order)."""
        key = self.key(task)
        removed = self._removed
        # Ties on the key go to the earlier push (the seq), so an equal key is ahead.
        return [e[-1] for e in self._heap if e[:-2] <= key and not (removed and e[-2] in removed)]

    def remove_query(self, query_id: str) -> list[QueuedTask]:
        """Cancel every queued task of a query; returns them in insertion order."""
        same_query = self._by_query.pop(query_id, None)
        if not same_query:
            return []
        self._removed.update(same_query)
        self._live -= len(same_query)
        self._compact()
        return list(same_query.values())

    def remove_where(self, pred: Callable[[QueuedTask], bool]) -> list[QueuedTask]:
        """Cancel every queued task pred selects (say, those of a closed connection)."""
        out: list[QueuedTask] = []
        for query_id in list(self._by_query):
            same_query = self._by_query[query_id]
            for seq in [seq for seq, task in same_query.items() if pred(task)]:
                out.append(same_query.pop(seq))
                self._removed.add(seq)
            if not same_query:
                del self._by_query[query_id]
        self._live -= len(out)
        self._compact()
        return out

    def _compact(self) -> None:
        # Compact once tombstones are the majority, so the heap stays O(live) in size.
        if len(self._removed) > len(self._heap) // 2:
            removed = self._removed
            self._heap = [e for e in self._heap if e[-2] not in removed]
            heapq.heapify(self._heap)
            removed.clear()

    def drain(self) -> list[QueuedTask]:
        """Remove and return every live task, in policy order (for shutdown); counters untouched."""
        removed = self._removed
        live = sorted(e for e in self._heap if e[-2] not in removed)
        self._heap = []
        self._by_query = {}
        self._removed = set()
        self._live = 0
        return [e[-1] for e in live]

    def __len__(self) -> int:
        return self._live

    def __repr__(self) -> str:
        return (
            f"TaskQueue(policy={self.policy.value!r}, len={self._live}, "
            f"popped={self.popped}, missed={self.missed})"
        )


def create_task_queue(policy: QueuePolicy | str, max_len: int | None = None) -> TaskQueue:
    """Build the queue for a configured policy name; unknown names raise ValueError."""
    return TaskQueue(_parse_policy(policy), max_len=max_len)
