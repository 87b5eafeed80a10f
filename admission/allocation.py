"""The allocation layer (client-side-scheduling §3.1): which tenant or class releases next.

The paper's allocation layer decides inter-class long-term share with Deficit Round Robin:
"each class maintains a deficit counter; when selected, a class may send if deficit >=
estimated_cost, otherwise the deficit accumulates"; a work-conserving borrowing rule lets a
backlogged class use an idle class's unused quota, and "congestion feedback scales weights:
under stress the short class's effective share grows". Here a flow is a tenant or a class,
its work is counted in cost units (k_f * x_p^u(k_f) of a query, or a client's cost hint),
and the shell releases work in the order `pop` gives:

- ``drr`` (`DeficitRoundRobin`): Shreedhar and Varghese's DRR as the paper uses it. Each
  visit of a backlogged flow adds quantum * weight to its deficit; it releases its head
  while the deficit covers the head's cost, and the rest carries over to its next visit. An
  empty flow leaves the round and its deficit is reset, so flows with no work take no share
  (the borrowing rule: the others' turns come round faster). Flows marked protected get
  their weight multiplied by 1 + boost * congestion (congestion in [0, 1], from the shell's
  load signal), the paper's congestion-aware adjustment; the paper gives no formula, this
  linear one is ours.
- ``fair`` (`FairQueue`): start-time fair queueing, the round robin across classes the
  paper compares as "Fair Queuing": each item's start tag is max(virtual time, its flow's
  last finish tag), its finish tag start + cost / weight; the smallest start tag goes first.
  Also work-conserving; weights are long-run shares of cost.

Pure code: no clock; the shell pushes, pops and sets the congestion.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from admission.errors import PolicyValueError

__all__ = ["DeficitRoundRobin", "FairQueue", "Flow"]


def _check_weight(flow: Hashable, weight: float) -> float:
    if not (weight > 0 and math.isfinite(weight)):
        raise PolicyValueError(f"allocation weight of {flow!r}: must be > 0, got {weight!r}")
    return float(weight)


def _check_cost(cost: float) -> float:
    if not (cost > 0 and math.isfinite(cost)):
        raise PolicyValueError(f"allocation cost: must be > 0 and finite, got {cost!r}")
    return float(cost)


@dataclass(slots=True)
class Flow:
    """One tenant's or class's queue and its counters."""

    weight: float
    protected: bool = False
    deficit: float = 0.0
    queue: list[tuple[Any, int, Any, float]] = field(default_factory=list)
    """A heap of (order key, push seq, item, cost): the flow's own order (push order unless
    the shell gives keys, e.g. its tasks' deadlines: allocation picks the flow, the policy
    the item within it, the client-side paper's ordering layer)."""
    released_cost: float = 0.0
    released: int = 0


class DeficitRoundRobin:
    """DRR over flows in cost units (client-side-scheduling §3.1's allocation layer)."""

    def __init__(
        self,
        weights: Mapping[Hashable, float],
        *,
        quantum: float,
        protected: frozenset[Hashable] = frozenset(),
        boost: float = 1.0,
        default_weight: float = 1.0,
    ) -> None:
        if not (quantum > 0 and math.isfinite(quantum)):
            raise PolicyValueError(f"allocation quantum: must be > 0, got {quantum!r}")
        if not (boost >= 0 and math.isfinite(boost)):
            raise PolicyValueError(f"allocation boost: must be >= 0, got {boost!r}")
        self.quantum = float(quantum)
        self.boost = float(boost)
        self.default_weight = _check_weight("default", default_weight)
        self.flows: dict[Hashable, Flow] = {
            f: Flow(_check_weight(f, w), f in protected) for f, w in weights.items()
        }
        self._active: deque[Hashable] = deque()  # backlogged flows, in round order
        self._seq = itertools.count()
        self._fresh = True  # the flow at the head of the round has not had its quantum yet
        self.congestion = 0.0

    def set_congestion(self, level: float) -> None:
        """The load signal in [0, 1] (0: calm); it scales the protected flows' weights."""
        self.congestion = min(max(float(level), 0.0), 1.0)

    def weight(self, flow: Hashable) -> float:
        """The flow's weight in force now (protected flows grow with the congestion)."""
        f = self.flows[flow]
        return f.weight * (1.0 + self.boost * self.congestion) if f.protected else f.weight

    def push(self, flow: Hashable, item: Any, cost: float, key: Any = None) -> None:
        """Queue one item of `cost` units for `flow` (an unknown flow gets the default weight);
        within its flow it goes by `key` (smallest first; None: push order)."""
        cost = _check_cost(cost)
        f = self.flows.get(flow)
        if f is None:
            f = self.flows[flow] = Flow(self.default_weight)
        if not f.queue:
            self._active.append(flow)
            if len(self._active) == 1:
                self._fresh = True
        seq = next(self._seq)
        heapq.heappush(f.queue, (seq if key is None else key, seq, item, cost))

    def pop(self) -> tuple[Hashable, Any] | None:
        """The next item to release and its flow, in DRR order; None when nothing waits."""
        active = self._active
        passed = 0  # turns passed in a row without a release
        while active:
            if passed == len(active):
                self._skip_rounds()
                passed = 0
            name = active[0]
            f = self.flows[name]
            if self._fresh:
                f.deficit += self.quantum * self.weight(name)
                self._fresh = False
            _, _, item, cost = f.queue[0]
            if cost <= f.deficit:
                heapq.heappop(f.queue)
                f.deficit -= cost
                f.released += 1
                f.released_cost += cost
                if not f.queue:
                    f.deficit = 0.0  # an emptied flow keeps no credit (DRR)
                    active.popleft()
                    self._fresh = True
                return name, item
            # Not enough: the deficit carries over, the turn passes.
            active.rotate(-1)
            self._fresh = True
            passed += 1
        return None

    def _skip_rounds(self) -> None:
        """A whole round released nothing: add at once the rounds that still would not
        (each flow's quantum that many times), so a cost far above the quantum costs one
        step, not cost / quantum of them."""
        rounds = min(
            math.ceil((self.flows[n].queue[0][3] - self.flows[n].deficit)
                      / (self.quantum * self.weight(n))) - 1
            for n in self._active
        )  # fmt: skip
        if rounds > 0:
            for n in self._active:
                self.flows[n].deficit += rounds * self.quantum * self.weight(n)

    def __len__(self) -> int:
        return sum(len(f.queue) for f in self.flows.values())

    def snapshot(self) -> dict[str, Any]:
        """Per flow: weight in force, deficit, backlog, released items and cost."""
        return {
            str(name): {
                "weight": self.weight(name),
                "deficit": f.deficit,
                "backlog": len(f.queue),
                "released": f.released,
                "released_cost": f.released_cost,
            }
            for name, f in self.flows.items()
        }


class FairQueue:
    """Start-time fair queueing over flows in cost units (the paper's "Fair Queuing")."""

    def __init__(self, weights: Mapping[Hashable, float], *, default_weight: float = 1.0) -> None:
        self.default_weight = _check_weight("default", default_weight)
        self.weights = {f: _check_weight(f, w) for f, w in weights.items()}
        self._finish: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable, Any, float]] = []
        self._seq = itertools.count()
        self.virtual = 0.0
        self.released_cost: dict[Hashable, float] = {}

    def push(self, flow: Hashable, item: Any, cost: float) -> None:
        """Queue one item; its start tag is max(virtual time, the flow's last finish tag)."""
        cost = _check_cost(cost)
        weight = self.weights.setdefault(flow, self.default_weight)
        start = max(self.virtual, self._finish.get(flow, 0.0))
        self._finish[flow] = start + cost / weight
        heapq.heappush(self._heap, (start, next(self._seq), flow, item, cost))

    def pop(self) -> tuple[Hashable, Any] | None:
        """The item with the smallest start tag; the virtual time moves to it."""
        if not self._heap:
            return None
        start, _, flow, item, cost = heapq.heappop(self._heap)
        self.virtual = start
        self.released_cost[flow] = self.released_cost.get(flow, 0.0) + cost
        return flow, item

    def __len__(self) -> int:
        return len(self._heap)
