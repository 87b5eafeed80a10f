"""Horizontal autoscaling of one pool of backends on a virtual clock (Swayam §4, TailGuard §III.E).

Single-task requests (k_f = 1) arrive by a piecewise-linear rate trace. The gateway holds
them in one FIFO queue (central queueing, TailGuard Fig. 2) and hands the head request to
the first free backend of the routable set, in `backend_order`; a backend serves one
request at a time. Filling low-order backends first leaves the high-order ones idle, which
is what lets passive scale-in work.

Backends live through warming (t_setup) → warm → retired. The autoscaler under test decides
once per interval, with the same policy objects the gateway runs:

- ``swayam``: `SwayamPolicy` (rate prediction at horizon t_setup, burst factor U, n_B search
  with the central-queue waiting-time model) sets n; the gateway routes to the first n warm
  backends, and a backend beyond them with no request for T retires itself (`IdleTracker`).
- ``threshold``: `ThresholdAutoscaler` on the windowed task deadline-miss ratio; a request
  misses when it leaves the gateway queue after t_D = t0 + target - x_p^u(1) (TailGuard
  eq. (4) with k_f = 1); a step up starts only the backends it needs beyond those started
  (warm ones outside the routable set count); a step down stops routing to the last backend,
  which then retires once idle.
- ``static``: the always-over-provisioned baseline: from the start, the backends Swayam's
  model asks for at the trace's peak rate (times U), never scaled.

With ``dispatch="random"`` (`simulate_pool`) the pool is routed as the live gateway routes a
server-queueing pool instead (gateway.targets, Swayam §4.4): each request goes at once to a
random backend of the routable set and waits in that backend's own FIFO queue; a miss is
judged at that backend's dequeue and reaches the window with the result; no request moves to
a spare backend; and Swayam (and static provisioning) size the pool with the model of random
dispatch (Swayam eq. (1), ``dispatch="retry"``), as the live autoscaler does for such a pool.
The default, ``"central"``, is the model above.

`bursty_trace` draws a rate trace with bursts from a seed (the experiments' traces).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from admission import (
    IdleTracker,
    MissRatioWindow,
    SwayamPolicy,
    ThresholdAutoscaler,
    backend_order,
    estimate_backends,
)
from loadtests.sim.scenario import read_scenario_toml, resolve_service_path
from loadtests.sim.tailbench import PREFIX as TAILBENCH_PREFIX
from loadtests.sim.workload import sample_service_ms
from taskserver.service_time import ServiceSpec, make_distribution
from taskserver.tomlconfig import ConfigError, build

_DONE, _DECIDE, _ARRIVE = 0, 1, 2  # at equal times: free slots first, then decide


@dataclass(frozen=True, slots=True)
class PoolScenario:
    """One pool, a rate trace and the autoscaler settings."""

    service: ServiceSpec
    """Service time of one request on one backend."""
    trace_s: tuple[float, ...] = (0.0, 40.0, 45.0, 75.0, 80.0, 120.0)
    """Times of the corners of a piecewise-linear rate trace (s, ascending, from 0)."""
    trace_rate: tuple[float, ...] = (1.0, 1.0, 2.0, 2.0, 1.0, 1.0)
    """Rate multiplier at each corner: a 2x burst by default."""
    base_rate_per_s: float = 2000.0
    """Request rate at multiplier 1."""
    percentile: float = 99.0
    """SLO percentile p (SL_min)."""
    target_ms: float = 6.0
    """SLO response time at p (RT_max)."""
    setup_s: float = 5.0
    """t_setup: a new backend serves this long after it is started."""
    idle_s: float = 10.0
    """T: a backend with no request for this long retires (passive scale-in)."""
    interval_s: float = 1.0
    """Autoscaler decision period."""
    burst: float = 1.5
    """Swayam's burst factor U."""
    history_s: float = 15.0
    """Swayam's rate-regression history."""
    send_ms: float = 0.5
    """d1: gateway to backend."""
    reply_ms: float = 0.5
    """d2: backend to gateway."""
    upper: float = 0.015
    """Threshold autoscaler: R_sth^U."""
    lower: float = 0.005
    """Threshold autoscaler: R_sth^L."""
    window_tasks: int = 5_000
    """Threshold autoscaler: miss-ratio window in tasks."""
    up_cooldown_s: float = 5.0
    """Threshold autoscaler: least time between steps up (one t_setup)."""
    down_cooldown_s: float = 15.0
    """Threshold autoscaler: least time after any step before a step down."""
    min_backends: int = 1
    max_backends: int = 64
    window_requests: int = 1000
    """SLO compliance is judged per window of this many requests."""
    seed: int = 1
    name: str = "pool"
    """Shown in reports."""
    description: str = ""
    """One line shown in reports."""

    def __post_init__(self) -> None:
        if len(self.trace_s) < 2 or len(self.trace_s) != len(self.trace_rate):
            raise ValueError("trace_s: need >= 2 corners, as many as trace_rate")
        if self.trace_s[0] != 0 or list(self.trace_s) != sorted(self.trace_s):
            raise ValueError(f"trace_s: must ascend from 0, got {list(self.trace_s)}")
        if any(not (m >= 0 and math.isfinite(m)) for m in self.trace_rate) or not any(
            self.trace_rate
        ):
            raise ValueError(f"trace_rate: must be >= 0, not all 0, got {list(self.trace_rate)}")
        for name in ("base_rate_per_s", "target_ms", "interval_s", "idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if not 0 < self.percentile < 100:
            raise ValueError(f"percentile: must be in (0, 100), got {self.percentile}")
        if not 1 <= self.min_backends <= self.max_backends:
            raise ValueError("min_backends: need 1 <= min_backends <= max_backends")

    def rate_at(self, t_s: float) -> float:
        """Request rate (per s) at time t_s."""
        return self.base_rate_per_s * float(np.interp(t_s, self.trace_s, self.trace_rate))

    @property
    def duration_s(self) -> float:
        """Length of the trace."""
        return self.trace_s[-1]


@dataclass(slots=True)
class PoolResult:
    """What one run of the pool did."""

    policy: str
    response_ms: np.ndarray
    """Response time of each request, in arrival order."""
    timeline: list[dict[str, float]]
    """Per decision: time, offered rate, warm / warming / routable backends."""
    actions: list[dict[str, float | str]] = field(default_factory=list)
    backend_seconds: float = 0.0
    """Time integral of backends started and not retired (warming ones included)."""
    miss_ratio: float = 0.0
    predictions: list[tuple[float, float]] = field(default_factory=list)
    """swayam: (decision time s, the rate it predicted for that time + t_setup, per s)."""

    def compliance(self, scn: PoolScenario) -> float:
        """Fraction of consecutive windows of requests whose p-th response time meets target."""
        n = scn.window_requests
        windows = self.response_ms.size // n
        if windows == 0:
            return math.nan
        blocks = self.response_ms[: windows * n].reshape(windows, n)
        tails = np.percentile(blocks, scn.percentile, axis=1)
        return float(np.mean(tails <= scn.target_ms))


@dataclass(slots=True)
class _Backend:
    bid: str
    started_s: float
    ready_s: float
    busy: bool = False
    retired_s: float | None = None
    idle: IdleTracker | None = None
    free_ms: float = 0.0
    """dispatch "random": when this backend's own queue has drained (ms)."""


def _arrivals(scn: PoolScenario, rng: random.Random) -> list[float]:
    """Non-homogeneous Poisson arrivals (ms) by thinning at the trace's peak rate."""
    peak = max(scn.trace_rate) * scn.base_rate_per_s / 1000.0  # per ms
    out, t, end = [], 0.0, scn.duration_s * 1000.0
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        if rng.random() * peak <= scn.rate_at(t / 1000.0) / 1000.0:
            out.append(t)


POLICIES = ("swayam", "threshold", "static")
"""How the pool is scaled (see the module doc)."""
DISPATCHES = ("central", "random")
"""How requests reach backends: one central FIFO queue, or a random backend's own queue."""
_ROUTE_STREAM = 0x726F757465
"""Mixed into the seed for the random mode's backend picks (a stream of their own)."""


def _model(scn: PoolScenario, dispatch: str) -> dict[str, Any]:
    """Swayam's sizing settings; the waiting-time model follows the dispatch."""
    return {
        "percentile": scn.percentile,
        "target_ms": scn.target_ms,
        "burst": scn.burst,
        "max_backends": scn.max_backends,
        "send_ms": scn.send_ms,
        "reply_ms": scn.reply_ms,
        # The live autoscaler sizes a server-queueing pool with random dispatch (eq. (1)).
        "dispatch": "central" if dispatch == "central" else "retry",
    }


def initial_backends(scn: PoolScenario, policy: str, dispatch: str = "central") -> int:
    """Backends running at time 0: the model's n for the starting rate, or for the trace's
    peak rate with static provisioning."""
    dist = make_distribution(scn.service)
    rate = scn.rate_at(0.0)
    if policy == "static":
        rate = scn.base_rate_per_s * max(scn.trace_rate)
    return estimate_backends(rate, dist.quantiles(200), **_model(scn, dispatch)).backends


def bursty_trace(
    seed: int,
    *,
    duration_s: float = 600.0,
    mean_gap_s: float = 90.0,
    peak: tuple[float, float] = (1.5, 3.0),
    hold_s: tuple[float, float] = (10.0, 40.0),
    ramp_s: tuple[float, float] = (1.0, 8.0),
    drift: float = 0.2,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A piecewise-linear rate trace (corner times s, multipliers) with bursts, from a seed.

    The base multiplier wanders by up to ±`drift` between bursts (a corner every ~30 s);
    bursts start after exponential gaps of mean `mean_gap_s`, ramp up over a uniform
    `ramp_s` to a uniform `peak` times the base, hold for a uniform `hold_s`, and ramp down
    as fast. The shapes of Swayam's production traces (sudden bursts over a slowly varying
    base) without their data.
    """
    rng = random.Random(seed)
    times, rates = [0.0], [1.0]
    t = 0.0
    next_burst = rng.expovariate(1.0 / mean_gap_s)
    while t < duration_s:
        if next_burst < t + 30.0:
            t = next_burst
            base = rates[-1]
            up, hold, down = (rng.uniform(*ramp_s), rng.uniform(*hold_s), rng.uniform(*ramp_s))
            top = base * rng.uniform(*peak)
            for dt, r in ((0.0, base), (up, top), (hold, top), (down, base)):
                t += dt
                times.append(t)
                rates.append(r)
            next_burst = t + rng.expovariate(1.0 / mean_gap_s)
        else:
            t += 30.0
            times.append(t)
            rates.append(min(max(rates[-1] + rng.uniform(-drift, drift) / 2, 1 - drift), 1 + drift))
    keep = [i for i, x in enumerate(times) if x <= duration_s]
    times = [times[i] for i in keep] + ([duration_s] if times[keep[-1]] < duration_s else [])
    rates = [rates[i] for i in keep] + ([rates[keep[-1]]] if len(times) > len(keep) else [])
    # Corners at equal times (a zero-length ramp) are kept in order: np.interp takes the last.
    return tuple(times), tuple(rates)


def simulate_pool(scn: PoolScenario, policy: str, dispatch: str = "central") -> PoolResult:
    """Run the trace under `swayam` or `threshold` autoscaling, or `static` provisioning,
    with one central FIFO queue or, `dispatch="random"`, a random backend's queue each."""
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    if dispatch not in DISPATCHES:
        raise ValueError(f"dispatch: must be one of {', '.join(DISPATCHES)}, got {dispatch!r}")
    central = dispatch == "central"
    picker = random.Random(scn.seed ^ _ROUTE_STREAM)
    rng = random.Random(scn.seed)
    arrivals = _arrivals(scn, rng)
    service = sample_service_ms(
        scn.service, np.random.default_rng(scn.seed).random(len(arrivals))
    ).tolist()
    dist = make_distribution(scn.service)
    quantiles = dist.quantiles(200)
    unloaded_ms = scn.send_ms + dist.quantile(scn.percentile / 100.0) + scn.reply_ms
    budget_ms = scn.target_ms - unloaded_ms  # T_b = SLO - x_p^u(1), TailGuard eq. (4)
    model = _model(scn, dispatch)
    start_n = initial_backends(scn, policy, dispatch)
    backends: list[_Backend] = []

    def add_backend(now_s: float, ready_s: float) -> None:
        b = _Backend(f"b{len(backends) + 1}", now_s, ready_s)
        b.idle = IdleTracker(scn.idle_s, since=ready_s)
        backends.append(b)

    for _ in range(start_n):
        add_backend(0.0, 0.0)
    swayam = SwayamPolicy(
        setup_s=scn.setup_s,
        min_backends=scn.min_backends,
        history_s=scn.history_s,
        **{k: v for k, v in model.items()},
    )
    swayam.in_use = start_n
    threshold = ThresholdAutoscaler(
        upper=scn.upper,
        lower=scn.lower,
        min_replicas=scn.min_backends,
        max_replicas=scn.max_backends,
        up_cooldown_s=scn.up_cooldown_s,
        down_cooldown_s=scn.down_cooldown_s,
    )
    target_n = start_n  # threshold: the replica count asked for
    window = MissRatioWindow(window_tasks=scn.window_tasks)

    response = [math.nan] * len(arrivals)
    events: list[tuple[float, int, int]] = [(t, _ARRIVE, i) for i, t in enumerate(arrivals)]
    events += [
        (k * scn.interval_s * 1000.0, _DECIDE, k)
        for k in range(1, int(scn.duration_s / scn.interval_s) + 1)
    ]
    heapq.heapify(events)
    timeline: list[dict[str, float]] = []
    actions: list[dict[str, float | str]] = []
    routable: list[_Backend] = list(backends)
    spare: list[_Backend] = []
    waiting: deque[int] = deque()
    arrived_in_interval = 0
    misses = 0
    predictions: list[tuple[float, float]] = []
    # dispatch "random": each request's miss (the gateway learns it with the result) and backend
    late_of = [False] * (0 if central else len(arrivals))
    backend_of = [0] * (0 if central else len(arrivals))

    def start(b: _Backend, i: int, t: float) -> None:
        nonlocal misses
        b.busy = True
        assert b.idle is not None
        b.idle.task(t / 1000.0)
        # Central queueing: the miss is judged at the dequeue, t > t_D (gateway/links.py _pump).
        late = t - arrivals[i] > budget_ms
        misses += late
        window.record(late, t / 1000.0)
        # The result is the gateway's idle signal.
        back = t + scn.send_ms + service[i] + scn.reply_ms
        response[i] = back - arrivals[i]
        heapq.heappush(events, (back, _DONE, backends.index(b)))

    def dispatch(t: float) -> None:
        for b in routable:
            if not waiting:
                return
            if not b.busy:
                start(b, waiting.popleft(), t)
        # A request about to miss its deadline goes to a warm backend not in use (Swayam
        # §4.1: frontends "instantaneously transition warm-not-in-use backends to warm-in-use
        # backends by sending them requests" when load rises unexpectedly).
        for b in spare:
            if not waiting or t - arrivals[waiting[0]] < budget_ms:
                return
            if not b.busy and b.retired_s is None:
                start(b, waiting.popleft(), t)

    def route(i: int, t: float) -> None:
        """dispatch "random": to a random routable backend's FIFO queue at once."""
        nonlocal misses
        b = picker.choice(routable or [x for x in backends if x.retired_s is None])
        assert b.idle is not None
        b.idle.task(t / 1000.0)
        begin = max(t + scn.send_ms, b.free_ms)
        b.free_ms = begin + service[i]
        # The server dequeues it after its deadline t_D = arrival + budget (server queueing:
        # the budget travels with the task, less the way there).
        late = begin - t > budget_ms
        misses += late
        late_of[i] = late
        backend_of[i] = backends.index(b)
        response[i] = b.free_ms + scn.reply_ms - t
        heapq.heappush(events, (b.free_ms + scn.reply_ms, _DONE, i))

    while events:
        t, kind, i = heapq.heappop(events)
        now_s = t / 1000.0
        if kind == _ARRIVE and not central:
            arrived_in_interval += 1
            route(i, t)
            continue
        if kind == _DONE and not central:
            b = backends[backend_of[i]]
            assert b.idle is not None
            b.idle.task(now_s)
            window.record(late_of[i], now_s)
            continue
        if kind == _ARRIVE:
            arrived_in_interval += 1
            waiting.append(i)
            dispatch(t)
            continue
        if kind == _DONE:
            backends[i].busy = False
            assert backends[i].idle is not None
            backends[i].idle.task(now_s)
            dispatch(t)
            continue
        # _DECIDE
        rate = arrived_in_interval / scn.interval_s
        arrived_in_interval = 0
        started = [b for b in backends if b.retired_s is None]
        if policy == "swayam":
            swayam.observe(now_s, rate, quantiles)
            d = swayam.decide(now_s, len(started))
            for _ in range(d.delta):
                add_backend(now_s, now_s + scn.setup_s)
            if d.delta:
                actions.append({"time_s": now_s, "delta": d.delta, "reason": d.reason})
            predictions.append((now_s, swayam.predictor.predict(now_s, scn.setup_s)))
        elif policy == "static":
            pass
        elif window.count(now_s) >= scn.window_tasks // 4:
            ratio = window.ratio(now_s)
            d = threshold.decide(ratio, target_n, now_s)
            if d.delta:
                actions.append(
                    {"time_s": now_s, "delta": d.delta, "reason": d.reason, "miss_ratio": ratio}
                )
                window = MissRatioWindow(window_tasks=scn.window_tasks)
            # Like the Swayam path: warm backends outside the routable set count first.
            for _ in range(max(0, d.replicas - len(started))):
                add_backend(now_s, now_s + scn.setup_s)
            target_n = d.replicas
        warm = {b.bid: b for b in backends if b.retired_s is None and b.ready_s <= now_s}
        n = swayam.in_use if policy == "swayam" else target_n
        ordered = [warm[bid] for bid in backend_order(list(warm))]
        routable, spare = ordered[:n], ordered[n:]
        in_route = {b.bid for b in routable}
        # Passive scale-in: a warm backend outside the routable set idles and retires itself.
        for b in warm.values():
            assert b.idle is not None
            busy = b.busy if central else b.free_ms > t
            if b.bid not in in_route and b.idle.should_decommission(now_s, int(busy)):
                b.retired_s = now_s
        dispatch(t)
        timeline.append(
            {
                "time_s": now_s,
                "rate_per_s": rate,
                "warm": sum(1 for b in warm.values() if b.retired_s is None),
                "warming": sum(1 for b in backends if b.retired_s is None and b.ready_s > now_s),
                "routable": len(routable),
            }
        )
    end_s = scn.duration_s
    seconds = sum(
        (b.retired_s if b.retired_s is not None else end_s) - b.started_s for b in backends
    )
    return PoolResult(
        policy,
        np.asarray(response),
        timeline,
        actions,
        backend_seconds=seconds,
        miss_ratio=misses / max(1, len(arrivals)),
        predictions=predictions,
    )


def summary_rows(scn: PoolScenario, results: Sequence[PoolResult]) -> list[list[object]]:
    """One table row per policy: compliance, p-th response, backend-seconds, peak, misses."""
    rows: list[list[object]] = []
    for r in results:
        rows.append(
            [
                r.policy,
                f"{r.compliance(scn):.1%}",
                f"{np.percentile(r.response_ms, scn.percentile):.2f}",
                f"{r.backend_seconds:.0f}",
                max(int(p["warm"]) for p in r.timeline),
                len(r.actions),
                f"{r.miss_ratio:.2%}",
            ]
        )
    return rows


def load_pool_scenario(path: str | Path, data_dir: str | Path | None = None) -> PoolScenario:
    """Load a pool scenario TOML; the service file is looked up in data_dir when given, else
    as the scenario names it (``tailbench:APP``: the shipped table)."""
    p = Path(path)
    data = read_scenario_toml(p)
    try:
        scn = build(PoolScenario, data)
        given = scn.service.path
        if data_dir is not None and given:
            if given.startswith(TAILBENCH_PREFIX):
                name = f"{given.removeprefix(TAILBENCH_PREFIX)}_quantiles.txt"
            else:
                name = Path(given).name
            resolved: str | None = str(Path(data_dir) / name)
        else:
            resolved = resolve_service_path(given, p.parent)
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, str(p)) from None
    return replace(scn, service=replace(scn.service, path=resolved))
