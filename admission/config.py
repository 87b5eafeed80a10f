"""The [admission] table: admission control on the task deadline-miss ratio (TailGuard §III.D).

Owned here, beside the gate it configures; the gateway's config and the simulator's scenarios
both embed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from admission.decisions import Rule

__all__ = ["AdmissionConfig", "AdmissionPolicy"]


class AdmissionPolicy(StrEnum):
    """Whether admission control runs ([admission] policy)."""

    MISS_RATIO = "miss-ratio"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Admission control on the task deadline-miss ratio (TailGuard §III.D)."""

    policy: AdmissionPolicy = AdmissionPolicy.MISS_RATIO
    """`miss-ratio` (reject while the windowed miss ratio is above threshold) or `none`."""
    threshold: float = 0.017
    """R_cth^U: the miss ratio above which new queries are rejected."""
    release_threshold: float | None = None
    """Admit again once the ratio falls below this (default: threshold)."""
    window_tasks: int = 100_000
    """Moving window by task count (0: use window_s)."""
    window_s: float = 0.0
    """Moving window by time, in seconds (used when window_tasks is 0)."""
    window_max_age_s: float = 5.0
    """A count window with no new task for this long is cleared: while queries are rejected
    no task feeds it, and stale misses would otherwise reject forever."""
    rule: Rule = Rule.REJECT_ALL
    """reject-all, lowest-class-first, largest-fanout-first, cost-ladder or throttle."""
    max_defer_ms: float = 500.0
    """Longest a deferred query waits in the gateway before it is admitted or rejected."""
    throttle_interval_s: float = 0.05
    """throttle: how often the admitted fraction is stepped."""
    throttle_gain: float = 0.5
    """throttle: integral gain on log(threshold / miss ratio) per step."""
    throttle_min_fraction: float = 0.02
    """throttle: the admitted fraction never drops below this (keeps the window fed)."""
    ladder_shedding: str = "ladder"
    """cost-ladder: the shedding order: ladder (the paper's rungs on cost buckets), uniform (a
    share of every query) or reverse (the cheapest first): the paper's comparison rules."""
    predictive_level: float | None = None
    """predictive: admit a query predicted to meet its SLO with at least this probability
    (default: its class's percentile / 100)."""
    predictive_backstop: Rule = Rule.NONE
    """predictive: the miss-ratio rule that queries passing the prediction meet next
    (none, reject-all, throttle, ...)."""

    def __post_init__(self) -> None:
        # Strings are accepted from code (the TOML loader converts them already).
        try:
            object.__setattr__(self, "policy", AdmissionPolicy(self.policy))
        except ValueError:
            raise ValueError(
                f"policy: must be 'miss-ratio' or 'none', got {self.policy!r}"
            ) from None
        try:
            object.__setattr__(self, "rule", Rule(self.rule))
        except ValueError:
            valid = ", ".join(r.value for r in Rule)
            raise ValueError(f"rule: must be one of {valid}, got {self.rule!r}") from None
        try:
            object.__setattr__(self, "predictive_backstop", Rule(self.predictive_backstop))
        except ValueError:
            valid = ", ".join(r.value for r in Rule if r is not Rule.PREDICTIVE)
            raise ValueError(
                f"predictive_backstop: must be one of {valid}, got {self.predictive_backstop!r}"
            ) from None
        if self.predictive_backstop is Rule.PREDICTIVE:
            raise ValueError("predictive_backstop: cannot be 'predictive' itself")
        if self.ladder_shedding not in ("ladder", "uniform", "reverse"):
            raise ValueError(
                "ladder_shedding: must be one of ladder, uniform, reverse, "
                f"got {self.ladder_shedding!r}"
            )
        if self.predictive_level is not None and not 0 < self.predictive_level < 1:
            raise ValueError(f"predictive_level: must be in (0, 1), got {self.predictive_level}")
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold: must be in (0, 1), got {self.threshold}")
        if self.release_threshold is not None and not 0 < self.release_threshold <= self.threshold:
            raise ValueError(
                f"release_threshold: must be in (0, threshold], got {self.release_threshold}"
            )
        if self.window_tasks < 0 or (self.window_tasks == 0 and self.window_s <= 0):
            raise ValueError(
                "window_tasks: give window_tasks > 0, or window_tasks = 0 and window_s > 0"
            )
        if self.max_defer_ms < 0:
            raise ValueError(f"max_defer_ms: must be >= 0, got {self.max_defer_ms}")
        if self.window_max_age_s <= 0:
            raise ValueError(f"window_max_age_s: must be > 0, got {self.window_max_age_s}")
        if not self.throttle_interval_s > 0:
            raise ValueError(f"throttle_interval_s: must be > 0, got {self.throttle_interval_s}")
        if not self.throttle_gain > 0:
            raise ValueError(f"throttle_gain: must be > 0, got {self.throttle_gain}")
        if not 0 < self.throttle_min_fraction <= 1:
            raise ValueError(
                f"throttle_min_fraction: must be in (0, 1], got {self.throttle_min_fraction}"
            )

    @property
    def enabled(self) -> bool:
        """Whether any query can be turned away."""
        return self.policy is not AdmissionPolicy.NONE and self.rule is not Rule.NONE

    @property
    def effective_rule(self) -> Rule:
        """The rule in force: `none` when the policy is off."""
        return self.rule if self.enabled else Rule.NONE
