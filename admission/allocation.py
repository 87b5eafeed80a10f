"""The allocation layer (client-side-scheduling §3.1): which tenant or class releases next.

The paper's allocation layer decides inter-class long-term share with Deficit Round Robin:
"each class maintains a deficit counter; when selected, a class may send if deficit >=
estimated_cost, otherwise the deficit accumulates"; a work-conserving borrowing rule lets a
backlogged class use an idle class's unused quota, and "congestion feedback scales weights:
under stress the short class's effective share grows". Here a flow is a tenant or a class,
its work is counted in cost units (k_f * x_p^u(k_f) of a query, or a client's cost hint,
shared by its k_f tasks), and the shell releases work in the order the arbiter gives:

- ``drr`` (`DrrArbiter`): Shreedhar and Varghese's DRR as the paper uses it. Each visit of a
  backlogged flow adds quantum * weight to its deficit (the quantum, by default, is the
  largest item cost seen so far: their condition for releasing at least one item per visit,
  and the finest interleaving that keeps it); it releases its head while the
  deficit covers the head's cost, and the rest carries over to its next visit. An empty
  flow leaves the round and its deficit is reset, so flows with no work take no share (the
  borrowing rule: the others' turns come round faster). Flows marked protected get their
  weight multiplied by 1 + boost * congestion (congestion in [0, 1], from the shell's load
  signal), the paper's congestion-aware adjustment; the paper gives no formula, this linear
  one is ours.
- ``fair`` (`FairArbiter`): start-time fair queueing, the round robin across classes the
  paper compares as "Fair Queuing": a flow's head gets the start tag max(virtual time, the
  flow's last finish tag) and the finish tag start + cost / weight; the smallest start tag
  goes first. Also work-conserving; weights are long-run shares of cost.

An arbiter only chooses the flow: the items wait in the shell's own queues, one per flow, in
the shell's order (the paper's ordering layer: in the gateway, each flow's tasks keep the
server's queue policy, TF-EDFQ by default). `DeficitRoundRobin` and `FairQueue` are the same
arbiters over plain per-flow heaps.

`AdmissionShare` carries the share to admission (beyond the paper, which shares send
opportunities only): when the admission rule turns a query away on the pool-wide load
signal, the share decides whose query that is. A query refused while its flow has been
admitted less work per weight than the most-served flow is admitted instead, and the cost is
charged to that flow as a debt, paid by refusing its next queries the rule would admit. So
the rule still decides how much work enters; the share decides whose, and a flooding
tenant's load cannot get the other tenants' queries refused.

Pure code: no clock; times come in as arguments.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from admission.errors import PolicyValueError

__all__ = [
    "ALLOCATION_POLICIES",
    "AdmissionShare",
    "Arbiter",
    "Congestion",
    "DeficitRoundRobin",
    "DrrArbiter",
    "FairArbiter",
    "FairQueue",
    "FlowState",
    "HeapFlows",
]

ALLOCATION_POLICIES = ("none", "drr", "fair")
"""[allocation] policy values."""


def _check_weight(flow: Hashable, weight: float) -> float:
    if not (weight > 0 and math.isfinite(weight)):
        raise PolicyValueError(f"allocation weight of {flow!r}: must be > 0, got {weight!r}")
    return float(weight)


def _check_cost(cost: float) -> float:
    if not (cost > 0 and math.isfinite(cost)):
        raise PolicyValueError(f"allocation cost: must be > 0 and finite, got {cost!r}")
    return float(cost)


class Congestion:
    """The load signal in [0, 1] that DRR's protected flows grow with (0: calm); one object
    may be shared by the arbiters of many servers."""

    __slots__ = ("level",)

    def __init__(self, level: float = 0.0) -> None:
        self.level = 0.0
        self.set(level)

    def set(self, level: float) -> None:
        """Clamp to [0, 1]; NaN counts as calm."""
        level = float(level)
        self.level = min(max(level, 0.0), 1.0) if level == level else 0.0


@dataclass(slots=True)
class FlowState:
    """One flow's counters in an arbiter."""

    weight: float
    protected: bool = False
    deficit: float = 0.0
    released: int = 0
    released_cost: float = 0.0


class Arbiter(Protocol):
    """Chooses which backlogged flow releases next; the shell keeps the items.

    The shell tells it when a flow gets work (`backlogged`, on the push into an empty flow
    queue) and when a flow has none left (`emptied`, after a release or a removal), and asks
    `choose(head_cost)` for the next flow: `head_cost(flow)` is the cost of the item at the
    head of that flow's queue, and the chosen flow's head is charged and must be released.
    """

    flows: dict[Hashable, FlowState]

    def backlogged(self, flow: Hashable) -> None: ...
    def emptied(self, flow: Hashable) -> None: ...
    def choose(self, head_cost: Callable[[Hashable], float]) -> Hashable | None: ...
    def weight(self, flow: Hashable) -> float: ...


class _Weights:
    """Configured weights, the default for flows first seen at run time, protected flows."""

    def __init__(
        self,
        weights: Mapping[Hashable, float],
        protected: frozenset[Hashable],
        default_weight: float,
    ) -> None:
        self.default_weight = _check_weight("default", default_weight)
        self.protected = protected
        self.flows: dict[Hashable, FlowState] = {
            f: FlowState(_check_weight(f, w), f in protected) for f, w in weights.items()
        }

    def state(self, flow: Hashable) -> FlowState:
        f = self.flows.get(flow)
        if f is None:
            f = self.flows[flow] = FlowState(self.default_weight, flow in self.protected)
        return f

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per flow: weight in force, deficit, released items and cost."""
        return {
            str(name): {
                "weight": self.weight(name),
                "deficit": f.deficit,
                "released": f.released,
                "released_cost": f.released_cost,
            }
            for name, f in self.flows.items()
        }

    def weight(self, flow: Hashable) -> float:
        return self.state(flow).weight


class DrrArbiter(_Weights):
    """DRR over flows in cost units (client-side-scheduling §3.1's allocation layer)."""

    def __init__(
        self,
        weights: Mapping[Hashable, float],
        *,
        quantum: float | None = None,
        protected: frozenset[Hashable] = frozenset(),
        boost: float = 1.0,
        default_weight: float = 1.0,
        congestion: Congestion | None = None,
        urgent: bool = False,
    ) -> None:
        if quantum is not None and not (quantum > 0 and math.isfinite(quantum)):
            raise PolicyValueError(f"allocation quantum: must be > 0, got {quantum!r}")
        if not (boost >= 0 and math.isfinite(boost)):
            raise PolicyValueError(f"allocation boost: must be >= 0, got {boost!r}")
        super().__init__(weights, protected, default_weight)
        self.auto_quantum = quantum is None
        """The quantum follows the largest item cost seen (Shreedhar and Varghese's
        Q >= max packet size)."""
        self.quantum = 0.0 if quantum is None else float(quantum)
        self.urgent = urgent
        """Among the flows whose deficit covers their head, the most urgent head goes first
        (`choose` with head keys); else the round's order (classic DRR)."""
        self.boost = float(boost)
        self.congestion = Congestion() if congestion is None else congestion
        self._active: deque[Hashable] = deque()  # backlogged flows, in round order
        self._fresh = True  # the flow at the head of the round has not had its quantum yet

    def weight(self, flow: Hashable) -> float:
        """The flow's weight in force now (protected flows grow with the congestion)."""
        f = self.state(flow)
        return f.weight * (1.0 + self.boost * self.congestion.level) if f.protected else f.weight

    def backlogged(self, flow: Hashable) -> None:
        self.state(flow)
        self._active.append(flow)
        if len(self._active) == 1:
            self._fresh = True

    def emptied(self, flow: Hashable) -> None:
        self.flows[flow].deficit = 0.0  # an emptied flow keeps no credit (DRR)
        if self._active and self._active[0] == flow:
            self._active.popleft()
            self._fresh = True
        else:
            self._active.remove(flow)

    def choose(
        self,
        head_cost: Callable[[Hashable], float],
        head_key: Callable[[Hashable], Any] | None = None,
    ) -> Hashable | None:
        """The flow whose head goes next (charged for it). With `urgent` and `head_key` (the
        sort key of a flow's head, e.g. its deadline): DRR decides which flows may release
        (deficit >= head cost; when none may, a new round adds every backlogged flow its
        quantum), and among those the smallest head key goes first: the paper's ordering
        layer choosing among the jobs eligible under the allocation (§3.1), here across
        flows as well as within them. Without them, classic DRR's round order."""
        if self.urgent and head_key is not None:
            return self._choose_urgent(head_cost, head_key)
        active = self._active
        passed = 0  # turns passed in a row without a release
        while active:
            if passed == len(active):
                self._skip_rounds(head_cost)
                passed = 0
            name = active[0]
            f = self.flows[name]
            if self._fresh:
                f.deficit += self.quantum * self.weight(name)
                self._fresh = False
            cost = head_cost(name)
            if self.auto_quantum and cost > self.quantum:
                # A larger item than any before: the quantum grows to it, and the flow
                # whose turn it is gets the difference for this visit.
                f.deficit += (cost - self.quantum) * self.weight(name)
                self.quantum = cost
            if cost <= f.deficit:
                f.deficit -= cost
                f.released += 1
                f.released_cost += cost
                return name
            # Not enough: the deficit carries over, the turn passes.
            active.rotate(-1)
            self._fresh = True
            passed += 1
        return None

    def _choose_urgent(
        self, head_cost: Callable[[Hashable], float], head_key: Callable[[Hashable], Any]
    ) -> Hashable | None:
        active = self._active
        if not active:
            return None
        costs = {n: head_cost(n) for n in active}
        if self.auto_quantum:
            self.quantum = max(self.quantum, *costs.values())
        flows = self.flows
        eligible = [n for n in active if flows[n].deficit >= costs[n]]
        if not eligible:
            # New rounds: as many at once as the first flow to become eligible needs.
            rounds = min(
                math.ceil((costs[n] - flows[n].deficit) / (self.quantum * self.weight(n)))
                for n in active
            )
            for n in active:
                flows[n].deficit += max(rounds, 1) * self.quantum * self.weight(n)
            eligible = [n for n in active if flows[n].deficit >= costs[n]]
        name = min(eligible, key=head_key)
        f = flows[name]
        f.deficit -= costs[name]
        f.released += 1
        f.released_cost += costs[name]
        return name

    def _skip_rounds(self, head_cost: Callable[[Hashable], float]) -> None:
        """A whole round released nothing: add at once the rounds that still would not
        (each flow's quantum that many times), so a cost far above the quantum costs one
        step, not cost / quantum of them."""
        rounds = min(
            math.ceil((head_cost(n) - self.flows[n].deficit) / (self.quantum * self.weight(n))) - 1
            for n in self._active
        )
        if rounds > 0:
            for n in self._active:
                self.flows[n].deficit += rounds * self.quantum * self.weight(n)


class FairArbiter(_Weights):
    """Start-time fair queueing over flows in cost units (the paper's "Fair Queuing")."""

    def __init__(
        self,
        weights: Mapping[Hashable, float],
        *,
        default_weight: float = 1.0,
    ) -> None:
        super().__init__(weights, frozenset(), default_weight)
        self.virtual = 0.0
        self._finish: dict[Hashable, float] = {}
        self._start: dict[Hashable, tuple[float, int]] = {}  # backlogged: (start tag, order)
        self._order = itertools.count()

    def backlogged(self, flow: Hashable) -> None:
        self.state(flow)
        start = max(self.virtual, self._finish.get(flow, 0.0))
        self._start[flow] = (start, next(self._order))

    def emptied(self, flow: Hashable) -> None:
        self._start.pop(flow, None)

    def choose(self, head_cost: Callable[[Hashable], float]) -> Hashable | None:
        if not self._start:
            return None
        flow = min(self._start, key=self._start.__getitem__)
        start, order = self._start[flow]
        cost = head_cost(flow)
        f = self.flows[flow]
        finish = start + cost / f.weight
        self.virtual = start
        self._finish[flow] = finish
        self._start[flow] = (finish, order)  # its next item starts where this one finishes
        f.released += 1
        f.released_cost += cost
        return flow


class HeapFlows:
    """An arbiter over per-flow heaps of items: the allocation layer on its own."""

    def __init__(self, arbiter: DrrArbiter | FairArbiter) -> None:
        self.arbiter = arbiter
        self._queues: dict[Hashable, list[tuple[Any, int, Any, float]]] = {}
        self._seq = itertools.count()

    @property
    def flows(self) -> dict[Hashable, FlowState]:
        """Each flow's counters."""
        return self.arbiter.flows

    def push(self, flow: Hashable, item: Any, cost: float, key: Any = None) -> None:
        """Queue one item of `cost` units for `flow` (an unknown flow gets the default
        weight); within its flow it goes by `key` (smallest first; None: push order)."""
        cost = _check_cost(cost)
        q = self._queues.setdefault(flow, [])
        if not q:
            self.arbiter.backlogged(flow)
        seq = next(self._seq)
        heapq.heappush(q, (seq if key is None else key, seq, item, cost))

    def pop(self) -> tuple[Hashable, Any] | None:
        """The next item to release and its flow; None when nothing waits."""
        flow = self.arbiter.choose(lambda f: self._queues[f][0][3])
        if flow is None:
            return None
        q = self._queues[flow]
        item = heapq.heappop(q)[2]
        if not q:
            self.arbiter.emptied(flow)
        return flow, item

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())


class DeficitRoundRobin(HeapFlows):
    """DRR over per-flow heaps (see `DrrArbiter`)."""

    def __init__(self, weights: Mapping[Hashable, float], **options: Any) -> None:
        """`options`: DrrArbiter's (quantum, protected, boost, default_weight)."""
        self.drr = DrrArbiter(weights, **options)
        super().__init__(self.drr)

    @property
    def congestion(self) -> float:
        """The load signal in force, in [0, 1]."""
        return self.drr.congestion.level

    def set_congestion(self, level: float) -> None:
        """The load signal in [0, 1] (0: calm); it scales the protected flows' weights."""
        self.drr.congestion.set(level)

    def weight(self, flow: Hashable) -> float:
        """The flow's weight in force now."""
        return self.drr.weight(flow)


class FairQueue(HeapFlows):
    """Start-time fair queueing over per-flow heaps (see `FairArbiter`)."""

    def __init__(self, weights: Mapping[Hashable, float], *, default_weight: float = 1.0) -> None:
        super().__init__(FairArbiter(weights, default_weight=default_weight))

    @property
    def released_cost(self) -> dict[Hashable, float]:
        """Cost released per flow so far."""
        return {n: f.released_cost for n, f in self.flows.items() if f.released}


@dataclass(slots=True)
class _Served:
    admitted: float = 0.0  # exponentially weighted admitted cost (cost units)
    at_s: float = -math.inf
    debt: float = 0.0  # cost owed to the flows admitted on its account
    transfers_in: int = 0  # its queries admitted though the rule refused them
    transfers_out: int = 0  # its queries refused though the rule admitted them
    refused: int = 0  # its queries the rule refused and the share did not save


@dataclass
class AdmissionShare:
    """Who carries the admission rule's refusals (beyond the paper; see the module doc).

    Each flow's admitted cost is weighted over `window_s` (exponentially, time constant
    window_s); a flow is served by that sum over its weight. `decide` takes the rule's
    verdict on one query and returns whether it enters.
    """

    weights: Mapping[Hashable, float]
    window_s: float = 10.0
    default_weight: float = 1.0
    flows: dict[Hashable, _Served] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise PolicyValueError(f"allocation share_window_s: must be > 0, got {self.window_s}")
        _check_weight("default", self.default_weight)
        for f, w in self.weights.items():
            _check_weight(f, w)

    def weight(self, flow: Hashable) -> float:
        """The flow's configured weight (the default for one not configured)."""
        return float(self.weights.get(flow, self.default_weight))

    def _state(self, flow: Hashable, now_s: float) -> _Served:
        s = self.flows.get(flow)
        if s is None:
            s = self.flows[flow] = _Served(at_s=now_s)
        elif now_s > s.at_s:
            s.admitted *= math.exp(-(now_s - s.at_s) / self.window_s)
            s.at_s = now_s
        return s

    def served(self, flow: Hashable, now_s: float) -> float:
        """The flow's recent admitted cost per unit of weight."""
        return self._state(flow, now_s).admitted / self.weight(flow)

    def decide(self, flow: Hashable, cost: float, rule_admits: bool, now_s: float) -> bool:
        """Whether a query of `flow` costing `cost` enters, given the rule's verdict."""
        cost = _check_cost(cost)
        me = self._state(flow, now_s)
        if rule_admits:
            if me.debt > 0.0:
                # Refused in place of a query of another flow the rule had refused.
                me.debt = max(me.debt - cost, 0.0)
                me.transfers_out += 1
                return False
            me.admitted += cost
            return True
        mine = (me.admitted + cost) / self.weight(flow)
        heavy, most = None, mine
        for other in self.flows:
            if other != flow:
                served = self.served(other, now_s)
                if served > most:
                    heavy, most = other, served
        if heavy is None:
            me.refused += 1
            return False
        h = self.flows[heavy]
        # At most one window's worth of its own admitted work is owed at a time.
        h.debt = min(h.debt + cost, h.admitted)
        me.admitted += cost
        me.transfers_in += 1
        return True

    def snapshot(self, now_s: float) -> dict[str, dict[str, float]]:
        """Per flow: weight, recent admitted cost, debt, transfers in and out, refusals."""
        out: dict[str, dict[str, float]] = {}
        for name in list(self.flows):
            s = self._state(name, now_s)
            out[str(name)] = {
                "weight": self.weight(name),
                "recent_admitted_cost": s.admitted,
                "debt": s.debt,
                "admitted_for_share": s.transfers_in,
                "refused_for_share": s.transfers_out,
                "refused": s.refused,
            }
        return out
