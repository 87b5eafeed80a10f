"""Waiting-time estimation for a task joining a server's queue (QLM §6, eqs. (2)-(3)).

QLM's Request Waiting Time estimator divides the work queued ahead of a request by the
server's throughput, W_q = sum_{i<q} O_i / Theta (eq. 2), and, since the sizes of the requests
ahead are unknown, models their sum as Normal by the Central Limit Theorem,
sum O_i ~ N((q-1) mu, (q-1) sigma^2) (eq. 3). A request group (QLM §4) is a set of requests
that share one size distribution, so the sum runs over groups, each with its own mean and
variance.

Here the "tokens" are task service times (ms) and the throughput is a server's slots / mean
service time. A task that joins a server where every slot is busy starts when the slots have
done the work queued ahead of it and one of the tasks in service has ended:

    W = (R + sum_{g} sum_{i=1}^{n_g} S_{g,i}) / c

with c the slots, n_g the tasks of group g queued ahead (in the queue's own policy order),
S_{g,i} their service times and R the residual service of the task in service. Beyond QLM
(whose batches run one decode step at a time, so it has no residual): R has the equilibrium
residual law of the service time, E[R] = E[S^2] / (2 E[S]) and E[R^2] = E[S^3] / (3 E[S]);
so for c = 1 the mean is exact for any service law seen by Poisson arrivals (the
Pollaczek-Khinchine mean), and for exponential service the mean and variance are exact for
any c (the wait is then Erlang(n + 1) at rate c / mu). A task that finds a slot free and
nothing ahead waits 0.

Beyond QLM, whose virtual queues keep a fixed order once a group is placed: under a deadline
or priority policy, tasks that arrive *after* this one can still go ahead of it while it
waits (a later class-I task with a tighter budget, under TF-EDFQ). `with_overtaking` adds
their work: a group h arriving at rate lambda_h with an order key smaller by up to Delta_h
(`overtake_window`) overtakes for min(W, Delta_h), so

    W = W0 + sum_h rho_h min(W, Delta_h),   rho_h = lambda_h E[S_h] / c,

solved exactly (it is piecewise linear in W); with Delta = inf this is the M/G/1
priority-queue wait W0 / (1 - rho_higher). Its variance is that of a delay busy period of
the groups still overtaking, started by the fixed work (the base wait and the arrivals of
groups whose window has closed).

`WaitEstimate.within(b)` is P(W <= b) under the Normal of eq. (3); `query_on_time` is the
probability that every task of a fanout query is dequeued within its queueing budget, the
product over its targets (TailGuard's tasks are independent once their deadlines are
stamped, §III.C).

Pure code: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from admission.errors import PolicyValueError

__all__ = [
    "NO_WAIT",
    "LogCdf",
    "ServiceMoments",
    "WaitEstimate",
    "estimate_wait",
    "meet_probability",
    "overtake_window",
    "query_on_time",
    "with_overtaking",
]

LogCdf = Callable[[np.ndarray], np.ndarray]
"""log F of a server's post-queuing time (ms -> log probability), vectorised."""

# Probabilists' Gauss-Hermite rule, 5 points: E[g(Z)] for Z ~ N(0, 1) is sum_j w_j g(z_j).
_GH_Z = np.array([-2.8569700138728056, -1.3556261799742659, 0.0, 1.3556261799742659,
                  2.8569700138728056])  # fmt: skip
_GH_W = np.array([0.011257411327720691, 0.22207592200561266, 0.5333333333333333,
                  0.22207592200561266, 0.011257411327720691])  # fmt: skip

_SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True, slots=True)
class ServiceMoments:
    """The first three raw moments of a service time (ms, ms^2, ms^3)."""

    mean_ms: float
    m2: float
    m3: float

    def __post_init__(self) -> None:
        if not (self.mean_ms > 0 and math.isfinite(self.mean_ms)):
            raise PolicyValueError(f"service mean_ms: must be > 0 and finite, got {self.mean_ms!r}")
        if not (self.m2 >= self.mean_ms**2 * (1 - 1e-9) and math.isfinite(self.m2)):
            raise PolicyValueError(
                f"service m2: must be finite and >= mean^2 ({self.mean_ms**2!r}), got {self.m2!r}"
            )
        if not (self.m3 > 0 and math.isfinite(self.m3)):
            raise PolicyValueError(f"service m3: must be > 0 and finite, got {self.m3!r}")

    @classmethod
    def from_samples(cls, samples_ms: ArrayLike) -> ServiceMoments:
        """Moments of observed service times (at least one, all >= 0, mean > 0)."""
        x = np.asarray(samples_ms, dtype=np.float64).ravel()
        if x.size == 0:
            raise PolicyValueError("service samples: need at least one, got none")
        if not np.isfinite(x).all() or (x < 0).any():
            raise PolicyValueError("service samples: must be finite and >= 0")
        return cls(float(x.mean()), float(np.mean(x * x)), float(np.mean(x * x * x)))

    @classmethod
    def deterministic(cls, service_ms: float) -> ServiceMoments:
        """A service time that is always `service_ms`."""
        return cls(service_ms, service_ms**2, service_ms**3)

    @classmethod
    def exponential(cls, mean_ms: float) -> ServiceMoments:
        """An exponential service time of mean `mean_ms`."""
        return cls(mean_ms, 2.0 * mean_ms**2, 6.0 * mean_ms**3)

    @property
    def var_ms2(self) -> float:
        """Var[S]."""
        return max(self.m2 - self.mean_ms**2, 0.0)

    @property
    def residual_mean_ms(self) -> float:
        """E[R] = E[S^2] / (2 E[S]): the mean residual service seen by a random arrival."""
        return self.m2 / (2.0 * self.mean_ms)

    @property
    def residual_var_ms2(self) -> float:
        """Var[R] with E[R^2] = E[S^3] / (3 E[S])."""
        return max(self.m3 / (3.0 * self.mean_ms) - self.residual_mean_ms**2, 0.0)


@dataclass(frozen=True, slots=True)
class WaitEstimate:
    """A task's queue wait as a Normal (QLM eq. 3); mean 0 and sd 0: it starts at once."""

    mean_ms: float
    sd_ms: float
    ahead: int = 0
    """Tasks queued ahead of it (in policy order) when it was estimated."""

    def within(self, budget_ms: float) -> float:
        """P(W <= budget_ms)."""
        if self.sd_ms <= 0.0:
            return 1.0 if self.mean_ms <= budget_ms else 0.0
        return 0.5 * math.erfc((self.mean_ms - budget_ms) / (self.sd_ms * _SQRT2))

    def quantile_ms(self, q: float) -> float:
        """The q-quantile of W under the Normal (never below 0)."""
        if not 0.0 < q < 1.0:
            raise PolicyValueError(f"wait quantile: q must be in (0, 1), got {q!r}")
        if self.sd_ms <= 0.0:
            return self.mean_ms
        return max(self.mean_ms + self.sd_ms * _SQRT2 * _erfinv(2.0 * q - 1.0), 0.0)


NO_WAIT = WaitEstimate(0.0, 0.0, 0)


def estimate_wait(
    ahead: Sequence[tuple[int, ServiceMoments]],
    busy: int,
    slots: int,
    service: ServiceMoments,
) -> WaitEstimate:
    """Queue wait of a task that joins now (QLM eqs. (2)-(3), with the residual above).

    `ahead`: per request group, how many of its tasks are queued ahead of this one in the
    queue's policy order, and their service moments; `busy`: tasks in service; `slots`: how
    many run at once; `service`: the server's own service moments (the residual's law).
    """
    if slots < 1:
        raise PolicyValueError(f"slots: must be >= 1, got {slots!r}")
    if busy < 0:
        raise PolicyValueError(f"busy: must be >= 0, got {busy!r}")
    n_ahead = 0
    mean = 0.0
    var = 0.0
    for n, m in ahead:
        if n <= 0:
            continue
        n_ahead += n
        mean += n * m.mean_ms
        var += n * m.var_ms2
    free = slots - min(busy, slots)
    if n_ahead < free:
        return NO_WAIT if n_ahead == 0 else WaitEstimate(0.0, 0.0, n_ahead)
    if free == 0:
        # Every slot busy: one of the tasks in service must end first (its residual).
        mean += service.residual_mean_ms
        var += service.residual_var_ms2
    # else: tasks ahead that a free slot takes at once start now; their whole service is the
    # work to get through, like the queued ones' (no residual).
    return WaitEstimate(mean / slots, math.sqrt(var) / slots, n_ahead)


def overtake_window(policy: str, mine: tuple[float, float, int], other: tuple[float, float, int]
                    ) -> float:  # fmt: skip
    """How long after a task arrives a task of another group may still arrive and go ahead
    of it, in the queue policy's order (ms; 0: never, inf: always).

    `mine`, `other`: (budget T_b ms, SLO ms, priority) of the two groups. TF-EDFQ orders by
    t0 + T_b (TailGuard eq. 4), T-EDFQ by t0 + SLO, PRIQ by priority, FIFO by arrival.
    """
    if policy == "tf-edfq":
        return max(mine[0] - other[0], 0.0)
    if policy == "t-edfq":
        return max(mine[1] - other[1], 0.0)
    if policy == "priq":
        return math.inf if other[2] < mine[2] else 0.0
    if policy == "fifo":
        return 0.0
    raise PolicyValueError(f"queue policy: unknown {policy!r}")


def with_overtaking(
    base: WaitEstimate,
    overtakers: Iterable[tuple[float, float, ServiceMoments]],
    slots: int,
) -> WaitEstimate:
    """`base` plus the work of tasks that will arrive later and go ahead (module docstring).

    `overtakers`: per group, (arrival rate at this server in tasks/ms, overtaking window ms,
    service moments). A task that starts at once (mean and sd 0) is never overtaken.
    """
    if base.mean_ms == 0.0 and base.sd_ms == 0.0:
        return base
    # Per group: (rho = its share of the slots' time, its window, its variance per ms).
    terms = sorted(
        (
            (rate * m.mean_ms / slots, window, rate * m.m2 / slots**2)
            for rate, window, m in overtakers
            if rate > 0.0 and window > 0.0
        ),
        key=lambda t: t[1],
    )
    if not terms:
        return base
    # On the segment where W lies between two windows, the groups with smaller windows add
    # a fixed rho * Delta and the others rho * W: W = (W0 + fixed) / (1 - open).
    fixed = base.mean_ms
    fixed_var = base.sd_ms**2
    open_rho = sum(t[0] for t in terms)
    open_var = sum(t[2] for t in terms)
    mean = math.inf
    for rho, window, v in terms:
        if open_rho < 1.0:
            w = fixed / (1.0 - open_rho)
            if w <= window:
                mean = w
                break
        if math.isinf(window):
            break  # groups that always overtake, at rho >= 1 between them: no end to it
        fixed += rho * window
        fixed_var += v * window
        open_rho -= rho
        open_var -= v
    else:
        mean = fixed / (1.0 - open_rho) if open_rho < 1.0 else math.inf
    if math.isinf(mean):
        return WaitEstimate(math.inf, 0.0, base.ahead)
    # The wait is a delay busy period of the open groups started by the fixed work X (the
    # base wait and the saturated groups' arrivals): Var = Var[X] / (1 - rho)^2
    # + E[X] lambda E[S^2] / (1 - rho)^3, the M/G/1 priority-queue form.
    gap = 1.0 - max(open_rho, 0.0)
    var = fixed_var / gap**2 + fixed * max(open_var, 0.0) / gap**3
    return WaitEstimate(mean, math.sqrt(var), base.ahead)


def query_on_time(estimates: Iterable[WaitEstimate], budget_ms: float) -> float:
    """P(every task is dequeued within budget_ms): the product over the query's targets."""
    p = 1.0
    for e in estimates:
        if e.mean_ms == 0.0 and e.sd_ms == 0.0:
            continue
        p *= e.within(budget_ms)
        if p == 0.0:
            break
    return p


def meet_probability(
    groups: Iterable[tuple[LogCdf, Sequence[WaitEstimate]]], slack_ms: float
) -> float:
    """P(every task's queue wait plus post-queuing time is within slack_ms).

    `groups`: per CDF row, its log F and the wait estimates of the query's tasks on servers
    of that row. A task meets the query's SLO when W + X <= slack, with X its server's
    post-queuing time (TailGuard §III.C: the same F_i the deadlines come from); tasks are
    independent, so the query's probability is the product of E_W[F(slack - W)] over its
    tasks, the expectation taken over W's Normal (QLM eq. 3, clipped at 0) by a 5-point
    Gauss-Hermite rule. A task that starts at once contributes F(slack) itself. Beyond QLM,
    which compares a group's estimated completion with its SLO; here the estimate feeds
    TailGuard's per-server latency CDFs, so the answer is a probability, read against the
    class's percentile.
    """
    if not slack_ms > 0:
        return 0.0
    log_p = 0.0
    for log_cdf, waits in groups:
        idle = 0
        means: list[float] = []
        sds: list[float] = []
        for e in waits:
            if e.mean_ms == 0.0 and e.sd_ms == 0.0:
                idle += 1
            else:
                means.append(e.mean_ms)
                sds.append(e.sd_ms)
        n_busy = len(means)
        x = np.empty(1 + 5 * n_busy)
        x[0] = slack_ms
        if n_busy:
            w = np.asarray(means)[:, None] + np.asarray(sds)[:, None] * _GH_Z[None, :]
            x[1:] = (slack_ms - np.maximum(w, 0.0)).ravel()
        log_f = np.asarray(log_cdf(x), dtype=np.float64)
        if idle:
            log_p += idle * float(log_f[0])
        if n_busy:
            f = np.exp(log_f[1:]).reshape(n_busy, 5) @ _GH_W
            with np.errstate(divide="ignore"):
                log_p += float(np.log(f).sum())
        if log_p == -math.inf:
            return 0.0
    return math.exp(log_p)


def _erfinv(y: float) -> float:
    """Inverse error function (Giles 2010's single-precision approximation, then two Newton
    steps on erf to double precision)."""
    if not -1.0 < y < 1.0:
        raise PolicyValueError(f"erfinv: y must be in (-1, 1), got {y!r}")
    w = -math.log((1.0 - y) * (1.0 + y))
    if w < 5.0:
        w -= 2.5
        p = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941):  # fmt: skip
            p = c + p * w
    else:
        w = math.sqrt(w) - 3.0
        p = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                  -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):  # fmt: skip
            p = c + p * w
    x = p * y
    for _ in range(2):
        x -= (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x
