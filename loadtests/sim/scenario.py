"""Simulation scenarios: a TOML file parsed into typed, validated objects.

The keys ``[servers] count``, ``[arrivals] process``, ``[fanout]
distribution|uniform_max|fixed``, ``[[classes]] name/percentile/slo_ms/share``,
``[service] kind/path``, ``[run] policy/queries/seed`` are a contract other
tools rely on; more keys may be added, these stay.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from admission.config import AdmissionConfig, AdmissionPolicy, AllocationConfig
from gateway.stages import STAGE_RULES
from loadtests.sim.tailbench import resolve_table
from taskserver.queues import QueuePolicy
from taskserver.service_time import ServiceSpec
from taskserver.tomlconfig import ConfigError, build


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A group of servers with their own service-time scale (heterogeneity)."""

    count: int
    """Servers in this pool."""
    name: str = ""
    """Pool name (defaults to pool index)."""
    service_scale: float = 1.0
    """Multiplies every service time drawn on these servers."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count: must be >= 1, got {self.count}")
        if not (self.service_scale > 0 and math.isfinite(self.service_scale)):
            raise ValueError(f"service_scale: must be > 0, got {self.service_scale}")


@dataclass(frozen=True, slots=True)
class ServersSpec:
    """The task servers."""

    count: int = 100
    """Number of task servers N (the sum of the pools when pools are given)."""
    slots: int = 1
    """Tasks each server serves at once."""
    pools: tuple[PoolSpec, ...] = ()
    """Optional pools with different service scales; their counts must sum to `count`."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count: must be >= 1, got {self.count}")
        if self.slots < 1:
            raise ValueError(f"slots: must be >= 1, got {self.slots}")
        if self.pools and sum(p.count for p in self.pools) != self.count:
            total = sum(p.count for p in self.pools)
            raise ValueError(f"pools: counts sum to {total}, but count is {self.count}")

    def scales(self) -> list[float]:
        """Service-time scale of each server, in server order."""
        if not self.pools:
            return [1.0] * self.count
        return [p.service_scale for p in self.pools for _ in range(p.count)]


@dataclass(frozen=True, slots=True)
class ArrivalsSpec:
    """The query arrival process."""

    process: str = "poisson"
    """poisson, pareto (inter-arrivals by TailGuard eq. (6)) or trace."""
    alpha: float = 1.4
    """Pareto shape alpha (burstiness; TailGuard uses 1.4)."""
    path: str | None = None
    """Trace: a file of arrival timestamps in seconds, one per line (rescaled to the load)."""
    phases: tuple[float, ...] = ()
    """Load multipliers of equally long phases, e.g. [1.0, 1.2, 1.0] (default: one phase)."""

    def __post_init__(self) -> None:
        if self.process not in ("poisson", "pareto", "trace"):
            raise ValueError(
                f"process: must be 'poisson', 'pareto' or 'trace', got {self.process!r}"
            )
        if self.process == "pareto" and not self.alpha > 1:
            raise ValueError(f"alpha: must be > 1 for a finite mean, got {self.alpha}")
        if self.process == "trace" and not self.path:
            raise ValueError("path: a trace needs a file of timestamps")
        if any(not (m > 0 and math.isfinite(m)) for m in self.phases):
            raise ValueError(f"phases: load multipliers must be > 0, got {list(self.phases)}")


@dataclass(frozen=True, slots=True)
class FanoutSpec:
    """How many servers each query fans out to."""

    distribution: dict[str, float] | None = None
    """Discrete P(k): {"1": 0.9009, "10": 0.0901, "100": 0.009} (normalised)."""
    uniform_max: int | None = None
    """k uniform on 1..uniform_max."""
    fixed: int | None = None
    """Every query has this fanout."""
    type_edges: tuple[int, ...] = ()
    """Lower edges of the fanout types reported and judged separately
    (default: each k of a discrete distribution; four equal ranges for uniform)."""

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.distribution, self.uniform_max, self.fixed)]
        if sum(given) != 1:
            raise ValueError("distribution: give exactly one of distribution, uniform_max, fixed")
        if self.distribution is not None:
            if not self.distribution:
                raise ValueError("distribution: must not be empty")
            for k, p in self.distribution.items():
                if not k.isdigit() or int(k) < 1:
                    raise ValueError(f"distribution: fanout {k!r} is not an integer >= 1")
                if not (p >= 0 and math.isfinite(p)):
                    raise ValueError(f"distribution: probability of {k} must be >= 0, got {p}")
            if sum(self.distribution.values()) <= 0:
                raise ValueError("distribution: probabilities sum to 0")
        if self.uniform_max is not None and self.uniform_max < 1:
            raise ValueError(f"uniform_max: must be >= 1, got {self.uniform_max}")
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"fixed: must be >= 1, got {self.fixed}")
        if list(self.type_edges) != sorted(set(self.type_edges)) or any(
            e < 1 for e in self.type_edges
        ):
            raise ValueError(f"type_edges: must ascend from >= 1, got {list(self.type_edges)}")

    def values_and_probs(self) -> tuple[list[int], list[float]]:
        """The support of k and its probabilities."""
        if self.fixed is not None:
            return [self.fixed], [1.0]
        if self.uniform_max is not None:
            n = self.uniform_max
            return list(range(1, n + 1)), [1.0 / n] * n
        assert self.distribution is not None
        items = sorted((int(k), p) for k, p in self.distribution.items())
        total = sum(p for _, p in items)
        return [k for k, _ in items], [p / total for _, p in items]

    def mean(self) -> float:
        """E[k_f]."""
        ks, ps = self.values_and_probs()
        return sum(k * p for k, p in zip(ks, ps, strict=True))

    def edges(self) -> list[int]:
        """Lower edges of the fanout types."""
        if self.type_edges:
            return list(self.type_edges)
        if self.uniform_max is not None and self.uniform_max >= 4:
            n = self.uniform_max
            return [1 + (n * i) // 4 for i in range(4)]
        return self.values_and_probs()[0]

    def type_names(self) -> list[str]:
        """Names of the fanout types ("10", or "251-500" for ranges)."""
        edges = self.edges()
        ks = self.values_and_probs()[0]
        if not self.type_edges and edges == ks:
            return [str(k) for k in ks]  # a discrete distribution: each k is a type
        top = max(ks)
        names = []
        for i, lo in enumerate(edges):
            hi = edges[i + 1] - 1 if i + 1 < len(edges) else top
            names.append(str(lo) if hi <= lo else f"{lo}-{hi}")
        return names


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """A query class with its tail-latency SLO."""

    name: str
    """Class name."""
    slo_ms: float
    """SLO latency x_p^SLO in ms."""
    percentile: float = 99.0
    """SLO percentile p."""
    share: float = 1.0
    """Relative share of queries (normalised over classes)."""
    tenant: str = ""
    """The tenant its queries are for (the allocation layer's flow; "": the class name)."""
    fanout: int | None = None
    """A fixed k_f for this class's queries instead of the [fanout] draw."""

    @property
    def flow(self) -> str:
        """Its queries' allocation flow."""
        return self.tenant or self.name

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if self.fanout is not None and (isinstance(self.fanout, bool) or self.fanout < 1):
            raise ValueError(f"fanout: must be an int >= 1, got {self.fanout!r}")
        if not (self.slo_ms > 0 and math.isfinite(self.slo_ms)):
            raise ValueError(f"slo_ms: must be > 0, got {self.slo_ms}")
        if not 0 < self.percentile < 100:
            raise ValueError(f"percentile: must be in (0, 100), got {self.percentile}")
        if not (self.share > 0 and math.isfinite(self.share)):
            raise ValueError(f"share: must be > 0, got {self.share}")


@dataclass(frozen=True, slots=True)
class RequestsSpec:
    """Multi-query requests: M fanout queries in sequence under one SLO (TailGuard eq. 5)."""

    stages: int = 1
    """Queries per request, run one after another (1: plain queries)."""
    rule: str = "remaining"
    """How the request's remaining SLO is shared when a stage starts (gateway.stages):
    remaining, proportional or equal."""

    def __post_init__(self) -> None:
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages: must be an int >= 1, got {self.stages!r}")
        if self.rule not in STAGE_RULES:
            raise ValueError(f"rule: must be one of {', '.join(STAGE_RULES)}, got {self.rule!r}")


@dataclass(frozen=True, slots=True)
class OverheadSpec:
    """Non-service time of every task, in ms."""

    dispatch_ms: float = 0.0
    """Handler to server (part of the pre-dequeuing time in server queueing)."""
    return_ms: float = 0.0
    """Server back to the handler (part of the post-queuing time)."""

    def __post_init__(self) -> None:
        for name in ("dispatch_ms", "return_ms"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: must be >= 0, got {v}")


COST_INFORMATION = ("none", "class", "estimate", "exact")
"""The information ladder's levels, least to most."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """How to run the scenario."""

    policy: QueuePolicy = QueuePolicy.TF_EDFQ
    """Queue policy: tf-edfq, t-edfq, priq or fifo."""
    queries: int = 400_000
    """Queries to simulate."""
    seed: int = 1
    """Seed of every random draw (common random numbers across policies and loads)."""
    warmup: float = 0.05
    """Fraction of the first queries left out of the statistics."""
    queueing: str = "server"
    """server: tasks queue at the servers; central: at the handler, one queue per server."""
    budget_adjust: bool = False
    """Adjust each class's budget at run time from its tail-vs-SLO gap (beyond the paper)."""
    pick: str = "random"
    """How a query's k_f servers are chosen: random, or least-wait (the k with the smallest
    estimated queue wait as it arrives, QLM's load balancing)."""
    cost_information: str = "estimate"
    """What admission knows of a query's cost (client-side-scheduling's information ladder):
    none (every query alike), class (its class's mean cost), estimate (k_f * x_p^u, the
    gateway's) or exact (its tasks' drawn service times: an oracle)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", QueuePolicy.parse(self.policy))
        if self.pick not in ("random", "least-wait"):
            raise ValueError(f"pick: must be 'random' or 'least-wait', got {self.pick!r}")
        if self.cost_information not in COST_INFORMATION:
            raise ValueError(
                f"cost_information: must be one of {', '.join(COST_INFORMATION)}, "
                f"got {self.cost_information!r}"
            )
        if self.queries < 10:
            raise ValueError(f"queries: must be >= 10, got {self.queries}")
        if not 0 <= self.warmup < 0.9:
            raise ValueError(f"warmup: must be in [0, 0.9), got {self.warmup}")
        if self.queueing not in ("server", "central"):
            raise ValueError(f"queueing: must be 'server' or 'central', got {self.queueing!r}")


@dataclass(frozen=True, slots=True)
class SimAutoscaling:
    """Vertical autoscaling of the emulated servers on the miss ratio (TailGuard §III.E)."""

    enabled: bool = False
    """Scale the servers' speed while the scenario runs."""
    upper: float = 0.015
    """R_sth^U: speed up (service -20%) above this miss ratio."""
    lower: float = 0.005
    """R_sth^L: slow down (service +25%) below it."""
    window_tasks: int = 10_000
    """Miss-ratio window of the autoscaler, in tasks."""
    up_cooldown_ms: float = 100.0
    """Least virtual time between two speed-ups."""
    down_cooldown_ms: float = 300.0
    """Least virtual time after any change before a slow-down."""
    max_steps_up: int = 3
    """Speed-ups allowed above the configured service speed."""
    max_steps_down: int = 0
    """Slow-downs allowed below it (resources given back)."""

    def __post_init__(self) -> None:
        if not 0 <= self.lower < self.upper < 1:
            raise ValueError(f"lower: need 0 <= lower < upper < 1, got {self.lower}, {self.upper}")
        if self.window_tasks < 1:
            raise ValueError(f"window_tasks: must be >= 1, got {self.window_tasks}")
        if self.up_cooldown_ms < 0 or self.down_cooldown_ms < 0:
            raise ValueError("up_cooldown_ms: cooldowns must be >= 0")
        if self.max_steps_up < 0 or self.max_steps_down < 0:
            raise ValueError("max_steps_up: step limits must be >= 0")


def _no_admission() -> AdmissionConfig:
    return AdmissionConfig(policy=AdmissionPolicy.NONE)


def _default_classes() -> tuple[ClassSpec, ...]:
    return (ClassSpec(name="I", slo_ms=1.0),)


def _default_fanout() -> FanoutSpec:
    return FanoutSpec(fixed=1)


def _default_service() -> ServiceSpec:
    return ServiceSpec(kind="exponential", mean_ms=1.0)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scenario file."""

    servers: ServersSpec = field(default_factory=ServersSpec)
    arrivals: ArrivalsSpec = field(default_factory=ArrivalsSpec)
    fanout: FanoutSpec = field(default_factory=_default_fanout)
    classes: tuple[ClassSpec, ...] = field(default_factory=_default_classes)
    service: ServiceSpec = field(default_factory=_default_service)
    overhead: OverheadSpec = field(default_factory=OverheadSpec)
    requests: RequestsSpec = field(default_factory=RequestsSpec)
    """Multi-query requests (stages > 1: every request is that many queries in a row)."""
    run: RunSpec = field(default_factory=RunSpec)
    admission: AdmissionConfig = field(default_factory=_no_admission)
    """Admission control, as in the gateway's [admission] (default here: none)."""
    autoscaling: SimAutoscaling = field(default_factory=SimAutoscaling)
    """Vertical autoscaling of the emulated servers."""
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    """Fair share between tenants (classes' `tenant`), the gateway's [allocation]: at the
    central queues and in admission."""
    name: str = "scenario"
    """Shown in reports."""
    description: str = ""
    """One line shown in reports."""

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("classes: at least one class is needed")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: duplicate class names in {names}")
        if self.run.queries % self.requests.stages:
            raise ValueError(
                f"run.queries: {self.run.queries} is not a multiple of requests.stages "
                f"({self.requests.stages})"
            )
        ks = self.fanout.values_and_probs()[0]
        if max(ks) > self.servers.count:
            raise ValueError(f"fanout: fanout {max(ks)} exceeds the {self.servers.count} servers")
        for c in self.classes:
            if c.fanout is not None and c.fanout > self.servers.count:
                raise ValueError(
                    f"classes: class {c.name!r} fanout {c.fanout} exceeds the "
                    f"{self.servers.count} servers"
                )

    def with_policy(self, policy: str) -> Scenario:
        """The same scenario under another queue policy."""
        return replace(self, run=replace(self.run, policy=policy))

    def with_service(self, service: ServiceSpec) -> Scenario:
        """The same scenario with another service-time distribution."""
        return replace(self, service=service)

    def mean_service_ms(self) -> float:
        """E[service] over servers (with their scales)."""
        from taskserver.service_time import make_distribution

        scales = self.servers.scales()
        return make_distribution(self.service).mean_ms * sum(scales) / len(scales)

    def mean_fanout(self) -> float:
        """E[k_f] over the classes' shares (a class with a fixed fanout uses it)."""
        draw = self.fanout.mean()
        total = sum(c.share for c in self.classes)
        return sum(c.share * (draw if c.fanout is None else c.fanout) for c in self.classes) / total

    def arrival_rate_per_ms(self, load: float) -> float:
        """λ for a load: load = λ · E[k_f] · E[service] / N."""
        return load * self.servers.count / (self.mean_fanout() * self.mean_service_ms())


def parse_scenario(
    data: Mapping[str, Any], source: str = "", base_dir: Path | None = None
) -> Scenario:
    """Build a Scenario from a parsed TOML document; relative paths resolve against base_dir."""
    try:
        scn = build(Scenario, data)
        return _resolve_paths(scn, base_dir)
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, source) from None


def _resolve(path: str | None, base_dir: Path | None) -> str | None:
    """A relative path as given if it exists from here, else relative to the scenario's folder."""
    if path is None or Path(path).is_absolute() or Path(path).exists() or base_dir is None:
        return path
    candidate = base_dir / path
    return str(candidate) if candidate.exists() else path


def resolve_service_path(path: str | None, base_dir: Path | None) -> str | None:
    """A scenario's service-time file: ``tailbench:APP`` is the shipped table; a relative
    path is taken as given if it exists from here, else relative to the scenario's folder."""
    if path is None:
        return None
    try:
        return _resolve(resolve_table(path), base_dir)
    except ValueError as exc:
        raise ConfigError("service.path", str(exc)) from None


def _resolve_paths(scn: Scenario, base_dir: Path | None) -> Scenario:
    service = replace(scn.service, path=resolve_service_path(scn.service.path, base_dir))
    arrivals = replace(scn.arrivals, path=_resolve(scn.arrivals.path, base_dir))
    return replace(scn, service=service, arrivals=arrivals)


def read_scenario_toml(path: str | Path) -> dict[str, Any]:
    """A scenario file's TOML document, named after the file unless it names itself."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("", f"cannot read scenario: {exc.strerror}", str(p)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", str(p)) from exc
    data.setdefault("name", p.stem)
    return data


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file; errors name the file and the key."""
    return parse_scenario(read_scenario_toml(path), str(path), Path(path).parent)


def class_priorities(scn: Scenario) -> np.ndarray:
    """PRIQ priority per class: the tighter the SLO, the higher the class (0 first)."""
    order = sorted(range(len(scn.classes)), key=lambda i: (scn.classes[i].slo_ms, i))
    prio = np.empty(len(order), dtype=np.int64)
    prio[order] = np.arange(len(order))
    return prio
