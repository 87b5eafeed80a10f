"""The [admission] table: admission control on the task deadline-miss ratio (TailGuard §III.D);
and the [allocation] table: the fair share between tenants (client-side-scheduling §3.1).

Owned here, beside the gate it configures; the gateway's config and the simulator's scenarios
both embed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from admission.allocation import (
    ALLOCATION_POLICIES,
    AdmissionShare,
    Congestion,
    DrrArbiter,
    FairArbiter,
)
from admission.decisions import Rule

__all__ = ["SHARE_MODES", "AdmissionConfig", "AdmissionPolicy", "AllocationConfig"]

SHARE_MODES = ("windows", "transfer", "none")
"""[allocation] share: how admission is shared between flows under overload."""


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


@dataclass(frozen=True, slots=True)
class AllocationConfig:
    """The allocation layer ([allocation]; client-side-scheduling §3.1): fair share of the
    pools between tenants (or classes), in cost units (admission.allocation)."""

    policy: str = "none"
    """none, drr (deficit round robin) or fair (start-time fair queueing)."""
    flows: str = "tenant"
    """What a flow is: tenant (the query's `tenant` field) or class."""
    weights: dict[str, float] = field(default_factory=dict)
    """Weight per flow name; long-run shares of cost are in proportion."""
    default_weight: float = 1.0
    """The weight of a flow not in `weights`."""
    quantum_ms: float = 0.0
    """drr: cost units (ms of server time) a flow's deficit grows by per visit and weight;
    0: the largest task cost seen so far (DRR's own condition, one task per visit at least)."""
    order: str = "deadline"
    """drr: which flow, of those whose deficit covers their head task, releases first:
    deadline (the most urgent head in the queue policy's order) or round (classic DRR's
    round robin)."""
    protected: tuple[str, ...] = ()
    """drr: flows whose weight grows by 1 + boost * congestion under load (the paper's
    congestion-aware adjustment)."""
    boost: float = 1.0
    """drr: how much the protected flows' weights grow at full congestion."""
    share: str = "windows"
    """How admission is shared under overload: windows (each flow is admitted on the miss
    ratio of its own tasks: a gate per flow), transfer (the pool's gate, whose refusals on
    the pool-wide signal move to the flows served most per weight:
    admission.allocation.AdmissionShare) or none (the pool's gate alone)."""
    max_flows: int = 256
    """Distinct flows kept apart; the queries of any tenant beyond them share one flow,
    "other" (so clients cannot grow the gateway's state or its metrics without bound)."""
    share_window_s: float = 10.0
    """How long admitted cost counts toward a flow's share (exponential time constant)."""

    def __post_init__(self) -> None:
        if self.policy not in ALLOCATION_POLICIES:
            raise ValueError(
                f"policy: must be one of {', '.join(ALLOCATION_POLICIES)}, got {self.policy!r}"
            )
        if self.flows not in ("tenant", "class"):
            raise ValueError(f"flows: must be 'tenant' or 'class', got {self.flows!r}")
        for name, w in self.weights.items():
            if not (w > 0 and math.isfinite(w)):
                raise ValueError(f"weights.{name}: must be > 0, got {w!r}")
        if not (self.quantum_ms >= 0 and math.isfinite(self.quantum_ms)):
            raise ValueError(f"quantum_ms: must be >= 0 (0: automatic), got {self.quantum_ms!r}")
        for key in ("default_weight", "share_window_s"):
            v = getattr(self, key)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{key}: must be > 0, got {v!r}")
        if isinstance(self.max_flows, bool) or not 1 <= self.max_flows <= 100_000:
            raise ValueError(f"max_flows: must be 1..100000, got {self.max_flows!r}")
        if self.order not in ("deadline", "round"):
            raise ValueError(f"order: must be 'deadline' or 'round', got {self.order!r}")
        if self.share not in SHARE_MODES:
            raise ValueError(f"share: must be one of {', '.join(SHARE_MODES)}, got {self.share!r}")
        if not (self.boost >= 0 and math.isfinite(self.boost)):
            raise ValueError(f"boost: must be >= 0, got {self.boost!r}")

    @property
    def enabled(self) -> bool:
        """Whether work is released by share at all."""
        return self.policy != "none"

    def arbiter(self, congestion: Congestion | None = None) -> DrrArbiter | FairArbiter:
        """A fresh arbiter of this policy (one per queue that releases work)."""
        if self.policy == "fair":
            return FairArbiter(self.weights, default_weight=self.default_weight)
        if self.policy != "drr":
            raise ValueError("allocation policy 'none' has no arbiter")
        return DrrArbiter(
            self.weights,
            quantum=self.quantum_ms or None,
            protected=frozenset(self.protected),
            boost=self.boost,
            default_weight=self.default_weight,
            congestion=congestion,
            urgent=self.order == "deadline",
        )

    @property
    def gate_per_flow(self) -> bool:
        """Whether each flow has an admission gate of its own (share = windows)."""
        return self.enabled and self.share == "windows"

    def admission_share(self) -> AdmissionShare | None:
        """The transfer share, when in force (None: the gates alone decide)."""
        if not (self.enabled and self.share == "transfer"):
            return None
        return AdmissionShare(self.weights, self.share_window_s, self.default_weight)
