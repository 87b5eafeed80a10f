"""Goodput, drop rate and invalid rate of PARD §5.1, from a stream of pipeline events.

- Goodput: requests completed within their SLO per second, over the last ``window_s``.
- Drop rate: (dropped + completed late) / finished requests. A late completion counts as a drop
  (§5.1). Finished rather than arrived requests form the denominator, so in-flight requests do
  not dilute the rate mid-run; at the end of a run the two are the same.
- Invalid rate: compute spent on requests that were finally dropped (or finished late) / all
  compute, both over finished requests. A batch's duration is shared equally by its requests.
  Compute a DAG branch spends on a request already dropped in another branch is invalid.

Feed events with the request's own id; a request split over DAG branches keeps one id.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

__all__ = ["ModuleSummary", "PardMetrics", "PipelineSummary"]

_REMEMBER_FINISHED = 65_536  # finished ids kept to classify late DAG-branch compute


@dataclass(frozen=True, slots=True)
class PipelineSummary:
    """One pipeline's figures at a moment."""

    pipeline: str
    arrived: int
    on_time: int
    late: int
    dropped: int
    in_flight: int
    goodput_rps: float
    drop_rate: float
    invalid_rate: float
    compute_s: float
    invalid_s: float
    drops_by_module: dict[str, int]


@dataclass(frozen=True, slots=True)
class ModuleSummary:
    """One module's figures: its compute, the invalid part of it, and its drops."""

    module_id: str
    batches: int
    compute_s: float
    invalid_s: float
    invalid_rate: float
    drops: int


@dataclass(slots=True)
class _Request:
    pipeline: str
    slo_s: float
    compute: dict[str, float] = field(default_factory=dict)  # module -> seconds


@dataclass(slots=True)
class _Pipeline:
    arrived: int = 0
    on_time: int = 0
    late: int = 0
    dropped: int = 0
    compute_s: float = 0.0
    invalid_s: float = 0.0
    drops: dict[str, int] = field(default_factory=dict)
    good: deque[float] = field(default_factory=deque)  # on-time completion times


@dataclass(slots=True)
class _Module:
    batches: int = 0
    compute_s: float = 0.0
    invalid_s: float = 0.0
    drops: int = 0


class PardMetrics:
    """Accumulates pipeline events into PARD's three metrics, per pipeline and per module."""

    def __init__(self, window_s: float = 10.0) -> None:
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"metrics window_s: must be a finite number > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._live: dict[Hashable, _Request] = {}
        self._finished: OrderedDict[Hashable, tuple[str, bool]] = OrderedDict()  # id -> valid
        self._pipelines: dict[str, _Pipeline] = {}
        self._modules: dict[str, _Module] = {}
        self.unattributed_s = 0.0  # compute of ids never seen arriving

    def arrived(self, request_id: Hashable, pipeline: str, slo_s: float, now: float) -> None:
        """A request entered `pipeline` with end-to-end objective `slo_s`."""
        self._live[request_id] = _Request(pipeline, slo_s)
        self._pipelines.setdefault(pipeline, _Pipeline()).arrived += 1

    def batch_executed(
        self, module_id: str, request_ids: Iterable[Hashable], duration_s: float, now: float
    ) -> None:
        """A batch of `request_ids` ran on `module_id` for `duration_s`."""
        ids = list(request_ids)
        module = self._modules.setdefault(module_id, _Module())
        module.batches += 1
        if not ids:
            return
        share = duration_s / len(ids)
        for request_id in ids:
            request = self._live.get(request_id)
            if request is not None:
                request.compute[module_id] = request.compute.get(module_id, 0.0) + share
                continue
            finished = self._finished.get(request_id)
            if finished is None:
                self.unattributed_s += share
                continue
            pipeline = self._pipelines[finished[0]]
            pipeline.compute_s += share
            module.compute_s += share
            if not finished[1]:
                pipeline.invalid_s += share
                module.invalid_s += share

    def dropped(self, request_id: Hashable, module_id: str, now: float) -> None:
        """The request was dropped at `module_id` (only its first drop counts)."""
        request = self._live.pop(request_id, None)
        if request is None:
            return
        pipeline = self._pipelines[request.pipeline]
        pipeline.dropped += 1
        pipeline.drops[module_id] = pipeline.drops.get(module_id, 0) + 1
        self._modules.setdefault(module_id, _Module()).drops += 1
        self._finish(request_id, request, valid=False)

    def completed(self, request_id: Hashable, latency_s: float, now: float) -> None:
        """The request left the pipeline after `latency_s`; late when over its SLO."""
        request = self._live.pop(request_id, None)
        if request is None:
            return
        pipeline = self._pipelines[request.pipeline]
        on_time = latency_s <= request.slo_s
        if on_time:
            pipeline.on_time += 1
            pipeline.good.append(now)
            self._evict(pipeline, now)
        else:
            pipeline.late += 1
        self._finish(request_id, request, valid=on_time)

    def _finish(self, request_id: Hashable, request: _Request, *, valid: bool) -> None:
        pipeline = self._pipelines[request.pipeline]
        for module_id, seconds in request.compute.items():
            module = self._modules.setdefault(module_id, _Module())
            module.compute_s += seconds
            pipeline.compute_s += seconds
            if not valid:
                module.invalid_s += seconds
                pipeline.invalid_s += seconds
        self._finished[request_id] = (request.pipeline, valid)
        if len(self._finished) > _REMEMBER_FINISHED:
            self._finished.popitem(last=False)

    def _evict(self, pipeline: _Pipeline, now: float) -> None:
        horizon = now - self.window_s
        good = pipeline.good
        while good and good[0] <= horizon:
            good.popleft()

    def pipelines(self) -> list[str]:
        """Pipelines seen so far."""
        return list(self._pipelines)

    def pipeline(self, name: str, now: float) -> PipelineSummary:
        """Figures of one pipeline at `now` (goodput over the last window_s)."""
        p = self._pipelines.get(name) or _Pipeline()
        self._evict(p, now)
        finished = p.on_time + p.late + p.dropped
        return PipelineSummary(
            pipeline=name,
            arrived=p.arrived,
            on_time=p.on_time,
            late=p.late,
            dropped=p.dropped,
            in_flight=p.arrived - finished,
            goodput_rps=len(p.good) / self.window_s,
            drop_rate=(p.dropped + p.late) / finished if finished else 0.0,
            invalid_rate=p.invalid_s / p.compute_s if p.compute_s > 0 else 0.0,
            compute_s=p.compute_s,
            invalid_s=p.invalid_s,
            drops_by_module=dict(p.drops),
        )

    def module(self, module_id: str) -> ModuleSummary:
        """Figures of one module over finished requests."""
        m = self._modules.get(module_id) or _Module()
        return ModuleSummary(
            module_id=module_id,
            batches=m.batches,
            compute_s=m.compute_s,
            invalid_s=m.invalid_s,
            invalid_rate=m.invalid_s / m.compute_s if m.compute_s > 0 else 0.0,
            drops=m.drops,
        )
