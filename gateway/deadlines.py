"""Fanout-aware task pre-dequeuing budgets: T_b = x_p^SLO - x_p^u(k_f) (TailGuard eq. (4)).

::

    SloUnreachable    the SLO is not above x_p^u(k_f): no schedule can meet it (HTTP 422)
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.cdf import CdfBook, Estimate, Solution


@dataclass(frozen=True, slots=True)
class DeadlinePlan:
    """The budget every task of one query shares, and where it came from."""

    percentile: float
    """SLO percentile p."""
    slo_ms: float
    """x_p^SLO."""
    unloaded_ms: float
    """x_p^u(k_f) over exactly the query's servers."""
    budget_ms: float
    """T_b = x_p^SLO - x_p^u(k_f), TailGuard eq. (4): the task pre-dequeuing budget."""
    estimate: Estimate
    """Whether x_p^u came from the empirical bodies or needed the tail model."""
    fanout: int
    """k_f."""


class SloUnreachable(Exception):
    """The SLO is below the unloaded p-th latency for this fanout: no schedule can meet it."""

    def __init__(self, slo_ms: float, unloaded_ms: float, percentile: float, fanout: int) -> None:
        # The four values are the args, so the exception pickles and compares as data.
        super().__init__(slo_ms, unloaded_ms, percentile, fanout)
        self.slo_ms = slo_ms
        self.unloaded_ms = unloaded_ms
        self.percentile = percentile
        self.fanout = fanout

    def __str__(self) -> str:
        return (
            f"SLO {self.slo_ms:.6g} ms is not above the unloaded p{self.percentile:g} latency "
            f"{self.unloaded_ms:.6g} ms for fanout {self.fanout}: no schedule can meet it"
        )


class DeadlineEstimator:
    """Plans per-query budgets from a CdfBook, caching x_p^u per server composition."""

    def __init__(self, book: CdfBook, cache_size: int = 4096) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size: must be >= 0, got {cache_size}")
        self._book = book
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[float, bytes], Solution] = OrderedDict()
        self._cache_version = book.version
        self.cache_hits = 0
        self.cache_misses = 0

    def plan(self, server_ids: Sequence[str], percentile: float, slo_ms: float) -> DeadlinePlan:
        """The budget for a query over these servers; SloUnreachable if none can work."""
        if not (isinstance(slo_ms, (int, float)) and math.isfinite(slo_ms) and slo_ms > 0):
            raise ValueError(f"slo_ms must be finite and > 0, got {slo_ms!r}")
        book = self._book
        if book.version != self._cache_version:
            # Any CDF moved: x_p^u may have moved for every composition (TailGuard §III.C.2).
            self._cache.clear()
            self._cache_version = book.version
        # Map the ids once for both the key and, on a miss, the solve; the composition
        # validates the ids and solve_composition the percentile.
        composition = book.composition(server_ids)
        key = (float(percentile), composition.key)
        solution = self._cache.get(key)
        if solution is not None:
            self.cache_hits += 1
            self._cache.move_to_end(key)
        else:
            self.cache_misses += 1
            solution = book.solve_composition(composition, percentile)
            if self._cache_size:
                self._cache[key] = solution
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        fanout = len(server_ids)
        if slo_ms <= solution.unloaded_ms:
            raise SloUnreachable(slo_ms, solution.unloaded_ms, float(percentile), fanout)
        return DeadlinePlan(
            percentile=float(percentile),
            slo_ms=float(slo_ms),
            unloaded_ms=solution.unloaded_ms,
            # TailGuard eq. (4): t_D = t0 + x_p^SLO - x_p^u(k_f).
            budget_ms=float(slo_ms) - solution.unloaded_ms,
            estimate=solution.estimate,
            fanout=fanout,
        )
