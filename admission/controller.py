"""Query admission control: admit, reject or defer each new query (TailGuard §III.D).

`AdmissionController` keeps what every rule shares (the classes and their priorities, the
recent fanouts and costs, the decision counters and history) and hands each query to the
rule object the config names (`admission.rules`: one class per `Rule`). The gate
(`admission.gate`) puts queries to it with the load signals the rule declares.

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Sequence

from admission.decisions import Action, Decision, Pressure, QueryInfo, Rule, Signal
from admission.errors import PolicyValueError
from admission.rules import (
    AdmissionRule,
    CostLadder,
    Predictive,
    QueryMemory,
    RuleSettings,
    Throttle,
    make_rule,
)
from admission.throttle import AdmitThrottle

__all__ = ["AdmissionController"]


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
        predictive_level: float | None = None,
        predictive_backstop: Rule | str = Rule.NONE,
        seed: int | None = None,
    ) -> None:
        settings = RuleSettings(
            threshold=threshold,
            release_threshold=release_threshold,
            max_defer_s=max_defer_s,
            ladder_step=ladder_step,
            ladder=ladder or CostLadder(),
            throttle_interval_s=throttle_interval_s,
            throttle_gain=throttle_gain,
            throttle_min_fraction=throttle_min_fraction,
            predictive_level=predictive_level,
            predictive_backstop=predictive_backstop,  # type: ignore[arg-type]
        )
        for name, value in (("memory_queries", memory_queries), ("history", history)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PolicyValueError(f"admission {name}: must be an int >= 1, got {value!r}")
        names = list(classes or ())
        if len(set(names)) != len(names):
            raise PolicyValueError(f"admission classes: names repeat in {names!r}")
        self.policy: AdmissionRule = make_rule(rule, settings, random.Random(seed))
        self.settings = settings
        self.memory = QueryMemory(names, memory_queries)
        self.counts: Counter[tuple[str, str]] = Counter()  # every decision, by (cls, reason)
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.deferred: Counter[tuple[str, str]] = Counter()
        self._history: deque[dict] = deque(maxlen=history)

    @property
    def rule(self) -> Rule:
        """The rule in force."""
        return self.policy.rule

    @property
    def needs(self) -> frozenset[Signal]:
        """The load signals the rule reads."""
        return self.policy.needs

    @property
    def threshold(self) -> float:
        """R_cth^U."""
        return self.settings.threshold

    @property
    def release_threshold(self) -> float:
        """Admit again below this."""
        return self.settings.release

    @property
    def overloaded(self) -> bool:
        """Whether the rule is turning queries away (or throttling) now."""
        return self.policy.overloaded

    @property
    def overloaded_since(self) -> float | None:
        """When the current overload began."""
        return self.policy.overloaded_since

    @property
    def throttle(self) -> AdmitThrottle | None:
        """The throttle rule's admitted-fraction controller (None under the other rules)."""
        policy = self.policy
        if isinstance(policy, Predictive):
            policy = policy.backstop
        return policy.throttle if isinstance(policy, Throttle) else None

    @property
    def class_priority(self) -> dict[str, int]:
        """Known classes and their priorities."""
        return self.memory.class_priority

    def clearly_admits(self, miss_ratio: float) -> bool:
        """True when the rule would admit any query now without learning from it."""
        return self.policy.clearly_admits(miss_ratio)

    def decide(self, q: QueryInfo, p: Pressure, now: float) -> Decision:
        """Admit, reject or defer one new query, and count the decision."""
        self.memory.remember(q)
        decision = self.policy.decide(q, p, now, self.memory)
        self._count(q, decision, now)
        return decision

    def snapshot(self, now: float) -> dict:
        """Rule, thresholds, overload state, counters per (class, reason), recent decisions."""
        counts: dict[str, dict[str, int]] = {}
        for (cls, reason), n in sorted(self.counts.items()):
            counts.setdefault(cls, {})[reason] = n
        s = self.settings
        return {
            "now": now,
            "rule": str(self.rule),
            "threshold": s.threshold,
            "release_threshold": s.release,
            "ladder_step": s.ladder_step,
            "max_defer_s": s.max_defer_s,
            "cost_ladder": (s.ladder or CostLadder()).snapshot(),
            "admit_fraction": self.policy.snapshot().get("admit_fraction"),
            "overloaded": self.overloaded,
            "overloaded_since": self.overloaded_since,
            "classes": dict(sorted(self.class_priority.items(), key=lambda kv: (kv[1], kv[0]))),
            "counts": counts,
            "rejected": sum(self.rejected.values()),
            "deferred": sum(self.deferred.values()),
            "decisions": list(self._history),
        }

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
