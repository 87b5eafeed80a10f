"""PARD's State Planner (§4.2): the downstream part L_sub of eq. (3) for one module.

Per downstream module M_i the planner holds what §4.2 synchronises across modules: the recent
queueing delay q_i (a 5 s linear-weighted window, footnote 4), the batch size, from which the
profiled duration d_i follows, and a sketch of the batch waits of its recent arrivals, from which
it derives w_k, the lambda-quantile of the aggregated downstream batch wait (see batchwait.py).
For a DAG it keeps one PathEstimate per downstream path; the broker takes the maximum (§4.2,
§5.1).

Modules in other processes exchange ModuleState snapshots. Hosts share no clock, so a snapshot
carries a per-module sequence number (and an incarnation that changes on restart), never a
timestamp, and queue delays as durations. StateExchange decides when to publish (at most once
per ``period_s``); the shell does the sending and calls merge() on what it receives.

Cost: merge() and downstream() are O(modules); refresh() draws M samples per downstream module,
O(M (N - k)) (footnote 7), and is meant to run once per exchange period, never per request.
The first downstream() call refreshes if nobody has yet.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from taskserver.pard.abc import Profile
from taskserver.pard.batchwait import (
    WaitSketch,
    quantile,
    sample_aggregate_waits,
    uniform_fractions,
)
from taskserver.pard.errors import UnknownModule
from taskserver.pard.graph import PipelineGraph
from taskserver.pard.request import ModuleContext
from taskserver.pard.window import LinearWeightedWindow

__all__ = ["ModuleState", "PathEstimate", "StateExchange", "StatePlanner"]


@dataclass(frozen=True, slots=True)
class ModuleState:
    """What one module publishes to the others (§4.1 ② state synchronisation)."""

    module_id: str
    batch_size: int
    workers: int = 1
    queue_delay_s: float = 0.0  # q_i: linear-weighted recent queueing delay
    wait_fractions: tuple[float, ...] = ()  # quantile sketch of recent W_i / d_i; () = unknown
    seq: int = -1  # per-module publish counter: a larger one is newer
    incarnation: int = 0  # changes when the module restarts (its seq starts again)
    # measured / profiled batch duration: d_i used in eq. (3) is the profile's times this.
    # Beyond the paper, which trusts its offline profile; 1.0 keeps the paper's d_i.
    duration_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"module state batch_size: must be >= 1, got {self.batch_size!r}")
        if self.workers < 1:
            raise ValueError(f"module state workers: must be >= 1, got {self.workers!r}")
        if not (math.isfinite(self.queue_delay_s) and self.queue_delay_s >= 0):
            raise ValueError(
                f"module state queue_delay_s: must be finite and >= 0, got {self.queue_delay_s!r}"
            )
        s = self.duration_scale
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"module state duration_scale: must be finite and > 0, got {s!r}")
        f = self.wait_fractions
        if f and (len(f) < 2 or any(not 0.0 <= a <= b <= 1.0 for a, b in pairwise(f))):
            raise ValueError(
                f"module state wait_fractions: need >= 2 sorted values in [0, 1], got {f!r}"
            )


@dataclass(frozen=True, slots=True)
class PathEstimate:
    """L_sub of eq. (3b) along one downstream path M_{k+1} .. M_N."""

    path: tuple[str, ...]
    queue_s: float  # sum q_i
    exec_s: float  # sum d_i at the synchronised batch sizes
    wait_s: float  # w_k = F^-1_{k+1->N}(lambda)
    samples: int  # draws behind wait_s (0 for a sink)


class StateExchange:
    """When to publish this module's state: at most once per `period_s` (§4.1 ②)."""

    __slots__ = ("last_published_s", "period_s")

    def __init__(self, period_s: float = 1.0) -> None:
        if not (isinstance(period_s, int | float) and math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"exchange period_s: must be a finite number > 0, got {period_s!r}")
        self.period_s = float(period_s)
        self.last_published_s: float | None = None

    def due(self, now: float) -> bool:
        """True when a snapshot should go out at `now`."""
        last = self.last_published_s
        return last is None or now - last >= self.period_s

    def mark_published(self, now: float) -> None:
        """Record that a snapshot went out at `now`."""
        self.last_published_s = now

    def publish(self, planner: StatePlanner, now: float) -> ModuleState | None:
        """The planner's snapshot if one is due at `now` (and mark it sent), else None."""
        if not self.due(now):
            return None
        self.mark_published(now)
        return planner.snapshot(now)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"planner {name}: must be an int >= 1, got {value!r}")
    return value


class StatePlanner:
    """One module's view of the pipeline's runtime state and its L_sub estimates."""

    def __init__(
        self,
        module_id: str,
        graph: PipelineGraph,
        profile: Profile,
        *,
        window_s: float = 5.0,
        wait_quantile: float = 0.1,
        wait_samples: int = 10_000,
        wait_history: int = 10_000,
        sketch_points: int = 21,
        batch_sizes: Mapping[str, int] | None = None,
        workers: int = 1,
        incarnation: int = 0,
        seed: int = 0,
    ) -> None:
        if module_id not in graph:
            raise UnknownModule(f"module {module_id!r} not in pipeline {graph.modules!r}")
        if not (isinstance(wait_quantile, int | float) and 0.0 <= wait_quantile <= 1.0):
            raise ValueError(f"planner wait_quantile: must be in [0, 1], got {wait_quantile!r}")
        self.module_id = module_id
        self.graph = graph
        self.profile = profile
        self.wait_quantile = float(wait_quantile)  # lambda of §4.2, default 0.1
        self.wait_samples = _check_int("wait_samples", wait_samples)  # M of footnote 7
        self.incarnation = incarnation
        self.seed = seed
        self._sketch = WaitSketch(_check_int("wait_history", wait_history), sketch_points)
        self._prior = uniform_fractions(sketch_points)  # W ~ U[0, d] until a module reports
        sizes = dict(batch_sizes or {})
        for m, b in sizes.items():
            if m not in graph:
                raise UnknownModule(f"planner batch_sizes: module {m!r} not in {graph.modules!r}")
            _check_int(f"batch_sizes[{m!r}]", b)
        self._states: dict[str, ModuleState] = {
            m: ModuleState(m, sizes.get(m, 1)) for m in graph.modules
        }
        self._workers = _check_int("workers", workers)
        self._queue = LinearWeightedWindow(window_s)
        self._seq = 0
        self._durations: dict[tuple[str, int], float] = {}
        self._waits: dict[tuple[str, ...], tuple[float, int]] = {}  # path -> (w_k, samples)
        self._version = 0  # bumped by every state change that moves L_sub
        self._built = -1
        self._refreshed = False
        self._paths: tuple[PathEstimate, ...] = ()
        self._full_exec_s = 0.0
        self._full_built = -1

    # ---- local observations ---------------------------------------------------------------

    def record_queue_delay(self, delay_s: float, now: float) -> None:
        """Q_k = t_b - t_r of a request that joined a batch at `now`."""
        self._queue.record(delay_s, now)

    def record_batch_wait(self, wait_s: float, duration_s: float | None = None) -> None:
        """W_k = t_e - t_b of a request, for a batch of duration `duration_s` (default d_k)."""
        if duration_s is None:
            duration_s = self.duration_s(self.module_id)
        self._sketch.record(wait_s, duration_s)

    def set_batch_size(self, batch_size: int) -> None:
        """This module's batch size changed (dynamic batching, §5.1)."""
        self._set_own(batch_size=_check_int("batch_size", batch_size))

    def set_workers(self, workers: int) -> None:
        """This module's worker count changed (resource scaling, §5.1)."""
        self._workers = _check_int("workers", workers)
        self._set_own(workers=workers)

    def set_duration_scale(self, scale: float) -> None:
        """This module's batches run `scale` times their profiled d_k (online correction)."""
        self._set_own(duration_scale=float(scale))

    def _set_own(self, **changes: float) -> None:
        own = self._states[self.module_id]
        self._states[self.module_id] = dataclasses.replace(own, **changes)  # type: ignore[arg-type]
        self._version += 1

    # ---- exchange ---------------------------------------------------------------------------

    def snapshot(self, now: float) -> ModuleState:
        """This module's state to publish, with q_k from the linear-weighted window at `now`."""
        own = self._states[self.module_id]
        state = ModuleState(
            self.module_id,
            own.batch_size,
            self._workers,
            self._queue.mean(now),
            self._sketch.fractions(),
            self._seq,
            self.incarnation,
            own.duration_scale,
        )
        self._seq += 1
        self._states[self.module_id] = state
        return state

    def merge(self, state: ModuleState) -> bool:
        """Take a snapshot from another module if it is newer than the one held."""
        if state.module_id == self.module_id:
            return False
        known = self._states.get(state.module_id)
        if known is None:
            raise UnknownModule(f"state of module {state.module_id!r} not in {self.graph.modules}")
        if state.incarnation == known.incarnation and state.seq <= known.seq:
            return False
        self._states[state.module_id] = state
        self._version += 1
        return True

    def state(self, module_id: str) -> ModuleState:
        """The state held for a module."""
        try:
            return self._states[module_id]
        except KeyError:
            raise UnknownModule(f"module {module_id!r} not in {self.graph.modules!r}") from None

    # ---- estimates ----------------------------------------------------------------------------

    def duration_s(self, module_id: str, batch_size: int | None = None) -> float:
        """d_i: the profile's, times the module's duration_scale, at the synchronised batch
        size unless one is given."""
        state = self.state(module_id)
        return self.profiled_s(module_id, batch_size) * state.duration_scale

    def profiled_s(self, module_id: str, batch_size: int | None = None) -> float:
        """d_i as the offline profile has it, at the synchronised batch size unless given."""
        b = self.state(module_id).batch_size if batch_size is None else batch_size
        key = (module_id, b)
        cached = self._durations.get(key)
        if cached is None:
            ms = self.profile.duration_ms(module_id, b)
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"profile duration_ms({module_id!r}, {b}): got {ms!r}")
            cached = self._durations[key] = ms / 1000.0
        return cached

    def context(self, expected_start_s: float, batch_size: int | None = None) -> ModuleContext:
        """The ModuleContext of this module's batch starting at `expected_start_s` (t_e)."""
        b = self.state(self.module_id).batch_size if batch_size is None else batch_size
        duration_s = self.duration_s(self.module_id, b)
        return ModuleContext(self.module_id, expected_start_s, duration_s, b)

    def _build(self) -> None:
        estimates = []
        for path in self.graph.downstream_paths(self.module_id):
            queue_s = sum(self._states[m].queue_delay_s for m in path)
            exec_s = sum(self.duration_s(m) for m in path)
            wait_s, samples = self._waits.get(path, (0.0, 0))
            estimates.append(PathEstimate(path, queue_s, exec_s, wait_s, samples))
        self._paths = tuple(estimates)
        self._built = self._version

    def refresh(self) -> tuple[PathEstimate, ...]:
        """Recompute w_k = F^-1_{k+1->N}(lambda) for every downstream path (§4.2)."""
        rng = random.Random(self.seed)
        for path in self.graph.downstream_paths(self.module_id):
            if not path:
                self._waits[path] = (0.0, 0)
                continue
            modules = [
                (self.duration_s(m), self._states[m].wait_fractions or self._prior) for m in path
            ]
            rng.seed(self.seed)  # the same states give the same w_k
            waits = sample_aggregate_waits(modules, self.wait_samples, rng)
            self._waits[path] = (quantile(waits, self.wait_quantile), len(waits))
        self._refreshed = True
        self._build()
        return self._paths

    def downstream(self) -> tuple[PathEstimate, ...]:
        """L_sub per downstream path (``(PathEstimate((), 0, 0, 0, 0),)`` at a sink)."""
        if not self._refreshed:
            return self.refresh()
        if self._built != self._version:
            self._build()
        return self._paths

    def full_path_exec_s(self) -> float:
        """max over source-to-sink paths through this module of sum d_i (Clipper++'s divisor)."""
        if self._full_built != self._version:
            self._full_exec_s = max(
                sum(self.duration_s(m) for m in path)
                for path in self.graph.paths_through(self.module_id)
            )
            self._full_built = self._version
        return self._full_exec_s
