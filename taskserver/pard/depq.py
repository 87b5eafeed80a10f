"""The double-ended priority queue of PARD §4.3 and the worker queues built on it.

Why two heaps with lazy deletion rather than a min-max heap: CPython's ``heapq`` is C code, so
two heaps cost two C-level sift operations per push where a pure-Python min-max heap pays a
Python loop (and an id -> position map update on every swap, for remove-by-id). Every operation
stays O(log n) amortised: a pop from one end leaves a tombstone in the other heap that is
discarded when it surfaces, and both heaps are rebuilt in O(n) once tombstones outnumber the
live entries, so memory stays O(live).

The DEPQ key is the remaining latency budget (§4.3). Budget = deadline - now, and `now` is the
same for every queued request, so ordering by the local deadline is the same order at any time
and the heap never needs re-keying.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from enum import StrEnum
from typing import Generic, TypeVar

from taskserver.pard.abc import RequestQueue
from taskserver.pard.errors import DuplicateRequest
from taskserver.pard.load import AdaptivePriority, Priority, PriorityConfig
from taskserver.pard.request import PipelineRequest

__all__ = [
    "BudgetQueue",
    "DoubleEndedPriorityQueue",
    "FifoQueue",
    "QueueOrder",
    "create_queue",
    "parse_queue_order",
]

T = TypeVar("T")


class DoubleEndedPriorityQueue(Generic[T]):
    """Items keyed by a float, popped from either end; ties go to the earlier push at both ends."""

    __slots__ = ("_live", "_max", "_min", "_seq")

    def __init__(self) -> None:
        self._min: list[tuple[float, int, Hashable]] = []  # (key, seq, id)
        self._max: list[tuple[float, int, Hashable]] = []  # (-key, seq, id)
        self._live: dict[Hashable, tuple[int, float, T]] = {}  # id -> (seq, key, item)
        self._seq = 0

    def push(self, item_id: Hashable, key: float, item: T) -> None:
        """Add `item` under `key`; raises DuplicateRequest if `item_id` is present."""
        if item_id in self._live:
            raise DuplicateRequest(f"id {item_id!r} is already queued")
        if key != key:  # NaN would break both heap orders
            raise ValueError(f"depq key: must not be NaN (id {item_id!r})")
        seq = self._seq
        self._seq = seq + 1
        self._live[item_id] = (seq, key, item)
        heapq.heappush(self._min, (key, seq, item_id))
        heapq.heappush(self._max, (-key, seq, item_id))
        self._maybe_compact()

    def _clean(self, heap: list[tuple[float, int, Hashable]]) -> None:
        live = self._live
        while heap:
            _, seq, item_id = heap[0]
            entry = live.get(item_id)
            if entry is not None and entry[0] == seq:
                return
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        # Tombstones: entries popped from the other end or removed by id.
        if len(self._min) + len(self._max) > 4 * len(self._live) + 64:
            live = self._live
            self._min = [(k, s, i) for i, (s, k, _) in live.items()]
            self._max = [(-k, s, i) for i, (s, k, _) in live.items()]
            heapq.heapify(self._min)
            heapq.heapify(self._max)

    def _take(self, heap: list[tuple[float, int, Hashable]]) -> T:
        self._clean(heap)
        if not heap:
            raise IndexError("pop from an empty DEPQ")
        item_id = heapq.heappop(heap)[2]
        item = self._live.pop(item_id)[2]
        self._maybe_compact()
        return item

    def _top(self, heap: list[tuple[float, int, Hashable]]) -> T:
        self._clean(heap)
        if not heap:
            raise IndexError("peek into an empty DEPQ")
        return self._live[heap[0][2]][2]

    def pop_min(self) -> T:
        """Remove and return the item with the smallest key."""
        return self._take(self._min)

    def pop_max(self) -> T:
        """Remove and return the item with the largest key."""
        return self._take(self._max)

    def peek_min(self) -> T:
        """The item with the smallest key, left in place."""
        return self._top(self._min)

    def peek_max(self) -> T:
        """The item with the largest key, left in place."""
        return self._top(self._max)

    def remove(self, item_id: Hashable) -> T | None:
        """Remove an item by id; None when absent."""
        entry = self._live.pop(item_id, None)
        if entry is None:
            return None
        self._maybe_compact()
        return entry[2]

    def key(self, item_id: Hashable) -> float:
        """The key an item was pushed with; KeyError when absent."""
        return self._live[item_id][1]

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._live


class QueueOrder(StrEnum):
    """Worker queue orders: PARD's adaptive one and the §5.3 ordering ablations."""

    ADAPTIVE = "adaptive"  # HBF/LBF on mu with the delayed transition (§4.3)
    INSTANT = "instant"  # HBF/LBF switched at mu = 1 with no band (ablation)
    HBF = "hbf"  # PARD-HBF: High Budget First only
    LBF = "lbf"  # PARD-LBF: Low Budget First only
    FCFS = "fcfs"  # PARD-FCFS / Nexus / Clipper: arrival order


class BudgetQueue(RequestQueue):
    """A worker's DEPQ on remaining budget, popped HBF or LBF (PARD §4.3)."""

    __slots__ = ("_depq", "controller", "order")

    def __init__(
        self, order: QueueOrder | str = QueueOrder.ADAPTIVE, config: PriorityConfig | None = None
    ) -> None:
        order = parse_queue_order(order)
        if order is QueueOrder.FCFS:
            raise ValueError("budget queue order: 'fcfs' is arrival order, use FifoQueue")
        self.order = order
        self._depq: DoubleEndedPriorityQueue[PipelineRequest] = DoubleEndedPriorityQueue()
        self.controller: AdaptivePriority | None = None
        if order in (QueueOrder.ADAPTIVE, QueueOrder.INSTANT):
            self.controller = AdaptivePriority(config, instant=order is QueueOrder.INSTANT)

    def push(self, request: PipelineRequest, now: float) -> None:
        """Enqueue by remaining budget and count the arrival into T_in."""
        self._depq.push(request.request_id, request.deadline_s, request)
        if self.controller is not None:
            self.controller.record_arrival(now)

    def set_capacity_rps(self, capacity_rps: float) -> None:
        """T_m of this worker (b / d(b)); the adaptive orders need it to compute mu."""
        if self.controller is not None:
            self.controller.set_capacity_rps(capacity_rps)

    def priority(self, now: float) -> Priority:
        """The end to pop from at `now`."""
        if self.controller is not None:
            return self.controller.update(now)
        return Priority.HBF if self.order is QueueOrder.HBF else Priority.LBF

    def pop(self, now: float) -> PipelineRequest | None:
        """Pop the largest budget under HBF, the smallest under LBF; None when empty."""
        if not self._depq:
            if self.controller is not None:
                self.controller.update(now)  # keep mu current while idle
            return None
        if self.priority(now) is Priority.HBF:
            return self._depq.pop_max()
        return self._depq.pop_min()

    def peek_min(self) -> PipelineRequest | None:
        """The request with the smallest remaining budget, or None."""
        return self._depq.peek_min() if self._depq else None

    def pop_min(self) -> PipelineRequest | None:
        """Remove the request with the smallest remaining budget, or None."""
        return self._depq.pop_min() if self._depq else None

    def peek_max(self) -> PipelineRequest | None:
        """The request with the largest remaining budget, or None."""
        return self._depq.peek_max() if self._depq else None

    def pop_max(self) -> PipelineRequest | None:
        """Remove the request with the largest remaining budget, or None."""
        return self._depq.pop_max() if self._depq else None

    def remove(self, request_id: Hashable) -> PipelineRequest | None:
        """Remove by id; None when not queued."""
        return self._depq.remove(request_id)

    def __len__(self) -> int:
        return len(self._depq)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._depq


class FifoQueue(RequestQueue):
    """Arrival order, with O(1) remove by id (Nexus, Clipper++, PARD-FCFS)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: OrderedDict[Hashable, PipelineRequest] = OrderedDict()

    def push(self, request: PipelineRequest, now: float) -> None:
        """Append at the tail."""
        if request.request_id in self._items:
            raise DuplicateRequest(f"id {request.request_id!r} is already queued")
        self._items[request.request_id] = request

    def pop(self, now: float) -> PipelineRequest | None:
        """Remove the head; None when empty."""
        return self._items.popitem(last=False)[1] if self._items else None

    def head(self, n: int) -> list[PipelineRequest]:
        """The first `n` requests in arrival order, left in place."""
        out: list[PipelineRequest] = []
        for request in self._items.values():
            if len(out) >= n:
                break
            out.append(request)
        return out

    def remove(self, request_id: Hashable) -> PipelineRequest | None:
        """Remove by id; None when not queued."""
        return self._items.pop(request_id, None)

    def __iter__(self) -> Iterator[PipelineRequest]:
        """Queued requests in arrival order (do not push or pop while iterating)."""
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items


def parse_queue_order(order: QueueOrder | str) -> QueueOrder:
    """A QueueOrder from its name; ValueError naming the valid ones."""
    if isinstance(order, QueueOrder):
        return order
    try:
        return QueueOrder(str(order).strip().lower())
    except ValueError:
        valid = ", ".join(repr(o.value) for o in QueueOrder)
        raise ValueError(f"queue order: unknown {order!r}, expected one of {valid}") from None


def create_queue(
    order: QueueOrder | str, config: PriorityConfig | None = None
) -> BudgetQueue | FifoQueue:
    """A worker queue for `order`: a FifoQueue for 'fcfs', otherwise a BudgetQueue."""
    order = parse_queue_order(order)
    if order is QueueOrder.FCFS:
        return FifoQueue()
    return BudgetQueue(order, config)
