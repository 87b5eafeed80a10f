"""What a dropping policy looks at (request, module context) and what it returns (Decision).

Times are seconds on the local clock of the module's host. A request's deadline is the budget it
arrived with turned into a local time on receipt (DESIGN.md: budgets travel, clocks do not), so
`t_s` of PARD eq. (3) is recovered as ``deadline_s - slo_s`` without a shared clock.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "BatchPlan",
    "Decision",
    "LatencyEstimate",
    "ModuleContext",
    "PipelineRequest",
    "Reason",
]


@dataclass(slots=True, eq=False)
class PipelineRequest:
    """One request (or DAG sub-request) waiting at module M_k."""

    request_id: Hashable
    deadline_s: float  # local t_s + SLO: the end-to-end objective on this host's clock
    slo_s: float  # the pipeline's end-to-end SLO
    received_s: float  # t_r: when it reached this module
    item: object = None  # opaque payload carried for the shell

    @property
    def sent_s(self) -> float:
        """t_s of PARD Fig. 5, on the local clock."""
        return self.deadline_s - self.slo_s

    def remaining_s(self, now: float) -> float:
        """Remaining latency budget: the DEPQ priority of §4.3."""
        return self.deadline_s - now


@dataclass(frozen=True, slots=True)
class ModuleContext:
    """The batch a request would join at module M_k (PARD §4.2, Request Broker)."""

    module_id: str
    expected_start_s: float  # t_e: expected end of the running batch; `now` when the worker idles
    duration_s: float  # d_k: profiled duration at the current batch size
    batch_size: int  # the current (synchronised) batch size b_k

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"module duration_s: must be > 0, got {self.duration_s!r}")
        if self.batch_size < 1:
            raise ValueError(f"module batch_size: must be >= 1, got {self.batch_size!r}")

    @property
    def capacity_rps(self) -> float:
        """T_m of §4.3 for one worker: b_k / d_k(b_k)."""
        return self.batch_size / self.duration_s


@dataclass(frozen=True, slots=True)
class LatencyEstimate:
    """The parts of PARD eq. (3b) for one request along its critical downstream path."""

    pre_s: float  # L_pre = t_b - t_s (backward)
    wait_s: float  # W_k = t_e - t_b
    exec_s: float  # D_k = d_k
    sub_queue_s: float = 0.0  # sum q_i, i in k+1..N
    sub_exec_s: float = 0.0  # sum d_i, i in k+1..N
    sub_wait_s: float = 0.0  # w_k = F^-1_{k+1->N}(lambda)
    path: tuple[str, ...] = ()  # the downstream path that gave the maximum (DAG, §4.2)

    @property
    def current_s(self) -> float:
        """L_cur = W_k + D_k (the queueing part Q_k is already inside pre_s at t_b)."""
        return self.wait_s + self.exec_s

    @property
    def sub_s(self) -> float:
        """L_sub = sum q_i + sum d_i + w_k."""
        return self.sub_queue_s + self.sub_exec_s + self.sub_wait_s

    @property
    def total_s(self) -> float:
        """The end-to-end estimate L of eq. (3a)."""
        return self.pre_s + self.current_s + self.sub_s


class Reason(StrEnum):
    """Why a policy admitted or dropped a request."""

    NO_POLICY = "no dropping policy"
    WITHIN_SLO = "estimate within the SLO"
    OVER_SLO = "end-to-end estimate exceeds the SLO"
    NEXUS_HEAD = "ahead of the first batch window that meets its deadlines"
    WITHIN_SHARE = "module latency within its SLO share"
    OVER_SHARE = "module latency exceeds its SLO share"
    WITHIN_SPLIT = "latency through this module within its cumulative SLO split"
    OVER_SPLIT = "latency through this module exceeds its cumulative SLO split"
    WITHIN_QUEUE_TARGET = "queueing delay at this module within its target"
    OVER_QUEUE_TARGET = "queueing delay at this module exceeds its target (overload)"


@dataclass(frozen=True, slots=True)
class Decision:
    """A drop decision: admit or drop, the compared estimate and limit, and why."""

    admit: bool
    reason: Reason
    estimate_s: float  # what the policy compared (eq. 3 for the PARD family)
    limit_s: float  # what it compared against (the SLO, or a module's SLO share)
    parts: LatencyEstimate | None = None

    @property
    def drop(self) -> bool:
        """True when the request is dropped at this module."""
        return not self.admit


@dataclass(slots=True)
class BatchPlan:
    """What one batch-forming round did: admitted requests (batch order) and dropped ones."""

    admitted: list[tuple[PipelineRequest, Decision]] = field(default_factory=list)
    dropped: list[tuple[PipelineRequest, Decision]] = field(default_factory=list)

    @property
    def requests(self) -> list[PipelineRequest]:
        """The admitted requests, in the order they joined the batch."""
        return [request for request, _ in self.admitted]
