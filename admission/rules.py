"""Admission rules: one small class per `Rule`, built by `make_rule` from the config enum.

Each rule declares the load signals it reads (`needs`) and whether it may be skipped while
the miss ratio is low (`clearly_admits`), so no shell compares rule names:

- ``none`` (`AdmitAll`): admit everything.
- ``reject-all`` (`RejectAll`, TailGuard §III.D): once the windowed task deadline-miss ratio
  exceeds R_cth^U (`threshold`), reject every new query "till the ratio falls back below the
  threshold again". The optional `release_threshold` (default: the threshold itself, as in
  the paper) adds hysteresis.
- ``lowest-class-first`` (`LowestClassFirst`, beyond the paper): above the threshold reject
  only the least protected class; each further ``ladder_step`` * threshold of miss ratio
  rejects the next class up; the most protected class (smallest priority) is never rejected.
- ``largest-fanout-first`` (`LargestFanoutFirst`, beyond the paper): above the threshold
  reject queries whose fanout is at least a cut; the cut starts at the largest fanout seen
  recently and moves down one distinct fanout per ``ladder_step``. Class-blind.
- ``throttle`` (`Throttle`, beyond the paper): admit each new query with probability p, where
  p follows an integral controller that holds the windowed miss ratio at R_cth^U; see
  `admission.throttle`. Class-blind, like reject-all, but never all-or-nothing.
- ``cost-ladder`` (`CostLadderRule`, client-side-scheduling §3.1, overload control): a
  severity score climbs the paper's rungs, acting on cost buckets (short / medium / long /
  extra-long, cut at quantiles of recent query costs): admit → defer long → reject
  extra-long → reject long; the smallest bucket is never rejected nor deferred. The paper's
  comparison rules are the same ladder with ``uniform`` shedding (a share of every query,
  cost-blind) or ``reverse`` shedding (the buckets turned round: the cheapest shed first).
- ``predictive`` (`Predictive`, QLM §6's waiting-time estimator used for admission): reject a
  query whose predicted probability of meeting its SLO, from its targets' estimated queue
  waits (`admission.waiting`), is below the level (default: its class's percentile); a query
  that passes goes on to an optional miss-ratio backstop rule (`predictive_backstop`).

A new rule: a subclass of `AdmissionRule` with its `rule` name, its `needs`, `decide` (and
`clearly_admits` when it may be skipped), a member of `Rule`, and an entry in `_RULES`.

Pure code: time comes in as `now`, random draws from an injected generator.
"""

from __future__ import annotations

import bisect
import math
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from admission.decisions import Action, Decision, Pressure, QueryInfo, Rule, Signal
from admission.errors import PolicyValueError
from admission.throttle import AdmitThrottle

__all__ = [
    "AdmissionRule",
    "AdmitAll",
    "CostLadder",
    "CostLadderRule",
    "LargestFanoutFirst",
    "LowestClassFirst",
    "Predictive",
    "QueryMemory",
    "RejectAll",
    "RuleSettings",
    "Throttle",
    "make_rule",
    "parse_rule",
]


@dataclass(frozen=True, slots=True)
class CostLadder:
    """Severity score, rungs and cost buckets of the overload ladder (client-side-scheduling
    §3.1).

    severity = w_miss * miss_ratio / threshold + w_queue * queue_pressure + w_tail * tail_ratio

    The paper's form is w_load * provider_load + w_queue * queue_pressure + w_tail * tail_ratio
    and gives no weights. Our provider-load signal is TailGuard's miss ratio normalised by R_cth^U
    (1.0 = at the threshold). Weights are ours: the miss ratio at R_cth^U alone gives 0.5 (past
    the defer rung, just before TailGuard's own reject-all would fire); the tail at its SLO alone
    gives 0.3; all three signals at their limits give 1.0 (past every rung). The rung thresholds
    0.45 / 0.65 / 0.80 and the bucket weights medium 0, long 1, extra-long 2 are the paper's; the
    paper buckets requests by predicted tokens, here a query's cost k_f * x_p^u(k_f) is placed
    among the recent queries' costs (`bucket_cuts`, ours).
    """

    w_miss: float = 0.5
    w_queue: float = 0.2
    w_tail: float = 0.3
    defer_at: float = 0.45  # severity >= this: DEFER long and extra-long queries
    reject_xlong_at: float = 0.65  # >= this: REJECT extra-long queries
    reject_long_at: float = 0.80  # >= this: REJECT long queries too
    bucket_cuts: tuple[float, float, float] = (0.5, 0.8, 0.95)
    """Cost rank (share of recent queries costing less) where medium, long and extra-long
    begin; a query's rank counts ties as half below it."""
    shedding: str = "ladder"
    """ladder (the paper's), uniform (a share of every query) or reverse (cheapest first)."""
    defer_slack_fraction: float = 0.5  # a deferral spends at most this part of the SLO slack

    def __post_init__(self) -> None:
        for name in ("w_miss", "w_queue", "w_tail"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PolicyValueError(f"cost ladder {name}: must be >= 0, got {value!r}")
        if not 0 < self.defer_at <= self.reject_xlong_at <= self.reject_long_at:
            raise PolicyValueError(
                "cost ladder rungs: need 0 < defer_at <= reject_xlong_at <= reject_long_at, "
                f"got {self.defer_at!r}, {self.reject_xlong_at!r}, {self.reject_long_at!r}"
            )
        cuts = tuple(self.bucket_cuts)
        if len(cuts) != 3 or not 0 < cuts[0] <= cuts[1] <= cuts[2] <= 1:
            raise PolicyValueError(
                f"cost ladder bucket_cuts: need 0 < medium <= long <= xlong <= 1, got {cuts!r}"
            )
        if self.shedding not in SHEDDING:
            raise PolicyValueError(
                f"cost ladder shedding: must be one of {', '.join(SHEDDING)}, got {self.shedding!r}"
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

    def bucket(self, cost_rank: float) -> int:
        """0 short, 1 medium, 2 long, 3 extra-long, from the query's cost rank."""
        return sum(cost_rank >= cut for cut in self.bucket_cuts)

    def snapshot(self) -> dict[str, Any]:
        """Weights, rungs and buckets, for GET /v1/admission."""
        return {
            "w_miss": self.w_miss,
            "w_queue": self.w_queue,
            "w_tail": self.w_tail,
            "defer_at": self.defer_at,
            "reject_xlong_at": self.reject_xlong_at,
            "reject_long_at": self.reject_long_at,
            "bucket_cuts": list(self.bucket_cuts),
            "shedding": self.shedding,
        }


SHEDDING = ("ladder", "uniform", "reverse")
"""The cost ladder's shedding orders (client-side-scheduling §4.6's comparison)."""
BUCKETS = ("short", "medium", "long", "xlong")


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

    def rank(self, value: float) -> float:
        """Share of remembered values below `value`, ties counted half (needs one)."""
        values = self._sorted
        below = bisect.bisect_left(values, value)
        equal = bisect.bisect_right(values, value) - below
        return (below + 0.5 * equal) / len(values)

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


def cost_ms(q: QueryInfo) -> float:
    """Server time a query asks for: the client's cost hint when it gave one, else fanout *
    unloaded latency (client-side-scheduling's cost prior)."""
    return q.cost_hint_ms if q.cost_hint_ms is not None else q.fanout * q.unloaded_ms


class QueryMemory:
    """What the controller remembers of recent queries, for the rules to read.

    Configured classes, most protected first, start at priority = their index; the priority
    a query carries is authoritative and replaces it.
    """

    __slots__ = ("class_priority", "costs", "fanouts")

    def __init__(self, classes: list[str], memory_queries: int) -> None:
        self.class_priority: dict[str, int] = {name: i for i, name in enumerate(classes)}
        self.fanouts = _RecentValues(memory_queries)
        self.costs = _RecentValues(memory_queries)

    def remember(self, q: QueryInfo) -> None:
        """One query as it is put to the controller."""
        self.class_priority[q.cls] = q.priority
        self.fanouts.add(q.fanout)
        self.costs.add(cost_ms(q))

    def most_protected(self) -> int:
        """The smallest priority known."""
        return min(self.class_priority.values())

    def least_protected(self, n: int) -> set[int]:
        """The n least protected priority levels, never the most protected one."""
        levels = sorted(set(self.class_priority.values()), reverse=True)[:-1]
        return set(levels[:n])


@dataclass(frozen=True, slots=True)
class RuleSettings:
    """Every rule's settings; each rule reads the ones it uses."""

    threshold: float = 0.017
    """R_cth^U."""
    release_threshold: float | None = None
    """Admit again below this (default: threshold)."""
    max_defer_s: float = 0.5
    ladder_step: float = 0.5
    ladder: CostLadder | None = None
    throttle_interval_s: float = 0.05
    throttle_gain: float = 0.5
    throttle_min_fraction: float = 0.02
    predictive_level: float | None = None
    """predictive: admit when P(meet SLO) >= this (None: the query's class percentile / 100)."""
    predictive_backstop: Rule = Rule.NONE
    """predictive: the miss-ratio rule a query that passes the prediction meets next."""

    def __post_init__(self) -> None:
        if self.predictive_level is not None and not 0 < self.predictive_level < 1:
            raise PolicyValueError(
                f"admission predictive_level: must be in (0, 1), got {self.predictive_level!r}"
            )
        backstop = parse_rule(self.predictive_backstop)
        if backstop is Rule.PREDICTIVE:
            raise PolicyValueError("admission predictive_backstop: cannot be 'predictive' itself")
        object.__setattr__(self, "predictive_backstop", backstop)
        if not (0 < self.threshold <= 1):
            raise PolicyValueError(
                f"admission threshold: must be in (0, 1], got {self.threshold!r}"
            )
        if not (0 < self.release <= self.threshold):
            raise PolicyValueError(
                f"admission release_threshold: must be in (0, threshold={self.threshold!r}], "
                f"got {self.release_threshold!r}"
            )
        if not (self.max_defer_s >= 0 and math.isfinite(self.max_defer_s)):
            raise PolicyValueError(f"admission max_defer_s: must be >= 0, got {self.max_defer_s!r}")
        if not (self.ladder_step > 0 and math.isfinite(self.ladder_step)):
            raise PolicyValueError(f"admission ladder_step: must be > 0, got {self.ladder_step!r}")

    @property
    def release(self) -> float:
        """The release threshold in force."""
        return self.threshold if self.release_threshold is None else self.release_threshold


class AdmissionRule(ABC):
    """One admission rule: reads the signals it declares, answers admit / reject / defer."""

    rule: ClassVar[Rule]
    needs: ClassVar[frozenset[Signal]] = frozenset({Signal.MISS_RATIO})
    """The load signals `decide` reads; a shell computes no other."""

    def __init__(self, settings: RuleSettings, rng: random.Random) -> None:
        self.settings = settings
        self.rng = rng
        self.overloaded = False
        self.overloaded_since: float | None = None

    def clearly_admits(self, miss_ratio: float) -> bool:
        """True when this rule would admit any query now without learning from it, so the
        shell may skip building its inputs (the common case, decided cheaply). By default:
        not in overload and the miss ratio at or below the release threshold."""
        return not self.overloaded and miss_ratio <= self.settings.release

    @abstractmethod
    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        """Admit, reject or defer one query."""

    def snapshot(self) -> dict[str, Any]:
        """Rule-specific state for GET /v1/admission."""
        return {}

    def _set_overloaded(self, overloaded: bool, now: float) -> None:
        if overloaded != self.overloaded:
            self.overloaded = overloaded
            self.overloaded_since = now if overloaded else None


class AdmitAll(AdmissionRule):
    """``none``: admission off."""

    rule = Rule.NONE
    needs = frozenset()

    def clearly_admits(self, miss_ratio: float) -> bool:
        return True

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        return Decision(Action.ADMIT, "admission_off")


class _MissRatioRule(AdmissionRule):
    """Shared by the rules on R_cth^U with hysteresis (TailGuard §III.D)."""

    def _overload(self, p: Pressure, now: float) -> float:
        """Step the overload state on the miss ratio; return the severity."""
        s = self.settings
        # TailGuard §III.D: reject when the ratio exceeds R_cth^U, "till the ratio falls back
        # below the threshold again" (here: below release_threshold, = threshold by default).
        if not self.overloaded and p.miss_ratio > s.threshold:
            self._set_overloaded(True, now)
        elif self.overloaded and p.miss_ratio < s.release:
            self._set_overloaded(False, now)
        return p.miss_ratio / s.threshold

    def _depth(self, miss_ratio: float, memory: QueryMemory) -> int:
        """Overload depth: 1 above threshold, +1 above each threshold * (1 + k·ladder_step)."""
        s = self.settings
        depth = 1
        # At most one step per distinct priority / fanout can change the outcome.
        limit = len(memory.class_priority) + len(memory.fanouts)
        while depth < limit and miss_ratio > s.threshold * (1 + depth * s.ladder_step):
            depth += 1
        return depth


class RejectAll(_MissRatioRule):
    """``reject-all``: TailGuard §III.D's rule."""

    rule = Rule.REJECT_ALL

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        severity = self._overload(p, now)
        if not self.overloaded:
            return Decision(Action.ADMIT, "below_threshold", severity)
        return Decision(Action.REJECT, "miss_ratio_above_threshold", severity)


class LowestClassFirst(_MissRatioRule):
    """``lowest-class-first``: reject the least protected classes first (beyond the paper)."""

    rule = Rule.LOWEST_CLASS_FIRST

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        severity = self._overload(p, now)
        if not self.overloaded:
            return Decision(Action.ADMIT, "below_threshold", severity)
        if q.priority <= memory.most_protected():
            return Decision(Action.ADMIT, "protected_class", severity)
        if q.priority in memory.least_protected(self._depth(p.miss_ratio, memory)):
            return Decision(Action.REJECT, "lowest_class_first", severity)
        return Decision(Action.ADMIT, "class_spared", severity)


class LargestFanoutFirst(_MissRatioRule):
    """``largest-fanout-first``: reject the largest fanouts first (beyond the paper).

    It learns the fanouts it sees from every query, so it is always asked."""

    rule = Rule.LARGEST_FANOUT_FIRST

    def clearly_admits(self, miss_ratio: float) -> bool:
        return False

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        severity = self._overload(p, now)
        if not self.overloaded:
            return Decision(Action.ADMIT, "below_threshold", severity)
        # Depth 1 cuts at the largest fanout seen recently, each further depth at the next
        # smaller distinct fanout, down to the smallest (= reject all).
        if q.fanout >= memory.fanouts.nth_largest_distinct(self._depth(p.miss_ratio, memory)):
            return Decision(Action.REJECT, "largest_fanout_first", severity)
        return Decision(Action.ADMIT, "fanout_below_cut", severity)


class Throttle(AdmissionRule):
    """``throttle``: admit a fraction p that holds the miss ratio at R_cth^U (beyond the paper)."""

    rule = Rule.THROTTLE

    def __init__(self, settings: RuleSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        self.throttle = AdmitThrottle(
            settings.threshold,
            interval_s=settings.throttle_interval_s,
            gain=settings.throttle_gain,
            min_fraction=settings.throttle_min_fraction,
        )

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        severity = p.miss_ratio / self.settings.threshold
        fraction = self.throttle.update(p.miss_ratio, now)
        overloaded = fraction < 1.0
        self._set_overloaded(overloaded, now)
        if self.throttle.admit(self.rng.random()):
            return Decision(Action.ADMIT, "admitted" if overloaded else "below_threshold", severity)
        return Decision(Action.REJECT, "throttled", severity)

    def snapshot(self) -> dict[str, Any]:
        return {"admit_fraction": self.throttle.p}


class CostLadderRule(AdmissionRule):
    """``cost-ladder``: client-side-scheduling §3.1's overload control on cost buckets.

    It weighs queue pressure and tails besides the miss ratio and learns query costs from
    every query, so it is always asked."""

    rule = Rule.COST_LADDER
    needs = frozenset({Signal.MISS_RATIO, Signal.QUEUE_PRESSURE, Signal.TAIL_RATIO})

    def __init__(self, settings: RuleSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        self.ladder = settings.ladder or CostLadder()

    def clearly_admits(self, miss_ratio: float) -> bool:
        return False

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        ladder = self.ladder
        severity = ladder.severity(p, self.settings.threshold)
        self._set_overloaded(severity >= ladder.defer_at, now)
        if severity < ladder.defer_at:
            return Decision(Action.ADMIT, "severity_below_ladder", severity)
        if ladder.shedding == "uniform":
            # Cost-blind: a share of every query, growing from the defer rung to the last,
            # never all of them: like the throttle's floor, the admitted few keep the
            # severity's signals (miss ratio, tails) fresh, or it could never fall again.
            span = max(ladder.reject_long_at - ladder.defer_at, 1e-9)
            ceiling = 1.0 - self.settings.throttle_min_fraction
            share = min((severity - ladder.defer_at) / span, ceiling)
            if self.rng.random() < share:
                return Decision(Action.REJECT, "uniform_shed", severity)
            return Decision(Action.ADMIT, "uniform_spared", severity)
        bucket = ladder.bucket(memory.costs.rank(cost_ms(q)))
        if ladder.shedding == "reverse":
            bucket = len(BUCKETS) - 1 - bucket  # stress-reversed: the cheapest shed first
        if bucket == 0:
            # "Short requests are never rejected" (§3.1): the smallest cost bucket.
            return Decision(Action.ADMIT, "smallest_bucket", severity)
        weight = bucket - 1  # the paper's bucket weights: medium 0, long 1, extra-long 2
        if weight >= 1 and severity >= ladder.reject_long_at:
            return Decision(Action.REJECT, "cost_ladder_reject_long", severity)
        if weight >= 2 and severity >= ladder.reject_xlong_at:
            return Decision(Action.REJECT, "cost_ladder_reject_xlong", severity)
        if weight == 0:
            return Decision(Action.ADMIT, "medium_bucket", severity)
        # Deferring spends the query's queueing slack (x_p^SLO - x_p^u(k_f), TailGuard eq. 4),
        # so its deferrals together are bounded by max_defer_s and by a fraction of what is
        # left of that slack: a query deferred again and again must not wait out its SLO.
        slack_s = max(0.0, q.slo_ms - q.unloaded_ms) / 1000.0
        defer_s = min(self.settings.max_defer_s, ladder.defer_slack_fraction * slack_s) - q.waited_s
        if defer_s <= 0:
            return Decision(Action.ADMIT, "defer_exhausted", severity)
        return Decision(Action.DEFER, "cost_ladder_defer", severity, defer_s)


class Predictive(AdmissionRule):
    """``predictive``: admit a query only if it is predicted to meet its SLO.

    TailGuard's admission (§III.D) reacts to misses that have already happened; this rule
    acts before dispatch, on QLM's waiting-time estimate (§6) of every target: the shell
    puts P(query latency <= SLO) in `QueryInfo.meet_prob` (`admission.waiting`), and a query
    below the level is rejected with the estimated wait and a retry time. The level defaults
    to the class's own percentile: a class that asks p% of its queries to meet the SLO
    admits a query only when it is predicted to meet it with probability p%. A query that
    passes goes on to the backstop rule (e.g. ``reject-all``), whose miss-ratio signal
    catches what the estimate gets wrong. Beyond the paper: QLM reorders and evicts instead
    of rejecting.
    """

    rule = Rule.PREDICTIVE

    def __init__(self, settings: RuleSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        self.backstop = make_rule(settings.predictive_backstop, settings, rng)
        self.needs = frozenset({Signal.WAIT}) | self.backstop.needs  # type: ignore[misc]
        self.predicted_rejects = 0

    def clearly_admits(self, miss_ratio: float) -> bool:
        return False  # the prediction is per query: it is always asked

    def decide(self, q: QueryInfo, p: Pressure, now: float, memory: QueryMemory) -> Decision:
        level = self.settings.predictive_level
        if level is None:
            level = q.percentile / 100.0
        if q.meet_prob < level:
            self.predicted_rejects += 1
            self._set_overloaded(True, now)
            # Retry once the busiest target's backlog has drained to the query's queueing
            # budget (SLO - x_p^u, TailGuard eq. 4), new arrivals aside: a lower bound.
            retry_s = max(q.wait_ms - max(q.slo_ms - q.unloaded_ms, 0.0), 0.0) / 1000.0
            return Decision(
                Action.REJECT, "predicted_miss", 1.0 - q.meet_prob, 0.0, q.wait_ms, retry_s
            )
        d = self.backstop.decide(q, p, now, memory)
        self._set_overloaded(self.backstop.overloaded, now)
        if d.action is Action.ADMIT:
            return Decision(Action.ADMIT, "predicted_meet", 1.0 - q.meet_prob, 0.0, q.wait_ms)
        return d

    def snapshot(self) -> dict[str, Any]:
        return {
            "predictive_level": self.settings.predictive_level,
            "predictive_backstop": str(self.backstop.rule),
            "predicted_rejects": self.predicted_rejects,
            **self.backstop.snapshot(),
        }


_RULES: dict[Rule, type[AdmissionRule]] = {
    cls.rule: cls
    for cls in (
        AdmitAll,
        RejectAll,
        LowestClassFirst,
        LargestFanoutFirst,
        Throttle,
        CostLadderRule,
        Predictive,
    )
}
assert set(_RULES) == set(Rule), "every Rule needs its class"


def parse_rule(rule: Rule | str) -> Rule:
    """The `Rule` a name stands for (case and _ or - forgiven); PolicyValueError lists them."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str):
        try:
            return Rule(rule.strip().lower().replace("_", "-"))
        except ValueError:
            pass
    valid = ", ".join(repr(r.value) for r in Rule)
    raise PolicyValueError(f"admission rule: unknown {rule!r}, expected one of {valid}")


def make_rule(rule: Rule | str, settings: RuleSettings, rng: random.Random) -> AdmissionRule:
    """The rule object a config's `rule` names."""
    return _RULES[parse_rule(rule)](settings, rng)
