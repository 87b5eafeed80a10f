"""Per-module worker scaling at run time (PARD §5.1 resource scaling), one policy for all shells.

PARD §5.1: PARD "adopts dynamic batching and resource scaling similar to [Nexus]: yields
feasible batch sizes and per-worker throughput based on offline profiling, and adjusts the
number of workers per module based on request rate and per-worker throughput at runtime";
§2: "during workload bursts, resources cannot scale up instantly due to model cold starts",
which is when dropping is needed. The paper gives no formula beyond that; the choices here:

- Rate r_k: arrivals at module k in the trailing ``rate_window_s`` (default 2 s), divided by
  that window, or by the time since the scaler started while that is shorter (a window not
  yet full would read as a falling rate). The shells count arrivals and hand them in at each
  decision (every ``period_s``), stamped with the decision's time.
- Per-worker throughput mu_k = b_k / d_k(b_k): one worker's requests per second at the batch
  size the module collects up to (the shells pass it: the largest feasible size, its d_k
  from the offline profile times the module's measured duration scale, if any).
- Workers wanted: ceil(r_k / mu_k * ``headroom``), clipped to [``min_workers``,
  ``max_workers``]; headroom 1.2 keeps each worker at <= 83% of its profiled throughput, so
  the queues stay short and batch waits, not queueing, dominate (the regime of PARD §4.3's
  LBF). The paper names no headroom; 1.2 is our choice.
- Cold start: a started worker serves only ``cold_start_s`` later (the live shell also waits
  for its session to be built and warmed); it counts towards the module's workers at once, so
  the next decision does not start it again.
- Scale-in: to the largest number wanted over the trailing ``hold_s`` (a stabilisation
  window): a dip shorter than the hold stops nothing. The workers a module starts with count
  as wanted at the start, so nothing stops within ``hold_s`` of it. Starting workers are
  stopped first (the newest), then ready ones.
- Cap: ``total_workers`` (the devices or cores of the host) bounds the sum over the
  pipeline's modules. When the wanted workers exceed it, free places go one at a time to the
  module with the highest load per worker r_k / (n_k mu_k) (ties: module order).

Pure: time comes in as `now`; the object starts, stops and builds nothing, it only says how
many to start and stop per module (`ScalingDecision`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ModuleScaling", "ScalingConfig", "ScalingDecision", "WorkerScaler"]


def _number(name: str, value: object, *, low: float, strict: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if strict else value < low):  # type: ignore[operator]
        sign = ">" if strict else ">="
        raise ValueError(f"workers {name}: must be a finite number {sign} {low:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"workers {name}: must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    """Settings of run-time worker scaling (``workers = "auto"``)."""

    min_workers: int = 1
    """Workers a module keeps however low its rate (and starts with)."""
    max_workers: int = 4
    """Most workers one module may have."""
    total_workers: int | None = None
    """Most workers over all modules of the pipeline (devices or cores); None: no such cap."""
    cold_start_s: float = 2.0
    """A started worker serves this long after the decision that started it."""
    hold_s: float = 10.0
    """Scale-in goes to the most workers wanted over this trailing window."""
    headroom: float = 1.2
    """Workers wanted = ceil(rate / per-worker throughput x this)."""
    rate_window_s: float = 2.0
    """The request rate is the arrivals of this trailing window over its length."""
    period_s: float = 0.5
    """How often the shells decide."""

    def __post_init__(self) -> None:
        _count("min_workers", self.min_workers)
        _count("max_workers", self.max_workers)
        if self.max_workers < self.min_workers:
            raise ValueError(
                f"workers max_workers: must be >= min_workers ({self.min_workers}), "
                f"got {self.max_workers!r}"
            )
        if self.total_workers is not None:
            _count("total_workers", self.total_workers)
        _number("cold_start_s", self.cold_start_s, low=0.0, strict=False)
        _number("hold_s", self.hold_s, low=0.0, strict=False)
        if _number("headroom", self.headroom, low=0.0, strict=True) < 1.0:
            raise ValueError(f"workers headroom: must be >= 1, got {self.headroom!r}")
        _number("rate_window_s", self.rate_window_s, low=0.0, strict=True)
        _number("period_s", self.period_s, low=0.0, strict=True)


@dataclass(frozen=True, slots=True)
class ModuleScaling:
    """One module's part of a decision."""

    module_id: str
    rate_rps: float
    """r_k over the rate window."""
    worker_rps: float
    """mu_k: one worker's throughput at the module's batch size."""
    wanted: int
    """ceil(r_k / mu_k x headroom), clipped to [min, max] (before the pipeline cap)."""
    ready: int
    """Workers serving after this decision."""
    starting: int
    """Workers started and still in their cold start after this decision."""
    start: int
    """Workers to start now (each serves at ``ready_at_s``)."""
    stop: int
    """Workers to stop now: ``stop_starting`` of them still starting, the rest ready."""
    stop_starting: int
    ready_at_s: float
    """When the workers started now begin to serve."""
    became_ready: int
    """Workers whose cold start ended since the last decision."""

    @property
    def workers(self) -> int:
        """Ready and starting workers."""
        return self.ready + self.starting


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """What to do at one decision time, per module (in the order the modules were given)."""

    now: float
    modules: tuple[ModuleScaling, ...]

    def of(self, module_id: str) -> ModuleScaling:
        """The part of one module (KeyError if it is not scaled)."""
        for m in self.modules:
            if m.module_id == module_id:
                return m
        raise KeyError(f"workers: no module {module_id!r} in this decision")


class _Module:
    __slots__ = ("arrivals", "ready", "started", "starting", "stopped", "wanted")

    def __init__(self, ready: int) -> None:
        self.ready = ready
        self.starting: list[float] = []  # ready-at times, oldest first
        self.arrivals: deque[tuple[float, int]] = deque()
        self.wanted: deque[tuple[float, int]] = deque()  # (decision time, wanted)
        self.started = 0
        self.stopped = 0


class WorkerScaler:
    """Workers per module of one pipeline from its request rates (see the module docstring)."""

    def __init__(
        self,
        config: ScalingConfig,
        modules: Sequence[str],
        *,
        initial: Mapping[str, int] | None = None,
        start_s: float = 0.0,
    ) -> None:
        """Start with `initial` ready workers per module (default ``min_workers``, clipped) at
        `start_s` (the shells' clock; `start` moves it)."""
        if not modules or len(set(modules)) != len(modules):
            raise ValueError(f"workers modules: need distinct module ids, got {list(modules)!r}")
        self.config = config
        self._order = tuple(str(m) for m in modules)
        first = dict(initial or {})
        self._modules: dict[str, _Module] = {}
        for m in self._order:
            n = _count(f"initial[{m!r}]", first.get(m, config.min_workers))
            self._modules[m] = _Module(min(max(n, config.min_workers), config.max_workers))
        total = sum(s.ready for s in self._modules.values())
        if config.total_workers is not None and total > config.total_workers:
            raise ValueError(
                f"workers total_workers: {config.total_workers} is below the {total} workers "
                f"the modules start with"
            )
        self._start = 0.0
        self.start(start_s)

    def start(self, now: float) -> None:
        """The shell starts deciding at `now`: the rate window and the scale-in hold count
        from here, and the workers each module has now count as wanted at `now`."""
        self._start = float(now)
        for state in self._modules.values():
            state.wanted = deque([(self._start, state.ready + len(state.starting))])

    @property
    def modules(self) -> tuple[str, ...]:
        """The scaled modules, in the order given."""
        return self._order

    def _module(self, module_id: str) -> _Module:
        try:
            return self._modules[module_id]
        except KeyError:
            raise KeyError(f"workers: no module {module_id!r} in {self._order}") from None

    def record_arrivals(self, module_id: str, count: int, now: float) -> None:
        """`count` requests arrived at `module_id` by `now`."""
        if count:
            self._module(module_id).arrivals.append((now, count))

    def rate_rps(self, module_id: str, now: float) -> float:
        """Arrivals in (now - rate_window_s, now] over rate_window_s (over the time since the
        start while that is shorter)."""
        window = self.config.rate_window_s
        arrivals = self._module(module_id).arrivals
        while arrivals and arrivals[0][0] <= now - window:
            arrivals.popleft()
        span = min(window, now - self._start)
        return sum(n for t, n in arrivals if t <= now) / (span if span > 0 else window)

    def workers(self, module_id: str) -> tuple[int, int]:
        """(ready, starting) workers of a module."""
        state = self._module(module_id)
        return state.ready, len(state.starting)

    def actions(self, module_id: str) -> tuple[int, int]:
        """(started, stopped) workers of a module since the scaler was made."""
        state = self._module(module_id)
        return state.started, state.stopped

    def abandon(self, module_id: str) -> None:
        """A started worker could not start (its model failed to load): forget it."""
        state = self._module(module_id)
        if state.starting:
            state.starting.pop()
        elif state.ready > 0:  # its cold start had passed before the shell gave up on it
            state.ready -= 1

    def wanted(self, rate_rps: float, worker_rps: float) -> int:
        """ceil(rate / worker_rps x headroom), clipped to [min_workers, max_workers]."""
        cfg = self.config
        if not (math.isfinite(worker_rps) and worker_rps > 0):
            raise ValueError(f"workers worker_rps: must be a finite number > 0, got {worker_rps!r}")
        need = math.ceil(rate_rps / worker_rps * cfg.headroom - 1e-9)
        return min(max(need, cfg.min_workers), cfg.max_workers)

    def decide(self, now: float, worker_rps: Mapping[str, float]) -> ScalingDecision:
        """Workers to start and stop per module at `now`; mu_k of each module in `worker_rps`."""
        cfg = self.config
        became: dict[str, int] = {}
        rates: dict[str, float] = {}
        wanted: dict[str, int] = {}
        for m in self._order:
            state = self._modules[m]
            done = [t for t in state.starting if t <= now]
            state.starting = [t for t in state.starting if t > now]
            state.ready += len(done)
            became[m] = len(done)
            rates[m] = self.rate_rps(m, now)
            wanted[m] = self.wanted(rates[m], worker_rps[m])
            state.wanted.append((now, wanted[m]))
            while state.wanted and state.wanted[0][0] < now - cfg.hold_s:
                state.wanted.popleft()
        stops: dict[str, tuple[int, int]] = {}
        for m in self._order:  # scale-in first: it frees places under the pipeline cap
            state = self._modules[m]
            have = state.ready + len(state.starting)
            keep = max(n for _, n in state.wanted)
            if keep < have:
                surplus = have - keep
                cancel = min(surplus, len(state.starting))
                del state.starting[len(state.starting) - cancel :]
                state.ready -= surplus - cancel
                state.stopped += surplus
                stops[m] = (surplus, cancel)
        grow = {m: 0 for m in self._order}
        total = sum(s.ready + len(s.starting) for s in self._modules.values())
        free = math.inf if cfg.total_workers is None else cfg.total_workers - total
        while free > 0:
            short = [
                m
                for m in self._order
                if self._modules[m].ready + len(self._modules[m].starting) + grow[m] < wanted[m]
            ]
            if not short:
                break

            def load(m: str) -> float:
                n = self._modules[m].ready + len(self._modules[m].starting) + grow[m]
                return rates[m] / (n * worker_rps[m]) if n else math.inf

            pick = max(short, key=load)  # max() keeps the first of equals: module order
            grow[pick] += 1
            free -= 1
        ready_at = now + cfg.cold_start_s
        out = []
        for m in self._order:
            state = self._modules[m]
            if grow[m]:
                state.starting.extend([ready_at] * grow[m])
                state.started += grow[m]
            stop, cancel = stops.get(m, (0, 0))
            out.append(
                ModuleScaling(
                    module_id=m,
                    rate_rps=rates[m],
                    worker_rps=float(worker_rps[m]),
                    wanted=wanted[m],
                    ready=state.ready,
                    starting=len(state.starting),
                    start=grow[m],
                    stop=stop,
                    stop_starting=cancel,
                    ready_at_s=ready_at,
                    became_ready=became[m],
                )
            )
        return ScalingDecision(now, tuple(out))
