"""Random workloads for the simulator, drawn with common random numbers.

Everything random about a run (inter-arrival shapes, classes, fanouts, target
servers, service times) is drawn from the scenario's seed alone, in a fixed
order; the load only rescales inter-arrival times. So two policies, or two
loads, see exactly the same queries: differences come from the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from admission.config import AdmissionPolicy
from loadtests.sim.scenario import Scenario
from taskserver.queues import QueuePolicy
from taskserver.service_time import ServiceSpec, make_distribution

# Service quantile table used for vectorised sampling; beyond it, the exact
# distribution is asked for each (rare) draw.
_TABLE_POINTS = 1 << 16


@dataclass(frozen=True, slots=True)
class Workload:
    """Queries and their tasks as arrays; tasks are laid out query by query."""

    arrival_ms: np.ndarray
    """Query arrival times t0 (ms), ascending."""
    cls: np.ndarray
    """Class index of each query."""
    fanout: np.ndarray
    """k_f of each query."""
    offsets: np.ndarray
    """Tasks of query q are task_* [offsets[q] : offsets[q + 1]]."""
    task_server: np.ndarray
    """Server index of each task."""
    task_service_ms: np.ndarray
    """Service time of each task on its server (scale applied)."""

    @property
    def queries(self) -> int:
        """Number of queries."""
        return int(self.arrival_ms.size)

    @property
    def tasks(self) -> int:
        """Number of tasks."""
        return int(self.task_server.size)


@dataclass(frozen=True, slots=True)
class _Draws:
    """The load-independent random draws of a scenario (cached per scenario)."""

    unit_gaps: np.ndarray
    cls: np.ndarray
    fanout: np.ndarray
    offsets: np.ndarray
    task_server: np.ndarray
    task_service_ms: np.ndarray


def make_workload(scn: Scenario, load: float) -> Workload:
    """The scenario's queries at this load (load = λ·E[k_f]·E[service]/N)."""
    if not load > 0:
        raise ValueError(f"load: must be > 0, got {load}")
    d = _cached_draws(scn)
    rate = scn.arrival_rate_per_ms(load)
    arrival_ms = np.cumsum(d.unit_gaps) / rate
    if scn.arrivals.phases:
        arrival_ms = _phased(arrival_ms, scn.arrivals.phases)
    return Workload(arrival_ms, d.cls, d.fanout, d.offsets, d.task_server, d.task_service_ms)


def _phased(op_ms: np.ndarray, multipliers: tuple[float, ...]) -> np.ndarray:
    """Arrivals at rate multiplier m_i in equally long phases, by a change of time.

    op_ms are arrivals at the base rate. Phase i lasts T of real time and takes m_i·T of
    base-rate time, so a Poisson stream stays Poisson with rate m_i·λ inside phase i.
    """
    m = np.asarray(multipliers, dtype=float)
    total = float(op_ms[-1]) * (1.0 + 1e-12)
    span = total / m.sum()  # T
    op_edges = np.concatenate([[0.0], np.cumsum(m * span)])
    phase = np.minimum(np.searchsorted(op_edges, op_ms, side="right") - 1, m.size - 1)
    return phase * span + (op_ms - op_edges[phase]) / m[phase]


_last: tuple[str, _Draws] | None = None


def _cached_draws(scn: Scenario) -> _Draws:
    """The draws of the last scenario asked for (a bisection asks for the same one often).

    The key leaves out what does not change the draws (policy, budget control), so
    every policy of a comparison reuses the very same queries.
    """
    global _last
    key = repr(
        replace(
            scn,
            run=replace(scn.run, policy=QueuePolicy.FIFO, budget_adjust=False, pick="random"),
            admission=replace(scn.admission, policy=AdmissionPolicy.NONE),
            autoscaling=replace(scn.autoscaling, enabled=False),
            allocation=replace(scn.allocation, policy="none"),
        )
    )
    if _last is None or _last[0] != key:
        _last = (key, _draws(scn))
    return _last[1]


def _draws(scn: Scenario) -> _Draws:
    rng = np.random.default_rng(scn.run.seed)
    n = scn.run.queries
    gaps = _unit_gaps(scn, rng, n)
    shares = np.array([c.share for c in scn.classes], dtype=float)
    cls = rng.choice(len(shares), size=n, p=shares / shares.sum()).astype(np.int32)
    ks, ps = scn.fanout.values_and_probs()
    fanout = rng.choice(np.array(ks), size=n, p=np.array(ps)).astype(np.int64)
    for c, spec in enumerate(scn.classes):
        if spec.fanout is not None:
            fanout[cls == c] = spec.fanout
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(fanout, out=offsets[1:])
    servers = _targets(rng, fanout, offsets, scn.servers.count)
    u = rng.random(int(offsets[-1]))
    service = sample_service_ms(scn.service, u)
    scales = np.asarray(scn.servers.scales())
    if np.any(scales != 1.0):
        service = service * scales[servers]
    return _Draws(gaps, cls, fanout, offsets, servers, service)


def _unit_gaps(scn: Scenario, rng: np.random.Generator, n: int) -> np.ndarray:
    """Inter-arrival times with mean 1 (scaled by 1/λ later)."""
    a = scn.arrivals
    if a.process == "poisson":
        return rng.exponential(1.0, n)
    if a.process == "pareto":
        # TailGuard eq. (6): F(x) = 1 - (x_m / x)^alpha, x > x_m; mean x_m*alpha/(alpha-1) = 1.
        x_m = (a.alpha - 1.0) / a.alpha
        return x_m * (1.0 - rng.random(n)) ** (-1.0 / a.alpha)
    assert a.path is not None
    stamps = np.loadtxt(a.path, dtype=float, ndmin=1)
    if stamps.size < 2 or np.any(np.diff(stamps) < 0):
        raise ValueError(f"arrivals.path: {a.path} needs >= 2 ascending timestamps")
    gaps = np.diff(stamps)
    gaps = np.resize(gaps, n)  # replay the trace as often as needed
    mean = gaps.mean()
    if not mean > 0:
        raise ValueError(f"arrivals.path: {a.path} has no time between arrivals")
    return gaps / mean


def _targets(
    rng: np.random.Generator, fanout: np.ndarray, offsets: np.ndarray, n_servers: int
) -> np.ndarray:
    """k_f distinct servers per query, uniformly at random."""
    out = np.empty(int(offsets[-1]), dtype=np.int64)
    for k in np.unique(fanout):
        qs = np.flatnonzero(fanout == k)
        starts = offsets[qs]
        idx = (starts[:, None] + np.arange(k)[None, :]).ravel()
        if k == n_servers:
            out[idx] = np.tile(np.arange(n_servers), qs.size)
        elif k == 1:
            out[idx] = rng.integers(0, n_servers, qs.size)
        else:
            # Row-wise random keys, take the k smallest: a uniform k-subset per query.
            chosen = np.empty((qs.size, k), dtype=np.int64)
            chunk = max(1, 4_000_000 // n_servers)
            for lo in range(0, qs.size, chunk):
                keys = rng.random((min(chunk, qs.size - lo), n_servers))
                chosen[lo : lo + keys.shape[0]] = np.argpartition(keys, k - 1, axis=1)[:, :k]
            out[idx] = chosen.ravel()
    return out


@cache
def _quantile_table(spec: ServiceSpec) -> tuple[np.ndarray, float]:
    dist = make_distribution(spec)
    n = _TABLE_POINTS
    grid = np.array([dist.quantile(i / n) for i in range(n)], dtype=float)
    return grid, dist.mean_ms


def sample_service_ms(spec: ServiceSpec, u: np.ndarray) -> np.ndarray:
    """Service times for uniforms u in [0, 1), vectorised through a quantile table.

    Linear interpolation in a 65,536-point table of the distribution's inverse CDF;
    draws in the top cell (u ≥ 1 - 1/65536) use the distribution's own quantile,
    so its tail (fitted exponential for quantile files) is kept exactly.
    """
    table, _ = _quantile_table(spec)
    n = table.size
    pos = u * n
    i = np.minimum(pos.astype(np.int64), n - 1)
    frac = pos - i
    nxt = np.minimum(i + 1, n - 1)
    out = table[i] + (table[nxt] - table[i]) * frac
    top = np.flatnonzero(i >= n - 1)
    if top.size:
        dist = make_distribution(spec)
        out[top] = [dist.quantile(float(x)) for x in u[top]]
    return out
