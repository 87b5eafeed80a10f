"""Model-based autoscaling after Swayam (Gujarati et al., Middleware '17, §4).

- `RatePredictor`: least-squares line through recent request rates, extrapolated t_setup
  ahead (§4.2); the global rate is n_F * the local rate when n_F gateways share the load.
- `required_backends` / `estimate_backends`: the smallest n whose p-th percentile response
  time meets the target at rate U·λ (§4.3, Fig. 4), under Swayam's waiting-time model for
  random dispatch with retries (§4.5, eq. 1), convolved with the measured service times.
- `SwayamPolicy`: proactive scale-out to that n, never active scale-in (Algorithm 1).
- `IdleTracker`: passive scale-in; a backend idle for T decommissions itself (§4.1).
- `backend_order`: the fixed backend order every gateway fills from, so gateways that agree
  on n use the same n backends without talking (§4.4).

The waiting-time model (§4.5). Gateways send each request to a random backend; a busy backend
turns it away and the gateway retries another after a delay Δ. With n backends each busy with
probability rho = U·λ / (n·μ) (μ = 1 / mean service time), attempt k succeeds with probability
(1 - rho)·rho^(k-1), and every failed attempt costs a round trip d1 + d2 plus Δ. Eq. (1):

    ω_p = d1 + (ln(1 - p/100) / ln rho - 1) · (d1 + d2 + Δ)

is the p-th percentile of the waiting time W whose tail is P(W > w) = rho^(1 + (w - d1)/c) for
w >= d1, c = d1 + d2 + Δ: an atom 1 - rho at d1 (the first backend tried is idle) and a
geometric-turned-exponential tail. We use exactly that distribution and convolve it with the
service-time samples S_j (equal weights): P(R <= x) = mean_j P(W <= x - S_j); n meets the SLA
when P(R <= target) >= p/100. Where eq. (1) would give ω_p < d1 (rho < 1 - p/100: fewer than one
attempt) we clamp to d1; rho >= 1 is unstable and never meets a target (beyond the paper).
A backend here runs one request at a time, as in Swayam §3.1: for task servers with s slots,
counting slots as backends is the conservative reading.

Errors::

    AdmissionError
     └── PolicyValueError     a bad rate, percentile, target, sample or setting

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from admission.autoscale import DecisionLog, ScaleDecision
from admission.errors import PolicyValueError
from admission.queueing_models import central_waiting_cdf, erlang_c

DISPATCHES = ("retry", "central")
"""Waiting-time models: Swayam's random dispatch with retries, or a central FIFO queue."""

__all__ = [
    "BackendEstimate",
    "IdleTracker",
    "RatePredictor",
    "SwayamPolicy",
    "backend_order",
    "estimate_backends",
    "required_backends",
    "response_percentile_ms",
    "task_targets",
    "waiting_percentile_ms",
]


class RatePredictor:
    """Least-squares line through recent rates, extrapolated to now + horizon (Swayam §4.2)."""

    __slots__ = ("_samples", "history_s", "min_points")

    def __init__(self, *, history_s: float = 60.0, min_points: int = 3) -> None:
        if not (history_s > 0 and math.isfinite(history_s)):
            raise PolicyValueError(f"rate predictor history_s: must be > 0, got {history_s!r}")
        if isinstance(min_points, bool) or not isinstance(min_points, int) or min_points < 1:
            raise PolicyValueError(
                f"rate predictor min_points: must be an int >= 1, got {min_points!r}"
            )
        self.history_s = history_s
        self.min_points = min_points
        self._samples: deque[tuple[float, float]] = deque()

    def observe(self, now: float, rate_per_s: float) -> None:
        """Add one rate sample taken at `now` (samples come in time order)."""
        if not (rate_per_s >= 0 and math.isfinite(rate_per_s)):
            raise PolicyValueError(f"rate predictor rate_per_s: must be >= 0, got {rate_per_s!r}")
        if self._samples and now < self._samples[-1][0]:
            raise PolicyValueError(
                f"rate predictor now: {now!r} is before the last sample at {self._samples[-1][0]!r}"
            )
        self._samples.append((now, rate_per_s))
        self._evict(now)

    def predict(self, now: float, horizon_s: float) -> float:
        """The fitted rate at now + horizon_s, never negative; the last rate below min_points."""
        if not (horizon_s >= 0 and math.isfinite(horizon_s)):
            raise PolicyValueError(f"rate predictor horizon_s: must be >= 0, got {horizon_s!r}")
        self._evict(now)
        samples = self._samples
        if not samples:
            return 0.0
        if len(samples) < self.min_points:
            return samples[-1][1]
        # Ordinary least squares r = a + b·t on centred sums (stable for large t).
        n = len(samples)
        mean_t = math.fsum(t for t, _ in samples) / n
        mean_r = math.fsum(r for _, r in samples) / n
        s_tt = math.fsum((t - mean_t) ** 2 for t, _ in samples)
        if s_tt == 0:
            return mean_r
        s_tr = math.fsum((t - mean_t) * (r - mean_r) for t, r in samples)
        return max(0.0, mean_r + s_tr / s_tt * (now + horizon_s - mean_t))

    def __len__(self) -> int:
        return len(self._samples)

    def _evict(self, now: float) -> None:
        # A sample at t counts while now < t + history_s, like MissRatioWindow's time window.
        cutoff = now - self.history_s
        samples = self._samples
        while samples and samples[0][0] <= cutoff:
            samples.popleft()


@dataclass(frozen=True, slots=True)
class BackendEstimate:
    """Result of the n_B search (Swayam Fig. 4)."""

    backends: int  # smallest n meeting the target, or max_backends when none does
    meets_target: bool  # False: even max_backends misses the target
    utilisation: float  # rho = U·λ / (n·μ) at that n


def waiting_percentile_ms(
    utilisation: float,
    percentile: float,
    *,
    send_ms: float = 0.5,
    reply_ms: float = 0.5,
    retry_delay_ms: float = 1.0,
) -> float:
    """Swayam eq. (1): p-th percentile waiting time under random dispatch with retries."""
    _check_percentile(percentile)
    rho = utilisation
    if rho >= 1:
        return math.inf
    if rho <= 0 or 1 - percentile / 100 >= rho:
        return send_ms  # the first backend tried is idle with probability >= p/100
    attempts = math.log(1 - percentile / 100) / math.log(rho)
    return send_ms + (attempts - 1) * (send_ms + reply_ms + retry_delay_ms)


def _waiting_cdf(w: float, rho: float, send_ms: float, cycle_ms: float) -> float:
    """P(W <= w) for the waiting time whose percentiles are eq. (1)."""
    if w < send_ms:
        return 0.0
    if rho <= 0 or cycle_ms <= 0:
        return 1.0
    return 1.0 - rho ** (1.0 + (w - send_ms) / cycle_ms)


def _response_cdf(
    x: float, rho: float, service_ms: Sequence[float], send_ms: float, cycle_ms: float
) -> float:
    """P(W + S <= x): the waiting-time CDF convolved with the service-time samples."""
    return math.fsum(_waiting_cdf(x - s, rho, send_ms, cycle_ms) for s in service_ms) / len(
        service_ms
    )


def _central_response_cdf(
    x: float,
    n: int,
    rate_per_s: float,
    burst: float,
    service_ms: Sequence[float],
    send_ms: float,
    reply_ms: float,
) -> float:
    """P(W + d1 + S + d2 <= x) for a central FIFO queue over n backends (queueing_models).

    The gateway learns that a backend is free from its result, so a backend is held for
    d1 + S + d2 per request: that is the holding time of the queueing model.
    """
    hold_ms = math.fsum(service_ms) / len(service_ms) + send_ms + reply_ms
    rate_per_ms = rate_per_s * burst / 1000.0
    c = erlang_c(n, rate_per_ms * hold_ms)  # once per n, not once per service sample
    return math.fsum(
        central_waiting_cdf(x - send_ms - s - reply_ms, n, rate_per_ms, hold_ms, c)
        for s in service_ms
    ) / len(service_ms)


def response_percentile_ms(
    rate_per_s: float,
    service_quantiles_ms: Sequence[float],
    backends: int,
    *,
    percentile: float,
    burst: float = 1.0,
    send_ms: float = 0.5,
    reply_ms: float = 0.5,
    retry_delay_ms: float = 1.0,
) -> float:
    """Modelled p-th percentile response time (wait + service) with n backends; inf if unstable."""
    service = _check_service(service_quantiles_ms)
    _check_percentile(percentile)
    _check_delays(send_ms, reply_ms, retry_delay_ms)
    if isinstance(backends, bool) or not isinstance(backends, int) or backends < 1:
        raise PolicyValueError(f"swayam backends: must be an int >= 1, got {backends!r}")
    rho = _utilisation(rate_per_s, burst, service, backends)
    if rho >= 1:
        return math.inf
    cycle_ms = send_ms + reply_ms + retry_delay_ms
    target = percentile / 100
    lo = send_ms + min(service)
    hi = waiting_percentile_ms(
        rho, percentile, send_ms=send_ms, reply_ms=reply_ms, retry_delay_ms=retry_delay_ms
    ) + max(service)
    # Bisection on the (monotone) response CDF: the smallest x with P(R <= x) >= p/100.
    for _ in range(200):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if _response_cdf(mid, rho, service, send_ms, cycle_ms) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def estimate_backends(
    rate_per_s: float,
    service_quantiles_ms: Sequence[float],
    *,
    percentile: float,
    target_ms: float,
    burst: float = 1.0,
    max_backends: int = 1000,
    send_ms: float = 0.5,
    reply_ms: float = 0.5,
    retry_delay_ms: float = 1.0,
    dispatch: str = "retry",
    constraints: Sequence[tuple[float, float]] = (),
) -> BackendEstimate:
    """Smallest n whose modelled p-th percentile response time meets target_ms (Swayam §4.3).

    `dispatch` picks the waiting-time model: "retry" (Swayam eq. 1) or "central" (M/M/n).
    `constraints` (beyond the paper): more (percentile, target_ms) pairs that n must meet as
    well, one per request group (`task_targets`: each class's SLO at the task percentile its
    fanout needs).
    """
    if dispatch not in DISPATCHES:
        raise PolicyValueError(f"swayam dispatch: must be one of {DISPATCHES}, got {dispatch!r}")
    service = _check_service(service_quantiles_ms)
    _check_percentile(percentile)
    if not (target_ms > 0 and math.isfinite(target_ms)):
        raise PolicyValueError(f"swayam target_ms: must be > 0, got {target_ms!r}")
    if isinstance(max_backends, bool) or not isinstance(max_backends, int) or max_backends < 1:
        raise PolicyValueError(f"swayam max_backends: must be an int >= 1, got {max_backends!r}")
    _check_delays(send_ms, reply_ms, retry_delay_ms)
    cycle_ms = send_ms + reply_ms + retry_delay_ms
    targets = [(percentile, target_ms), *constraints]
    for p, t in targets[1:]:
        _check_percentile(p)
        if not (t > 0 and math.isfinite(t)):
            raise PolicyValueError(f"swayam constraint target_ms: must be > 0, got {t!r}")

    def meets(n: int) -> bool:
        if dispatch == "central":
            return all(
                _central_response_cdf(t, n, rate_per_s, burst, service, send_ms, reply_ms)
                >= p / 100
                for p, t in targets
            )
        rho = _utilisation(rate_per_s, burst, service, n)
        return rho < 1 and all(
            _response_cdf(t, rho, service, send_ms, cycle_ms) >= p / 100 for p, t in targets
        )

    # Stability needs rho < 1, i.e. n > offered load; above that P(R <= target) rises with n
    # (rho falls), so a binary search finds the smallest n (Fig. 4 suggests it for large n).
    offered = _utilisation(rate_per_s, burst, service, 1)
    lo = max(1, math.floor(offered) + 1)
    if lo > max_backends or not meets(max_backends):
        top = max_backends
        return BackendEstimate(top, False, _utilisation(rate_per_s, burst, service, top))
    hi = max_backends
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return BackendEstimate(lo, True, _utilisation(rate_per_s, burst, service, lo))


def task_targets(groups: Sequence[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """(task percentile, target ms) per request group (class percentile p, SLO ms, fanout k).

    Swayam sizes for one request per backend and one SLA. A fanout query of class c meets its
    p-th percentile SLO T_c when its k tasks all finish by T_c, and with independent tasks
    P(query <= T) = P(task <= T)^k (TailGuard eq. (1)), so each task must meet T_c at the
    percentile 100 (p/100)^(1/k) (about 100 - (100 - p)/k). One pair per distinct (p, T): the
    widest fanout's, the strictest. Beyond the paper.
    """
    strictest: dict[tuple[float, float], int] = {}
    for p, slo_ms, k in groups:
        _check_percentile(p)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise PolicyValueError(f"swayam group fanout: must be an int >= 1, got {k!r}")
        key = (p, slo_ms)
        strictest[key] = max(strictest.get(key, 1), k)
    return [(100.0 * (p / 100.0) ** (1.0 / k), t) for (p, t), k in sorted(strictest.items())]


def required_backends(
    rate_per_s: float,
    service_quantiles_ms: Sequence[float],
    *,
    percentile: float,
    target_ms: float,
    burst: float = 1.0,
    max_backends: int = 1000,
    send_ms: float = 0.5,
    reply_ms: float = 0.5,
    retry_delay_ms: float = 1.0,
    dispatch: str = "retry",
) -> int:
    """Smallest n meeting the p-th percentile target at rate * burst; max_backends if none does."""
    return estimate_backends(
        rate_per_s,
        service_quantiles_ms,
        percentile=percentile,
        target_ms=target_ms,
        burst=burst,
        max_backends=max_backends,
        send_ms=send_ms,
        reply_ms=reply_ms,
        retry_delay_ms=retry_delay_ms,
        dispatch=dispatch,
    ).backends


class IdleTracker:
    """Passive scale-in (Swayam): a backend idle for idle_s decommissions itself."""

    __slots__ = ("_last_s", "idle_s")

    def __init__(self, idle_s: float = 60.0, *, since: float | None = None) -> None:
        if not (idle_s > 0 and math.isfinite(idle_s)):
            raise PolicyValueError(f"idle tracker idle_s: must be > 0, got {idle_s!r}")
        self.idle_s = idle_s
        # The idle clock starts at `since` (the backend turned warm), else at the first call.
        self._last_s = since

    def task(self, now: float) -> None:
        """A task arrived or finished at `now`: the backend is in use."""
        if self._last_s is None or now > self._last_s:
            self._last_s = now

    def should_decommission(self, now: float, in_flight: int = 0) -> bool:
        """True once no task was seen for idle_s and none is running (§4.1: warm → cold)."""
        if self._last_s is None:
            self._last_s = now
        return in_flight <= 0 and now - self._last_s >= self.idle_s


class SwayamPolicy:
    """Swayam's frontend autoscaler: proactive scale-out, passive scale-in (Algorithm 1)."""

    def __init__(
        self,
        *,
        setup_s: float,
        burst: float,
        percentile: float,
        target_ms: float,
        min_backends: int = 1,
        max_backends: int = 64,
        history_s: float = 60.0,
        min_points: int = 3,
        send_ms: float = 0.5,
        reply_ms: float = 0.5,
        retry_delay_ms: float = 1.0,
        scale_in_interval_s: float | None = None,
        history: int = 100,
        dispatch: str = "retry",
    ) -> None:
        if dispatch not in DISPATCHES:
            raise PolicyValueError(
                f"swayam dispatch: must be one of {DISPATCHES}, got {dispatch!r}"
            )
        self.dispatch = dispatch
        if not (setup_s >= 0 and math.isfinite(setup_s)):
            raise PolicyValueError(f"swayam setup_s: must be >= 0, got {setup_s!r}")
        if not (burst >= 1 and math.isfinite(burst)):
            raise PolicyValueError(f"swayam burst: U must be >= 1, got {burst!r}")
        _check_percentile(percentile)
        if not (target_ms > 0 and math.isfinite(target_ms)):
            raise PolicyValueError(f"swayam target_ms: must be > 0, got {target_ms!r}")
        for name, value, least in (
            ("min_backends", min_backends, 1),
            ("max_backends", max_backends, 1),
            ("history", history, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise PolicyValueError(f"swayam {name}: must be an int >= {least}, got {value!r}")
        if min_backends > max_backends:
            raise PolicyValueError(
                f"swayam backends: min_backends={min_backends!r} > max_backends={max_backends!r}"
            )
        _check_delays(send_ms, reply_ms, retry_delay_ms)
        interval = setup_s if scale_in_interval_s is None else scale_in_interval_s
        if not (interval >= 0 and math.isfinite(interval)):
            raise PolicyValueError(
                f"swayam scale_in_interval_s: must be >= 0, got {scale_in_interval_s!r}"
            )
        self.setup_s = setup_s  # t_setup: prediction horizon
        self.burst = burst  # U
        self.percentile = percentile  # SL_min
        self.target_ms = target_ms  # RT_max
        self.min_backends = min_backends
        self.max_backends = max_backends
        self.send_ms = send_ms  # d1
        self.reply_ms = reply_ms  # d2
        self.retry_delay_ms = retry_delay_ms  # Δ
        self.scale_in_interval_s = interval  # RegulateScaleDown's minimum gap
        self.predictor = RatePredictor(history_s=history_s, min_points=min_points)
        self.in_use = min_backends  # n: gateways route to backend_order(ids)[:in_use]
        self.last_estimate: BackendEstimate | None = None
        self._service_ms: tuple[float, ...] | None = None
        self._last_scale_in_s: float | None = None
        self._history = DecisionLog(history)
        self.constraints: tuple[tuple[float, float], ...] = ()
        """More (task percentile, target ms) pairs n must meet: the request groups' (see
        `task_targets`); () sizes for (percentile, target_ms) alone, as the paper."""
        self.violations = 0
        """SLA violations reported (Algorithm 1 line 4), each one a reason to decide now."""

    def observe(
        self,
        now: float,
        rate_per_s: float,
        service_quantiles_ms: Sequence[float],
        frontends: int = 1,
    ) -> None:
        """Feed the local request rate (times n_F gateways, §4.2) and the current service times."""
        if isinstance(frontends, bool) or not isinstance(frontends, int) or frontends < 1:
            raise PolicyValueError(f"swayam frontends: must be an int >= 1, got {frontends!r}")
        self._service_ms = _check_service(service_quantiles_ms)
        self.predictor.observe(now, rate_per_s * frontends)

    def set_delays(self, send_ms: float, reply_ms: float) -> None:
        """d1 and d2 of eq. (1) as measured on the links, in place of the configured ones."""
        _check_delays(send_ms, reply_ms, self.retry_delay_ms)
        self.send_ms, self.reply_ms = send_ms, reply_ms

    def set_groups(self, groups: Sequence[tuple[float, float, int]]) -> None:
        """The request groups (class percentile, SLO ms, fanout) now arriving: n_B must meet
        each one's task target (`task_targets`), not only the policy's own."""
        self.constraints = tuple(task_targets(groups))

    def decide(self, now: float, active: int) -> ScaleDecision:
        """Scale out to n_B(predicted rate at now + t_setup); scale-in is left to idle backends."""
        if self._service_ms is None:
            estimate = None
            target = self.min_backends
            rate = 0.0
        else:
            rate = self.predictor.predict(now, self.setup_s)
            # With request groups, each group's own task target replaces the policy's one
            # (the tightest class's SLO applied to every task).
            (percentile, target_ms), *more = self.constraints or (
                (self.percentile, self.target_ms),
            )
            estimate = estimate_backends(
                rate,
                self._service_ms,
                percentile=percentile,
                target_ms=target_ms,
                burst=self.burst,
                max_backends=self.max_backends,
                send_ms=self.send_ms,
                reply_ms=self.reply_ms,
                retry_delay_ms=self.retry_delay_ms,
                dispatch=self.dispatch,
                constraints=more,
            )
            target = max(self.min_backends, estimate.backends)
        self.last_estimate = estimate
        # Algorithm 1 lines 15-19: grow n at once; shrink it at most once per interval
        # (RegulateScaleDown), so n does not flap between x and x + 1.
        if target > self.in_use:
            self.in_use = target
        elif target < self.in_use and (
            self._last_scale_in_s is None or now - self._last_scale_in_s >= self.scale_in_interval_s
        ):
            self.in_use = target
            self._last_scale_in_s = now
        delta = max(0, self.in_use - active)  # warm-up requests to B_{active+1..n}
        if estimate is not None and not estimate.meets_target:
            reason = "target_unreachable"
        elif delta > 0:
            reason = "scale_out" if estimate is not None else "below_min"
        elif estimate is None:
            reason = "no_data"
        elif self.in_use < active:
            reason = "passive_scale_in"  # backends beyond n go idle and retire (IdleTracker)
        else:
            reason = "sufficient"
        decision = ScaleDecision(delta, reason, active + delta)
        self._history.record(
            {
                "time": now,
                "predicted_rate_per_s": rate,
                "required": target,
                "in_use": self.in_use,
                "active": active,
                "delta": delta,
                "reason": reason,
            },
            (reason, target, self.in_use, active),
        )
        return decision

    def snapshot(self, now: float) -> dict:
        """Settings, the in-use count, the last estimate and the last decisions."""
        estimate = self.last_estimate
        return {
            "now": now,
            "setup_s": self.setup_s,
            "burst": self.burst,
            "percentile": self.percentile,
            "target_ms": self.target_ms,
            "min_backends": self.min_backends,
            "max_backends": self.max_backends,
            "send_ms": self.send_ms,
            "reply_ms": self.reply_ms,
            "retry_delay_ms": self.retry_delay_ms,
            "in_use": self.in_use,
            "samples": len(self.predictor),
            "task_targets": [
                {"percentile": round(p, 6), "target_ms": t} for p, t in self.constraints
            ],
            "violations": self.violations,
            "estimate": None
            if estimate is None
            else {
                "backends": estimate.backends,
                "meets_target": estimate.meets_target,
                "utilisation": estimate.utilisation,
            },
            "decisions": self._history.entries(),
        }


_DIGITS = re.compile(r"(\d+)")


def _natural_key(backend_id: str) -> tuple:
    # re.split with a capture group alternates text and digit runs, starting with text, so
    # the tuples compare str to str and int to int; the raw id breaks ties ("b01" vs "b1").
    parts = _DIGITS.split(backend_id)
    return (tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), backend_id)


def backend_order(backend_ids: Sequence[str]) -> list[str]:
    """The fixed backend order all gateways fill from: natural sort of ids ("ts-2" < "ts-10")."""
    ids = list(backend_ids)
    if len(set(ids)) != len(ids):
        raise PolicyValueError(f"backend_order: backend ids repeat in {ids!r}")
    # Swayam §4.4: every frontend holds the same ordered map B, ordered by unique host ids,
    # and sends requests only to its prefix B_1..B_n; any total order on ids that does not
    # depend on input order works, and the natural one reads well on dashboards.
    return sorted(ids, key=_natural_key)


def _utilisation(rate_per_s: float, burst: float, service_ms: Sequence[float], n: int) -> float:
    """rho = U·λ / (n·μ) with μ = 1000 / mean service ms."""
    if not (rate_per_s >= 0 and math.isfinite(rate_per_s)):
        raise PolicyValueError(f"swayam rate_per_s: must be >= 0, got {rate_per_s!r}")
    if not (burst >= 1 and math.isfinite(burst)):
        raise PolicyValueError(f"swayam burst: U must be >= 1, got {burst!r}")
    mean_ms = math.fsum(service_ms) / len(service_ms)
    return rate_per_s * burst * mean_ms / (1000.0 * n)


def _check_service(service_quantiles_ms: Sequence[float]) -> tuple[float, ...]:
    service = tuple(float(s) for s in service_quantiles_ms)
    if not service:
        raise PolicyValueError("swayam service_quantiles_ms: need at least one value")
    if not all(s >= 0 and math.isfinite(s) for s in service) or max(service) <= 0:
        raise PolicyValueError(
            f"swayam service_quantiles_ms: need finite values >= 0, not all 0, got {service!r}"
        )
    return service


def _check_delays(send_ms: float, reply_ms: float, retry_delay_ms: float) -> None:
    for name, value in (
        ("send_ms", send_ms),
        ("reply_ms", reply_ms),
        ("retry_delay_ms", retry_delay_ms),
    ):
        if not (value >= 0 and math.isfinite(value)):
            raise PolicyValueError(f"swayam {name}: must be >= 0, got {value!r}")


def _check_percentile(percentile: float) -> None:
    if not (0 < percentile < 100):
        raise PolicyValueError(f"swayam percentile: must be in (0, 100), got {percentile!r}")
