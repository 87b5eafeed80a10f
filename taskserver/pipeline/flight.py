"""One pipeline request in flight: its input, where it is, its timings and its outcome."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from taskserver.pipeline.routing import RouteState
from taskserver.pipeline.tensors import Region, RequestInput, fit_input

__all__ = ["BatchRecord", "Flight", "ModuleTiming"]


@dataclass(slots=True)
class ModuleTiming:
    """A request's times at one module (local clock, seconds), PARD eq. (2): Q + W + D."""

    received_s: float  # t_r: queued at the module
    joined_s: float | None = None  # t_b: admitted into a batch
    started_s: float | None = None  # the batch was handed to the module's thread
    prep_s: float = 0.0  # building the batch's inputs in that thread
    exec_s: float = 0.0  # the model's run on the batch (D)
    batch: int = 0  # requests in the batch that ran it

    def to_json(self, provider: str) -> dict[str, Any]:
        """Durations in ms, rounded to µs."""
        joined = self.joined_s if self.joined_s is not None else self.received_s
        started = self.started_s if self.started_s is not None else joined
        return {
            "queue_ms": round((joined - self.received_s) * 1000, 3),
            "batch_wait_ms": round((started - joined) * 1000, 3),
            "prep_ms": round(self.prep_s * 1000, 3),
            "exec_ms": round(self.exec_s * 1000, 3),
            "batch": self.batch,
            "provider": provider,
        }


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch a module ran (kept for inspection: the last few hundred per module)."""

    module_id: str
    request_ids: tuple[int, ...]
    target: int  # the feasible size the batch was formed for
    started_s: float
    ended_s: float
    exec_s: float
    worker: int = 0  # the module's replica that ran it (0: the first)

    @property
    def size(self) -> int:
        """Requests in the batch."""
        return len(self.request_ids)


@dataclass(slots=True, eq=False)
class Flight:
    """A request between execute() and its answer; one id across all DAG branches."""

    request_id: int
    request: RequestInput
    budget_s: float  # the remaining end-to-end budget it arrived with
    received_s: float
    future: asyncio.Future[None]
    sinks_left: int  # ends not yet reached: local sinks and later stages (routing.py)
    route: RouteState  # the branches it took, the merges it waits for
    alive: bool = True  # False once completed, dropped, failed or cancelled
    frame: np.ndarray | None = None  # the source module's input, built in its thread
    regions: dict[str, Region] = field(default_factory=dict)  # module -> input region
    passed: dict[str, Region] = field(default_factory=dict)  # module -> region passed on
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # sink -> output row
    timings: dict[str, ModuleTiming] = field(default_factory=dict)  # in visiting order
    where: set[str] = field(default_factory=set)  # modules whose queue or open batch hold it
    handoffs: dict[str, Any] = field(default_factory=dict)  # key -> PeerLink of a later stage
    remote_outputs: dict[str, Any] = field(default_factory=dict)  # sinks of later stages
    remote_modules: dict[str, Any] = field(default_factory=dict)  # their timings, as sent

    @property
    def deadline_s(self) -> float:
        """The local deadline the budget turns into on receipt."""
        return self.received_s + self.budget_s

    def input_for(self, module_id: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """This request's input at `module_id` (tensors.py: frame, region, fit)."""
        if self.frame is None:  # the source module: the frame is its input
            self.frame = self.request.frame(shape, dtype)
            return self.frame
        return fit_input(self.frame, self.regions[module_id], shape, dtype)
