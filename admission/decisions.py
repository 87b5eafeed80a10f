"""What admission control decides on, and what it answers (TailGuard §III.D).

Plain types shared by the rules (`admission.rules`), the controller and the gate: the rule
names (`Rule`, the config enum), the load signals a rule may read (`Signal`), one query as
admission sees it (`QueryInfo`), the load at decision time (`Pressure`) and the answer
(`Decision`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

__all__ = ["Action", "Decision", "Pressure", "QueryInfo", "Rule", "Signal"]


class Rule(StrEnum):
    """Which queries admission control turns away under overload ([admission] rule)."""

    NONE = "none"
    REJECT_ALL = "reject-all"
    LOWEST_CLASS_FIRST = "lowest-class-first"
    LARGEST_FANOUT_FIRST = "largest-fanout-first"
    COST_LADDER = "cost-ladder"
    THROTTLE = "throttle"
    PREDICTIVE = "predictive"


class Signal(StrEnum):
    """A load signal a rule reads. A shell computes only the signals its rule declares."""

    MISS_RATIO = "miss_ratio"
    """The windowed task deadline-miss ratio (TailGuard §III.D); kept by the gate itself."""
    QUEUE_PRESSURE = "queue_pressure"
    """Tasks waiting beyond the servers' slots, per slot; supplied by the shell."""
    TAIL_RATIO = "tail_ratio"
    """Worst recent p-th query latency over its SLO; kept by the gate from answered queries."""
    WAIT = "wait"
    """The query's predicted chance to meet its SLO from its targets' queue-wait estimates
    (QueryInfo.meet_prob and wait_ms, `admission.waiting`); supplied by the shell."""


class Action(StrEnum):
    """What the gateway does with the query."""

    ADMIT = "admit"
    REJECT = "reject"
    DEFER = "defer"


@dataclass(frozen=True, slots=True)
class QueryInfo:
    """What admission knows of one query."""

    cls: str
    priority: int  # smaller = more protected class (0 = most protected)
    fanout: int  # k_f: tasks the query spawns
    slo_ms: float  # x_p^SLO of its class
    unloaded_ms: float  # x_p^u(k_f): its unloaded p-th latency (TailGuard eq. 2)
    waited_s: float = 0.0  # time the gateway already held it on earlier DEFER decisions
    percentile: float = 99.0  # p of its class: the share of queries that must meet the SLO
    meet_prob: float = 1.0  # Signal.WAIT: predicted P(query latency <= SLO), admission.waiting
    wait_ms: float = 0.0  # Signal.WAIT: estimated mean queue wait at its busiest target
    cost_hint_ms: float | None = None  # the client's own cost estimate (ms of server time)

    def after(self, defer_s: float) -> QueryInfo:
        """The same query, put again after being held `defer_s` more."""
        return replace(self, waited_s=self.waited_s + defer_s)


@dataclass(frozen=True, slots=True)
class Decision:
    """Admission's answer for one query."""

    action: Action
    reason: str  # short machine code, e.g. "miss_ratio_above_threshold"
    severity: float = 0.0  # miss_ratio / threshold, or the cost-ladder severity score
    defer_s: float = 0.0  # for DEFER: how long the gateway may hold it before deciding again
    wait_ms: float = 0.0  # predictive rule: the estimated queue wait that decided it
    retry_after_s: float = 0.0  # REJECT: when a retry may be admitted (0: no estimate)


@dataclass(frozen=True, slots=True)
class Pressure:
    """What the gate knows of the load at decision time."""

    miss_ratio: float  # overall windowed task deadline-miss ratio
    class_miss_ratio: dict[str, float] = field(default_factory=dict)  # informational
    queue_pressure: float = 0.0  # e.g. queued tasks / (servers * slots); 0 = empty
    tail_ratio: float = 0.0  # worst recent p-th latency / SLO over classes; 1.0 = at SLO
