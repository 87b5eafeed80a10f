"""One PARD pipeline experiment's setup and what is kept of each of its runs.

Shared by the experiment (`loadtests.sim.pard_experiments`), which makes them, and the
report (`loadtests.sim.pard_report`), which shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loadtests.sim.pipeline_model import PipelineModel, SimConfig
from loadtests.sim.traces import Period
from taskserver.pard import ScalingConfig

__all__ = ["SIM_SEED", "RunDigest", "Setup"]

SIM_SEED = 1
"""Seed of every pipeline simulation (its service-time draws)."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What the profile gave: batch sizes, workers, capacity, rate and SLO of one pipeline."""

    pipeline: str
    model: PipelineModel
    """Read once: every run uses these very durations, even if the files change meanwhile."""
    spec_path: Path
    profile_path: Path
    device: str
    slo_s: float
    spec_slo_s: float
    max_batch: dict[str, int]
    workers: dict[str, int]
    worker_rps: dict[str, float]
    capacity_rps: float
    load: float
    """Mean rate over capacity."""
    rate_rps: float
    duration_s: float
    scaling: ScalingConfig | None = None
    """Run-time worker scaling from `workers` on (PARD §5.1); None: `workers` stay fixed."""
    wait_quantile: float = 0.1
    """lambda of PARD §4.2 (the sensitivity runs vary it)."""
    queue_window_s: float = 5.0
    """The q_i window of PARD footnote 4 (the sensitivity runs vary it)."""

    def config(self, seed: int = SIM_SEED) -> SimConfig:
        """The simulator settings of every run (`seed`: its service-time draws)."""
        return SimConfig(
            workers=self.workers,
            max_batch=self.max_batch,
            seed=seed,
            scaling=self.scaling,
            wait_quantile=self.wait_quantile,
            queue_window_s=self.queue_window_s,
        )


@dataclass(frozen=True, slots=True)
class RunDigest:
    """What the tables and plots keep of one (trace, policy) run."""

    trace: str
    policy: str
    seed: int
    """Seed of the trace and of the run's service-time draws."""
    arrived: int
    on_time: int
    late: int
    dropped: int
    goodput_rps: float
    """On-time requests per second of trace."""
    goodput_overload_rps: float
    """Mean goodput over the overload periods (`overload_periods`; NaN: none)."""
    overload_s: int
    drop_rate: float
    invalid_rate: float
    trace_cv: float
    wall_s: float
    drops: dict[str, int] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    mean_batch: dict[str, float] = field(default_factory=dict)
    compute_s: dict[str, float] = field(default_factory=dict)
    invalid_s: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, float, float]] = field(default_factory=list)
    """(end of second, offered requests in it, on-time completions in it)."""
    overload_periods: tuple[Period, ...] = ()
    """The periods that require dropping: the trace's offered rate above the capacity."""
    arrived_per_s: list[int] = field(default_factory=list)
    """Requests that arrived in each second."""
    lost_per_s: list[int] = field(default_factory=list)
    """Of those, the ones dropped or late (by arrival second: a transient drop rate)."""
    capacity_per_s: list[float] = field(default_factory=list)
    """What the pipeline could serve in each second (req/s): fixed, or as scaling moved it."""
    workers_per_s: list[float] = field(default_factory=list)
    """Serving workers over all modules in each second, as this run scaled them (mean of the
    decisions in the second; the fixed count without scaling)."""
    pipeline: str = ""
    """The pipeline it ran."""
    excess_share: float = 0.0
    """The trace's offered requests above `capacity_per_s` over all offered: a share no policy
    can serve on time (a lower bound on the drop rate, up to queueing that carries over)."""
    priority_per_s: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    """Per module whose queues adapt (PARD §4.3), per second: (share of serving workers in
    HBF, mean mu, mean eps); empty for policies without adaptive priority."""

    def drop_share(self, module_id: str) -> float:
        """The share of this run's drops made at a module."""
        return self.drops[module_id] / self.dropped if self.dropped else 0.0
