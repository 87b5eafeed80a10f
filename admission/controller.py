"""Query admission control: admit, reject or defer each new query (TailGuard §III.D).

Rules (`Rule`):

- ``none``: admit everything.
- ``reject-all`` (TailGuard §III.D): once the windowed task deadline-miss ratio exceeds
  R_cth^U (`threshold`), reject every new query until it falls back below the threshold. The
  optional `release_threshold` (default: the threshold itself, as in the paper) adds hysteresis.
- ``lowest-class-first`` (beyond the paper): above the threshold reject only the least
  protected class; each further ``ladder_step`` * threshold of miss ratio rejects the next
  class up; the most protected class (smallest priority) is never rejected.
- ``largest-fanout-first`` (beyond the paper): above the threshold reject queries whose fanout
  is at least a cut; the cut starts at the largest fanout seen recently and moves down one
  distinct fanout per ``ladder_step``. Class-blind, as its name says.
- ``throttle`` (beyond the paper): admit each new query with probability p, where p follows
  an integral controller that holds the windowed miss ratio at R_cth^U; see
  `admission.throttle`. Class-blind, like reject-all, but never all-or-nothing.
- ``cost-ladder`` (client-side-scheduling §3.1, overload control): a severity score climbs
  progressive rungs: defer → reject the costliest queries → reject classes, least protected
  first; the most protected class is never rejected nor deferred. See `CostLadder`.

Errors::

    AdmissionError               base of every error the admission package raises
     └── PolicyValueError        a policy built or called with a bad value (also a ValueError);
                                 the message names the setting and quotes the value

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "Action",
    "AdmissionController",
    "AdmissionError",
    "CostLadder",
    "Decision",
    "PolicyValueError",
    "Pressure",
    "QueryInfo",
    "Rule",
]


class AdmissionError(Exception):
    """Base of every error the admission package raises."""


class PolicyValueError(AdmissionError, ValueError):
    """A policy was built or called with a bad value; the message quotes it."""


class Rule(StrEnum):
    """Which queries admission control turns away under overload."""

    NONE = "none"
    REJECT_ALL = "reject-all"
    LOWEST_CLASS_FIRST = "lowest-class-first"
    LARGEST_FANOUT_FIRST = "largest-fanout-first"
    COST_LADDER = "cost-ladder"
    THROTTLE = "throttle"


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


@dataclass(frozen=True, slots=True)
class Decision:
    """Admission's answer for one query."""

    action: Action
    reason: str  # short machine code, e.g. "miss_ratio_above_threshold"
    severity: float = 0.0  # miss_ratio / threshold, or the cost-ladder severity score
    defer_s: float = 0.0  # for DEFER: how long the gateway may hold it before deciding again


@dataclass(frozen=True, slots=True)
class Pressure:
    """What the gateway knows of the load at decision time."""

    miss_ratio: float  # overall windowed task deadline-miss ratio
    class_miss_ratio: dict[str, float] = field(default_factory=dict)  # informational
    queue_pressure: float = 0.0  # e.g. queued tasks / (servers * slots); 0 = empty
    tail_ratio: float = 0.0  # worst recent p-th latency / SLO over classes; 1.0 = at SLO


@dataclass(frozen=True, slots=True)
class CostLadder:
    """Severity score and rungs of the overload cost ladder (client-side-scheduling §3.1).

    severity = w_miss * miss_ratio / threshold + w_queue * queue_pressure + w_tail * tail_ratio

    The paper's form is w_load * provider_load + w_queue * queue_pressure + w_tail * tail_ratio
    and gives no weights. Our provider-load signal is TailGuard's miss ratio normalised by R_cth^U
    (1.0 = at the threshold). Weights are ours: the miss ratio at R_cth^U alone gives 0.5 (past
    the defer rung, just before TailGuard's own reject-all would fire); the tail at its SLO alone
    gives 0.3; all three signals at their limits give 1.0 (past every rung). The rung thresholds
    0.45 / 0.65 / 0.80 are the paper's.
    """

    w_miss: float = 0.5
    w_queue: float = 0.2
    w_tail: float = 0.3
    defer_at: float = 0.45  # severity >= this: DEFER queries of unprotected classes
    reject_costliest_at: float = 0.65  # >= this: REJECT the costliest queries
    reject_class_at: float = 0.80  # >= this: REJECT the least protected class outright
    class_step: float = 0.15  # each further step rejects the next class up (beyond the paper)
    costliest_fraction: float = 0.1  # "costliest" = among the top 10% of recent query costs
    defer_slack_fraction: float = 0.5  # a deferral spends at most this part of the SLO slack

    def __post_init__(self) -> None:
        for name in ("w_miss", "w_queue", "w_tail"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PolicyValueError(f"cost ladder {name}: must be >= 0, got {value!r}")
        if not 0 < self.defer_at <= self.reject_costliest_at <= self.reject_class_at:
            raise PolicyValueError(
                "cost ladder rungs: need 0 < defer_at <= reject_costliest_at <= reject_class_at, "
                f"got {self.defer_at!r}, {self.reject_costliest_at!r}, {self.reject_class_at!r}"
            )
        if not self.class_step > 0:
            raise PolicyValueError(f"cost ladder class_step: must be > 0, got {self.class_step!r}")
        if not 0 < self.costliest_fraction <= 1:
            raise PolicyValueError(
                "cost ladder costliest_fraction: must be in (0, 1], "
                f"got {self.costliest_fraction!r}"
            )
        if not 0 <= self.defer_slack_fraction <= 1:
            raise PolicyValueError(
                "cost ladder defer_slack_fraction: must be in [0, 1], "
                f"got {self.defer_slack_fraction!r}"
            )

    def severity(self, p: Pressure, threshold: float) -> float:
        """The severity score of the docstring; negative signals count as 0."""
        return (
            self.w_miss * max(0.0, p.miss_ratio) / threshold
            + self.w_queue * max(0.0, p.queue_pressure)
            + self.w_tail * max(0.0, p.tail_ratio)
        )

    def classes_rejected(self, severity: float) -> int:
        """How many classes, least protected first, the class rung rejects at this severity."""
        if severity < self.reject_class_at:
            return 0
        # 1e-9: 0.95 - 0.80 is 0.1499999999999999 in floats, and must reach the 0.15 step.
        return 1 + math.floor((severity - self.reject_class_at) / self.class_step + 1e-9)


class _RecentValues:
    """The last `size` values, kept sorted too, for quantiles and distinct-value cuts."""

    __slots__ = ("_order", "_size", "_sorted")

    def __init__(self, size: int) -> None:
        self._size = size
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        """Remember a value, forgetting the oldest beyond `size`."""
        if len(self._order) == self._size:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def top_cut(self, fraction: float) -> float:
        """Smallest of the top `fraction` of remembered values, at least one (needs one)."""
        values = self._sorted
        # 1e-9: (1 - 0.7) * 10 is 3.0000000000000004 in floats, and must stay 3.
        top = max(1, math.ceil(fraction * len(values) - 1e-9))
        return values[len(values) - min(top, len(values))]

    def nth_largest_distinct(self, n: int) -> float:
        """The n-th largest distinct value (n >= 1), or the smallest one when fewer exist."""
        values = self._sorted
        value = values[-1]
        for _ in range(n - 1):
            below = bisect.bisect_left(values, value)
            if below == 0:
                break
            value = values[below - 1]
        return value


class AdmissionController:
    """Decides admit / reject / defer per query from the miss ratio and load (TailGuard §III.D)."""

    def __init__(
        self,
        *,
        rule: Rule | str = Rule.REJECT_ALL,
        threshold: float = 0.017,
        classes: Sequence[str] | None = None,
        max_defer_s: float = 0.5,
        release_threshold: float | None = None,
        ladder_step: float = 0.5,
        ladder: CostLadder | None = None,
        memory_queries: int = 1000,
        history: int = 100,
        throttle_interval_s: float = 0.05,
        throttle_gain: float = 0.5,
        throttle_min_fraction: float = 0.02,
        seed: int | None = None,
    ) -> None:
        self.rule = _parse_rule(rule)
        if not (0 < threshold <= 1):
            raise PolicyValueError(f"admission threshold: must be in (0, 1], got {threshold!r}")
        release = threshold if release_threshold is None else release_threshold
        if not (0 < release <= threshold):
            raise PolicyValueError(
                f"admission release_threshold: must be in (0, threshold={threshold!r}], "
                f"got {release_threshold!r}"
            )
        if not (max_defer_s >= 0 and math.isfinite(max_defer_s)):
            raise PolicyValueError(f"admission max_defer_s: must be >= 0, got {max_defer_s!r}")
        if not (ladder_step > 0 and math.isfinite(ladder_step)):
            raise PolicyValueError(f"admission ladder_step: must be > 0, got {ladder_step!r}")
        for name, value in (("memory_queries", memory_queries), ("history", history)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PolicyValueError(f"admission {name}: must be an int >= 1, got {value!r}")
        names = list(classes or ())
        if len(set(names)) != len(names):
            raise PolicyValueError(f"admission classes: names repeat in {names!r}")
        self.threshold = threshold  # R_cth^U
        self.release_threshold = release
        self.max_defer_s = max_defer_s
        self.ladder_step = ladder_step
        self.ladder = ladder or CostLadder()
        # Configured classes, most protected first, start at priority = their index; the
        # priority a query carries is authoritative and replaces it.
        self.class_priority: dict[str, int] = {name: i for i, name in enumerate(names)}
        self.overloaded = False
        self.overloaded_since: float | None = None
        self.counts: Counter[tuple[str, str]] = Counter()  # every decision, by (cls, reason)
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.deferred: Counter[tuple[str, str]] = Counter()
        self._fanouts = _RecentValues(memory_queries)
        self._costs = _RecentValues(memory_queries)
        self._history: deque[dict] = deque(maxlen=history)
        from admission.throttle import AdmitThrottle  # throttle imports this module's errors

        self.throttle = AdmitThrottle(
            threshold,
            interval_s=throttle_interval_s,
            gain=throttle_gain,
            min_fraction=throttle_min_fraction,
        )
        self._rng = random.Random(seed)

    def decide(self, q: QueryInfo, p: Pressure, now: float) -> Decision:
        """Admit, reject or defer one new query, and count the decision."""
        self.class_priority[q.cls] = q.priority
        self._fanouts.add(q.fanout)
        self._costs.add(_cost_ms(q))
        if self.rule is Rule.NONE:
            decision = Decision(Action.ADMIT, "admission_off")
        elif self.rule is Rule.COST_LADDER:
            decision = self._cost_ladder(q, p)
        elif self.rule is Rule.THROTTLE:
            decision = self._throttle(p, now)
        else:
            decision = self._miss_ratio_rule(q, p, now)
        self._count(q, decision, now)
        return decision

    def snapshot(self, now: float) -> dict:
        """Rule, thresholds, overload state, counters per (class, reason), recent decisions."""
        counts: dict[str, dict[str, int]] = {}
        for (cls, reason), n in sorted(self.counts.items()):
            counts.setdefault(cls, {})[reason] = n
        return {
            "now": now,
            "rule": str(self.rule),
            "threshold": self.threshold,
            "release_threshold": self.release_threshold,
            "ladder_step": self.ladder_step,
            "max_defer_s": self.max_defer_s,
            "cost_ladder": {
                "w_miss": self.ladder.w_miss,
                "w_queue": self.ladder.w_queue,
                "w_tail": self.ladder.w_tail,
                "defer_at": self.ladder.defer_at,
                "reject_costliest_at": self.ladder.reject_costliest_at,
                "reject_class_at": self.ladder.reject_class_at,
                "class_step": self.ladder.class_step,
                "costliest_fraction": self.ladder.costliest_fraction,
            },
            "admit_fraction": self.throttle.p if self.rule is Rule.THROTTLE else None,
            "overloaded": self.overloaded,
            "overloaded_since": self.overloaded_since,
            "classes": dict(sorted(self.class_priority.items(), key=lambda kv: (kv[1], kv[0]))),
            "counts": counts,
            "rejected": sum(self.rejected.values()),
            "deferred": sum(self.deferred.values()),
            "decisions": list(self._history),
        }

    # -- rules --------------------------------------------------------------------------------

    def _miss_ratio_rule(self, q: QueryInfo, p: Pressure, now: float) -> Decision:
        severity = p.miss_ratio / self.threshold
        # TailGuard §III.D: reject when the ratio exceeds R_cth^U, "till the ratio falls back
        # below the threshold again" (here: below release_threshold, = threshold by default).
        if not self.overloaded and p.miss_ratio > self.threshold:
            self.overloaded = True
            self.overloaded_since = now
        elif self.overloaded and p.miss_ratio < self.release_threshold:
            self.overloaded = False
            self.overloaded_since = None
        if not self.overloaded:
            return Decision(Action.ADMIT, "below_threshold", severity)
        if self.rule is Rule.REJECT_ALL:
            return Decision(Action.REJECT, "miss_ratio_above_threshold", severity)
        depth = self._depth(p.miss_ratio)
        if self.rule is Rule.LOWEST_CLASS_FIRST:
            if q.priority <= self._most_protected():
                return Decision(Action.ADMIT, "protected_class", severity)
            if q.priority in self._least_protected(depth):
                return Decision(Action.REJECT, "lowest_class_first", severity)
            return Decision(Action.ADMIT, "class_spared", severity)
        # Largest fanout first: depth 1 cuts at the largest fanout seen recently, each further
        # depth at the next smaller distinct fanout, down to the smallest (= reject all).
        if q.fanout >= self._fanouts.nth_largest_distinct(depth):
            return Decision(Action.REJECT, "largest_fanout_first", severity)
        return Decision(Action.ADMIT, "fanout_below_cut", severity)

    def _throttle(self, p: Pressure, now: float) -> Decision:
        severity = p.miss_ratio / self.threshold
        fraction = self.throttle.update(p.miss_ratio, now)
        overloaded = fraction < 1.0
        if overloaded != self.overloaded:
            self.overloaded = overloaded
            self.overloaded_since = now if overloaded else None
        if self.throttle.admit(self._rng.random()):
            return Decision(Action.ADMIT, "admitted" if overloaded else "below_threshold", severity)
        return Decision(Action.REJECT, "throttled", severity)

    def _cost_ladder(self, q: QueryInfo, p: Pressure) -> Decision:
        ladder = self.ladder
        severity = ladder.severity(p, self.threshold)
        if severity < ladder.defer_at:
            return Decision(Action.ADMIT, "severity_below_ladder", severity)
        # "Short requests are never rejected" (§3.1): here the most protected class.
        if q.priority <= self._most_protected():
            return Decision(Action.ADMIT, "protected_class", severity)
        n_classes = ladder.classes_rejected(severity)
        if n_classes and q.priority in self._least_protected(n_classes):
            return Decision(Action.REJECT, "cost_ladder_reject_class", severity)
        if severity >= ladder.reject_costliest_at and _cost_ms(q) >= self._costs.top_cut(
            ladder.costliest_fraction
        ):
            return Decision(Action.REJECT, "cost_ladder_reject", severity)
        # Deferring spends the query's queueing slack (x_p^SLO - x_p^u(k_f), TailGuard eq. 4), so
        # its deferrals together are bounded by max_defer_s and by a fraction of that slack: a
        # query deferred again and again must not wait out its SLO many times over.
        slack_s = max(0.0, q.slo_ms - q.unloaded_ms) / 1000.0
        defer_s = min(self.max_defer_s, ladder.defer_slack_fraction * slack_s) - q.waited_s
        if defer_s <= 0:
            return Decision(Action.ADMIT, "defer_exhausted", severity)
        return Decision(Action.DEFER, "cost_ladder_defer", severity, defer_s)

    # -- helpers ------------------------------------------------------------------------------

    def _depth(self, miss_ratio: float) -> int:
        """Overload depth: 1 above threshold, +1 above each threshold * (1 + k·ladder_step)."""
        depth = 1
        # At most one step per distinct priority / fanout can change the outcome.
        limit = len(self.class_priority) + len(self._fanouts)
        while depth < limit and miss_ratio > self.threshold * (1 + depth * self.ladder_step):
            depth += 1
        return depth

    def _most_protected(self) -> int:
        return min(self.class_priority.values())

    def _least_protected(self, n: int) -> set[int]:
        """The n least protected priority levels, never the most protected one."""
        levels = sorted(set(self.class_priority.values()), reverse=True)[:-1]
        return set(levels[:n])

    def _count(self, q: QueryInfo, decision: Decision, now: float) -> None:
        key = (q.cls, decision.reason)
        self.counts[key] += 1
        if decision.action is Action.REJECT:
            self.rejected[key] += 1
        elif decision.action is Action.DEFER:
            self.deferred[key] += 1
        self._history.append(
            {
                "time": now,
                "cls": q.cls,
                "fanout": q.fanout,
                "action": str(decision.action),
                "reason": decision.reason,
                "severity": decision.severity,
                "defer_s": decision.defer_s,
            }
        )


def _cost_ms(q: QueryInfo) -> float:
    """Server time a query asks for: fanout * unloaded latency (client-side-scheduling's cost)."""
    return q.fanout * q.unloaded_ms


def _parse_rule(rule: Rule | str) -> Rule:
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str):
        try:
            return Rule(rule.strip().lower().replace("_", "-"))
        except ValueError:
            pass
    valid = ", ".join(repr(r.value) for r in Rule)
    raise PolicyValueError(f"admission rule: unknown {rule!r}, expected one of {valid}")
