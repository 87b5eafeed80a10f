"""Per-server CDFs of post-queuing time and the x_p^u solver (TailGuard §III.C).

A ``LatencyCdf`` is an immutable snapshot: an empirical body (the samples at Hazen plotting
positions, log-survival interpolated between them) up to the largest sample, and beyond it a
generalized Pareto tail (``gateway.tail``) fitted to the top ``tail_fraction`` of the
samples, because fanout 1000 at p99 needs F(x) = 0.99999, far beyond any window.

A ``CdfBook`` keeps one row per server, or one per group of servers that share a CDF, each
a ring-buffer window seeded with an offline prior and pushed out by online samples (TailGuard
§III.C.2). It solves x_p^u over any multiset of servers from matrices of log F on one shared
log-spaced grid: a bisection over coarse points finds the cell where sum_i log F_i crosses
log(p/100), a second over that cell's fine points pins it down. Each step sums one point's
log F over the query's rows (a row of the point-major matrices: the rows' values lie within a
few KB), so a query reads ~12 such sums whatever the fanout, and does no per-server Python
work: its ids are mapped to rows by a C table mirroring the book's dict (`SlotIndex`), and
gateway/_hotpath.c runs the bisection (`_search`, `_crossing` and `_probe` below are its
twins; the dict and itemgetter are the table's).
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from admission.waiting import ServiceMoments
from gateway.table_cdf import ConditionalTail, TableCdf
from gateway.tail import GpdTail, fit_pot
from taskserver.native import require_native

Estimate = Literal["empirical", "tail-model"]
Tail = GpdTail | ConditionalTail

LOG_FLOOR = -700.0
"""log F stored where F = 0 (below a row's smallest sample): finite, so 0 * floor = 0 for the
rows a query does not touch, and still far below any log(p/100)."""
GRID_TOP_SURVIVAL = 1e-7
"""Per-task survival the grid must reach for every row: fanout 1000 at p99.99, 10^5 at p99."""
GRID_MARGIN = 2.0
"""Slack factor on both ends of the grid, so rows that drift online rarely force a rebuild."""
MIN_GRID_MS = 1e-9
"""Lowest grid point: the grid is log-spaced, so it must stay positive for zero samples."""
COARSE_CELLS = 128
"""Cells of the coarse grid: a bisection over its cells + 1 points finds the answer's cell."""
FINE_STEPS = 32
"""Fine steps per coarse cell: a second bisection over steps + 1 points pins the answer; the
fine spacing (~0.4% for a 15-e-fold span) bounds the error at the kinks of empirical CDFs."""
SAMPLE_DTYPE = np.float32
"""What a row's window, its sorted copy and a snapshot's knots hold post-queuing times in:
float32's 24-bit mantissa keeps a sample to 6e-8 of itself (6 ns at 100 ms, finer than the
clocks the samples come from), in half the bytes of float64. A busy server's row holds its
window and the sorted copy its snapshot shares: 64 KiB of float64 at the default window of
4,096, 32 KiB of float32. What is computed from them (log survival, the mean, the tail fit,
the solver's grid) is computed in float64."""
MAX_SAMPLE_MS = float(np.finfo(SAMPLE_DTYPE).max)
"""The largest post-queuing time a window can hold (3.4e38 ms): a larger one is refused,
not stored as infinity."""
SEEDED_PRIORS = 16
"""Priors whose seeded window and snapshot the book keeps for the next server registered with
the same prior object (a pool's, gateway.server_registry): more than a gateway has pools, few
enough that a caller passing every server its own prior array holds little it cannot reuse."""
_C_ROWS_MIN = 2
"""_rows_of: from this many ids on, the C index (when built) beats itemgetter."""

try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twin
    from gateway._hotpath import SlotIndex as _SlotIndex
    from gateway._hotpath import crossing as _c_crossing
    from gateway._hotpath import probe as _c_probe
    from gateway._hotpath import search as _c_search
except ImportError:  # built at install when a C compiler is there; itemgetter otherwise
    _SlotIndex = _c_crossing = _c_probe = _c_search = None


def _check_rows(matrix: np.ndarray, rows: np.ndarray) -> None:
    """IndexError for a row outside the matrix (numpy would wrap a negative one around)."""
    bad = np.flatnonzero((rows < 0) | (rows >= matrix.shape[1]))
    if bad.size:
        i = int(bad[0])
        raise IndexError(f"rows[{i}] = {int(rows[i])} is outside [0, {matrix.shape[1]})")


SUM_LANES = 8
"""A sum over a query's rows runs in this many lanes (gateway/_hotpath.c's lane_sum): lane j
adds the rows at positions j, j + 8, ... in their order, then ((l0 + l1) + (l2 + l3)) +
((l4 + l5) + (l6 + l7)). Eight independent chains of adds, not one chain waiting on each
add's latency; any fixed order is as exact as another."""


def _sum_at(matrix: np.ndarray, rows: np.ndarray, point: int) -> float:
    # In double, in the C twin's order, so both give the same bits: each lane starts from
    # -0.0, the identity of + (signed zeros included), which also pads the last lanes.
    values = np.full(-(-rows.size // SUM_LANES) * SUM_LANES, -0.0)
    values[: rows.size] = matrix[point].take(rows)
    lanes = np.add.accumulate(values.reshape(-1, SUM_LANES), axis=0)[-1].tolist()
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
        (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
    )


def _probe_py(matrix: np.ndarray, rows: np.ndarray, point: int) -> float:
    """Sum of matrix[point, r] over the rows."""
    _check_rows(matrix, rows)
    if not 0 <= point < matrix.shape[0]:
        raise IndexError(f"point {point} is outside [0, {matrix.shape[0]})")
    return _sum_at(matrix, rows, point)


def _crossing_py(matrix: np.ndarray, rows: np.ndarray, level: float) -> tuple[int, float, float]:
    """The first point whose sum over the rows is >= level (matrix.shape[0] if none), by
    bisection (each row is a log CDF on an ascending grid, so the sums never fall), with the
    sums the bisection took at that point - 1 and at it (NaN where it took none)."""
    _check_rows(matrix, rows)
    lo, hi = 0, matrix.shape[0]
    below = at = math.nan
    while lo < hi:
        mid = (lo + hi) // 2
        total = _sum_at(matrix, rows, mid)
        if total < level:
            lo, below = mid + 1, total  # lo only rises: the last is the sum at lo - 1
        else:
            hi, at = mid, total
    return lo, below, at


def _search_py(
    coarse: np.ndarray, blocks: np.ndarray, rows: np.ndarray, level: float, threshold: np.ndarray
) -> tuple[int, int, float, float, float] | None:
    """The grid search of CdfBook._solve_rows: None when the rows are all one row (the
    closed form's case); else (cell, step, below, at, least): the coarse point where the
    sum crosses level, the fine point of that cell's block where it does (with the sums
    before it and at it; step -1 and NaN sums when the cell is 0 or past the last), and the
    smallest threshold of the rows."""
    _check_rows(coarse, rows)
    if rows.size == 0:
        raise ValueError("rows is empty")
    least = float(threshold[rows].min())
    if rows.min() == rows.max():
        return None
    cell = _crossing_py(coarse, rows, level)[0]
    if not 1 <= cell <= blocks.shape[0]:
        return cell, -1, math.nan, math.nan, least
    step, below, at = _crossing_py(blocks[cell - 1], rows, level)
    return cell, step, below, at, least


_crossing = _crossing_py if _c_crossing is None else _c_crossing
_probe = _probe_py if _c_probe is None else _c_probe
_search = _search_py if _c_search is None else _c_search

_BLOCK_INDEX = np.arange(COARSE_CELLS)[:, None] * FINE_STEPS + np.arange(FINE_STEPS + 1)


def _log_level(percentile: float) -> float:
    """log(p/100) after checking that p is a percentile in (0, 100)."""
    if isinstance(percentile, bool) or not isinstance(percentile, (int, float, np.number)):
        raise ValueError(f"percentile must be a number in (0, 100), got {percentile!r}")
    p = float(percentile)
    if not (0.0 < p < 100.0):
        raise ValueError(f"percentile must be in (0, 100) exclusive, got {percentile!r}")
    # log(p) - log(100), not log(p / 100): p / 100 is 0.0 for p below ~5e-322.
    return math.log(p) - math.log(100.0)


def _log1mexp(log_s: np.ndarray) -> np.ndarray:
    """log(1 - e^a) for a <= 0, accurate at both ends (Maechler 2012)."""
    with np.errstate(divide="ignore"):
        return np.where(log_s < -math.log(2.0), np.log1p(-np.exp(log_s)), np.log(-np.expm1(log_s)))


def _log1mexp_falling(log_s: np.ndarray) -> np.ndarray:
    """`_log1mexp` of a non-increasing array (log P(X > x) on an ascending grid): the two
    branches split at one index, so each element is computed once, by its own branch."""
    split = int(np.searchsorted(-log_s, _LOG2, side="right"))
    out = np.empty_like(log_s)
    with np.errstate(divide="ignore"):
        np.log(-np.expm1(log_s[:split]), out=out[:split])
        np.log1p(-np.exp(log_s[split:]), out=out[split:])
    return out


_LOG2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class _Levels:
    """What LatencyCdf.from_samples derives from n alone when n samples have no ties."""

    survival: np.ndarray
    """Hazen survival levels (n - i + 0.5) / n, i = 1..n."""
    neg_log_sf: np.ndarray
    """-log of them."""
    arc: np.ndarray
    """Per gap between samples, the mean's weight: (S_i - S_i+1) / (-log S_i+1 + log S_i)."""


@functools.lru_cache(maxsize=8)
def _levels(n: int) -> _Levels:
    """The levels of n samples without ties (cached: a window has one size)."""
    survival = (n - 0.5 - np.arange(n, dtype=np.float64)) / n
    neg_log_sf = -np.log(survival)
    arc = (survival[:-1] - survival[1:]) / np.diff(neg_log_sf)
    for a in (survival, neg_log_sf, arc):
        a.setflags(write=False)
    return _Levels(survival, neg_log_sf, arc)


@dataclass(frozen=True, slots=True, eq=False)
class LatencyCdf:
    """Immutable CDF snapshot of post-queuing times: empirical body + POT tail."""

    n: int
    """Number of samples behind the snapshot."""
    threshold_ms: float
    """Where the tail model takes over (the largest sample); +inf if no tail was fitted."""
    min_ms: float
    """Smallest sample: F is 0 below it."""
    max_ms: float
    """Largest sample: the end of the empirical body."""
    tail: Tail | None
    """Tail above threshold_ms (already pinned to the body there), or None."""
    _knots_ms: np.ndarray = field(repr=False)
    _neg_log_sf: np.ndarray = field(repr=False)
    _mean_ms: float = field(repr=False)

    @classmethod
    def from_samples(
        cls,
        samples_ms: ArrayLike,
        tail_fraction: float = 0.05,
        model: TableCdf | None = None,
        *,
        presorted: bool = False,
    ) -> LatencyCdf:
        """Build a snapshot from post-queuing times in milliseconds (any order; with
        `presorted`, the caller promises ascending order and the sort is skipped).

        With `model` (the prior the window started from, while it still holds some of it),
        beyond the largest sample the model's shape carries on instead of a fitted GPD.
        """
        x = np.asarray(samples_ms)
        if x.dtype != SAMPLE_DTYPE:  # float32 knots stay float32 (a CdfBook's); else float64
            x = x.astype(np.float64, copy=False)
        x = x.ravel()
        if not presorted:
            x = np.sort(x)
        elif x.flags.writeable:
            x = x.copy()  # the snapshot may keep it (its knots) read only: not the caller's
        n = x.size
        if n == 0:
            raise ValueError("samples_ms: need at least one sample, got none")
        if not (np.isfinite(x[0]) and np.isfinite(x[-1])):
            raise ValueError("samples_ms: all samples must be finite")
        if x[0] < 0:
            raise ValueError(f"samples_ms: latencies must be >= 0, got {x[0]}")
        tied = x[1:] == x[:-1]
        if n > 1 and not tied.any():
            # No ties (times from a clock): the knots are the samples themselves (no copy:
            # the CdfBook keeps its rows' sorted windows, read only, and the snapshot shares
            # them), and the levels below depend on n alone (_Levels, cached).
            knots = x
            levels = _levels(n)
            survival, neg_log_sf = levels.survival, levels.neg_log_sf
        else:
            # Runs of equal values (np.unique would sort the sorted samples again).
            starts = np.flatnonzero(np.concatenate(([True], ~tied)))
            knots = x[starts]
            counts = np.diff(np.append(starts, n))
            # Hazen positions F = (i - 0.5)/n, a run of ties at the middle of its jump (also
            # how Tailbench's simulator reads its quantile tables: value i at bin i's centre).
            survival = (n - np.cumsum(counts) + 0.5 * counts) / n
            # Between samples, log P(X > x) is interpolated linearly in x: the same as a
            # linear F in the bulk, and exact for exponential tails where the top samples
            # are far apart.
            neg_log_sf = -np.log(survival)
            levels = None
        top = float(knots[-1])
        top_survival = float(survival[-1])
        tail: Tail | None = None
        if model is not None:
            if float(model.log_survival(top)) > -math.inf:
                tail = ConditionalTail(model, top, top_survival)
        else:
            fitted = fit_pot(x, tail_fraction)
            if fitted is not None and top < fitted.upper_end_ms:
                # Empirical inside the data, model beyond it: the GPD fitted on the top
                # tail_fraction is restarted at the largest sample, so F is continuous there.
                tail = fitted.restarted_at(top, top_survival)
        # Mean = integral of the survival: 1 up to the smallest sample, exponential arcs
        # between samples, and the tail (or nothing, when F jumps to 1 at the largest sample).
        mean = float(knots[0])
        # The knots' gaps in float64 (float32 knots subtracted in float32 would round).
        width = np.subtract(knots[1:], knots[:-1], dtype=np.float64)
        if levels is not None:
            mean += float(np.dot(width, levels.arc))
        elif knots.size > 1:
            drop = np.diff(neg_log_sf)
            mean += float(np.dot(width, (survival[:-1] - survival[1:]) / drop))
        if tail is not None:
            mean += top_survival * tail.mean_excess_ms()
        knots.setflags(write=False)
        if levels is None:
            neg_log_sf.setflags(write=False)
        return cls(
            n=n,
            threshold_ms=top if tail is not None else math.inf,
            min_ms=float(knots[0]),
            max_ms=top,
            tail=tail,
            _knots_ms=knots,
            _neg_log_sf=neg_log_sf,
            _mean_ms=mean,
        )

    def log_survival(self, x_ms: ArrayLike) -> np.ndarray:
        """log P(X > x): 0 below the smallest sample, -inf past the body when no tail."""
        x = np.asarray(x_ms, dtype=np.float64)
        out = -np.atleast_1d(np.interp(x, self._knots_ms, self._neg_log_sf, left=0.0, right=np.inf))
        if self.tail is not None:
            beyond = np.atleast_1d(x > self.threshold_ms)
            if beyond.any():
                out[beyond] = self.tail.log_survival(np.atleast_1d(x)[beyond])
        return out.reshape(x.shape)

    def log_survival_ascending(self, x_ms: np.ndarray) -> np.ndarray:
        """`log_survival` of an ascending 1-d array (a grid): the tail's part is a suffix."""
        cut = int(np.searchsorted(x_ms, self.threshold_ms, side="right"))
        out = np.empty(x_ms.size)
        body = np.interp(x_ms[:cut], self._knots_ms, self._neg_log_sf, left=0.0, right=np.inf)
        np.negative(body, out=out[:cut])
        if cut < x_ms.size:
            # threshold_ms is finite only with a tail; without one, -inf past the body.
            out[cut:] = self.tail.log_survival(x_ms[cut:]) if self.tail is not None else -np.inf
        return out

    def cdf(self, x_ms: ArrayLike) -> np.ndarray:
        """F(x): vectorized, monotone, in [0, 1]."""
        return -np.expm1(self.log_survival(x_ms))

    def log_cdf(self, x_ms: ArrayLike) -> np.ndarray:
        """log F(x): -inf below the smallest sample, accurate near 1."""
        return _log1mexp(self.log_survival(x_ms))

    def quantile(self, q: float) -> float:
        """Smallest x with F(x) >= q; beyond the body the tail model answers."""
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        if q == 1.0:
            return self.tail.upper_end_ms if self.tail is not None else self.max_ms
        level = -math.log1p(-q)
        if level > self._neg_log_sf[-1]:
            if self.tail is None:
                return self.max_ms
            return self.tail.isf(min(math.exp(-level), self.tail.exceed_prob))
        if level <= self._neg_log_sf[0]:
            return self.min_ms
        # Linear between the bracketing pair of knots, as np.interp is, without its float64
        # copy of every float32 knot on each call. The levels strictly rise, so x0 < x1.
        return self._body_quantile(level, int(self._neg_log_sf.searchsorted(level, "right")))

    def _body_quantile(self, level: float, j: int) -> float:
        """The body's quantile at -log survival `level`, in (levels[0], levels[-1]], with j
        the first level above it (levels.size if none)."""
        neg_log_sf = self._neg_log_sf
        if j == neg_log_sf.size:
            return self.max_ms
        x0, x1 = float(neg_log_sf[j - 1]), float(neg_log_sf[j])
        y0, y1 = float(self._knots_ms[j - 1]), float(self._knots_ms[j])
        return y0 + (y1 - y0) * ((level - x0) / (x1 - x0))

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """`quantile` of each level, those inside the body found in one search (a scrape
        reads four of every server's: gateway.server_series)."""
        out = [0.0] * len(qs)
        at: list[int] = []
        levels: list[float] = []
        first, last = float(self._neg_log_sf[0]), float(self._neg_log_sf[-1])
        for i, q in enumerate(qs):
            level = -math.log1p(-q) if 0.0 <= q < 1.0 else math.nan
            if first < level <= last:
                at.append(i)
                levels.append(level)
            else:
                out[i] = self.quantile(q)  # the ends, the tail, and the refusals
        if levels:
            above = self._neg_log_sf.searchsorted(levels, "right").tolist()
            for i, level, j in zip(at, levels, above, strict=True):
                out[i] = self._body_quantile(level, j)
        return out

    def mean_ms(self) -> float:
        """Mean post-queuing time under this snapshot (body plus tail)."""
        return self._mean_ms


@dataclass(frozen=True, slots=True)
class Solution:
    """x_p^u over one multiset of servers, and how it was obtained."""

    unloaded_ms: float
    """x_p^u: solves sum_i log F_i(x) = log(p/100), TailGuard eq. (1)-(2)."""
    estimate: Estimate
    """"tail-model" when x lies beyond the empirical body of any involved row."""
    per_task_quantile: float
    """(p/100)**(1/k): the per-task CDF level the fanout needs (exact when homogeneous)."""


@dataclass(frozen=True, slots=True, eq=False)
class Composition:
    """The CDF rows behind one multiset of servers, valid for one book version."""

    version: int
    """CdfBook.version when it was taken: rows of removed servers may be reused later."""
    rows: np.ndarray = field(repr=False)
    """Row index of each server, in the caller's order."""
    key: bytes = field(repr=False)
    """Names the multiset of rows: equal keys, equal x_p^u (at this version)."""


class _Row:
    """One CDF row: a ring-buffer window of post-queuing times and its snapshot.

    The row's snapshot sits in a slot of the book's matrices of log F; rows that hold the
    same snapshot (the servers of a pool, until their first refresh) share one slot, so an
    idle server costs the book a few hundred bytes, not a slot's ~17 KB.
    """

    __slots__ = (
        "_window",
        "cdf",
        "filled",
        "fresh",
        "fresh_pos",
        "gone",
        "group",
        "members",
        "model",
        "moments",
        "pending",
        "pos",
        "prior",
        "seen",
        "shared",
        "slot",
        "sorted",
        "stored",
    )

    def __init__(
        self,
        window: np.ndarray,
        filled: int,
        cdf: LatencyCdf | TableCdf,
        group: str | None,
        model: TableCdf | None = None,
    ) -> None:
        self._window = window
        self.filled = filled
        """Samples in the window, those still in `fresh` included."""
        self.stored = filled
        """Samples written into the window array (`fresh` not included)."""
        self.pos = filled % window.size
        self.slot = -1
        """The slot of its snapshot in the book's matrices (shared with rows of the same
        snapshot)."""
        self.fresh = array("f")
        """Online samples not yet written into the window: they are written at the next
        refresh (or read of the window), all at once (4 bytes a sample, not a float object)."""
        self.fresh_pos = 0
        """The window position of fresh[0]."""
        self.seen = 0
        self.pending = 0
        self.cdf = cdf
        self.group = group
        self.members: set[str] = set()
        self.model = model
        """The model prior, while the window still holds samples of it."""
        self.prior = filled
        """Prior samples the window started with."""
        self.moments: ServiceMoments | None = None
        """Raw moments of the window, computed on first use after each refresh."""
        self.sorted: np.ndarray | None = None
        """The window's samples in ascending order as of the last refresh (read only), or
        None: the next refresh sorts the window in full."""
        self.gone: list[np.ndarray] = []
        """Samples the window lost since the last refresh (while `sorted` is kept)."""
        self.shared = not window.flags.writeable
        """The window is the prior's, shared with other rows (read only) until the row's
        samples are needed in a window (its first refresh, or its moments): a server that
        saw fewer samples than a refresh holds them in `fresh`, not a window of its own."""

    @property
    def window(self) -> np.ndarray:
        """The window of post-queuing times, with every sample observed written in."""
        if self.fresh:
            return self.own_window()
        return self._window

    def own_window(self) -> np.ndarray:
        """The window, made this row's own, with its fresh samples written in (the
        samples they overwrite kept in `gone` for the incremental re-sort)."""
        if self.shared:
            self._window = self._window.copy()
            self.shared = False
        if self.fresh:
            fresh, self.fresh = self.fresh, array("f")
            window = self._window
            size = window.size
            k = len(fresh)
            if self.sorted is not None:
                if 2 * k > size:
                    self.sorted = None  # most of the window changes: sort it in full
                    self.gone = []
                else:
                    # The positions written that held a sample: all of them once the window
                    # was full; before (the fresh ones start at `stored`), only a wrap.
                    start, count = self.fresh_pos, k
                    if self.stored < size:
                        start, count = 0, self.fresh_pos + k - size
                    if count > 0:
                        first = min(count, size - start)
                        self.gone.append(window[start : start + first].copy())
                        if count > first:
                            self.gone.append(window[: count - first].copy())
            _write_ring(window, self.fresh_pos, np.frombuffer(fresh, dtype=SAMPLE_DTYPE))
            self.stored = min(self.stored + k, size)
        return self._window

    def take(self, values: Sequence[float]) -> None:
        """Take samples at the window's position on: kept in `fresh` until the window is
        read (then the position moves on as if written)."""
        size = self._window.size
        n = len(values)
        fresh = self.fresh
        if not fresh:
            self.fresh_pos = self.pos
        fresh.extend(values)
        if len(fresh) > size:  # only the last `size` can survive
            drop = len(fresh) - size
            del fresh[:drop]
            self.fresh_pos = (self.fresh_pos + drop) % size
        self.pos = (self.pos + n) % size
        self.filled = min(self.filled + n, size)
        self.seen += n
        self.pending += n

    def sorted_samples(self) -> np.ndarray:
        """The window's samples in ascending order, read only; kept for the next call.

        A refresh replaces a small part of the window: the sorted samples of the last one
        lose the overwritten values and gain the new ones by merging (O(n) plus a sort of
        the new ones, against O(n log n) for sorting the window again).
        """
        window = self.own_window()
        size = window.size
        new = self.pending
        old, gone = self.sorted, self.gone
        self.gone = []
        merged = None
        if old is not None and 2 * new <= size:
            start = self.pos - new
            if start >= 0:
                added = np.sort(window[start : self.pos])
            else:  # the new samples wrapped around the ring's end
                added = np.sort(np.concatenate((window[start:], window[: self.pos])))
            removed = np.sort(np.concatenate(gone)) if gone else _EMPTY
            merged = _resorted(old, removed, added)
        if merged is None or merged.size != self.filled:
            merged = np.sort(window[: self.filled])
        merged.setflags(write=False)
        self.sorted = merged
        return merged

    def prior_left(self) -> int:
        """Prior samples still in the window: online ones fill its free slots, then
        overwrite the prior's, one by one."""
        overwritten = max(self.seen - (self._window.size - self.prior), 0)
        return max(self.prior - overwritten, 0)


_EMPTY = np.empty(0, dtype=SAMPLE_DTYPE)
_EMPTY.setflags(write=False)


def _resorted(old: np.ndarray, gone: np.ndarray, added: np.ndarray) -> np.ndarray | None:
    """Sorted `old` without the values of sorted `gone` (one occurrence each) and with those
    of sorted `added`; None when `gone` is not a sub-multiset of `old` (a full sort then)."""
    if gone.size:
        # The i-th of r equal values to remove is the i-th occurrence in old.
        at = np.searchsorted(old, gone, side="left")
        at += np.arange(gone.size) - np.searchsorted(gone, gone, side="left")
        if at[-1] >= old.size or not np.array_equal(old[at], gone):
            return None
        keep = np.ones(old.size, dtype=bool)
        keep[at] = False
        old = old[keep]
    if not added.size:
        return old
    # Two sorted runs: the stable sort (timsort) merges them in one linear pass.
    return np.sort(np.concatenate((old, added)), kind="stable")


def _bad_sample(value: object) -> str:
    return f"post_queue_ms must be >= 0 and at most {MAX_SAMPLE_MS:.4g} ms, got {value!r}"


def _write_ring(window: np.ndarray, pos: int, values: np.ndarray) -> None:
    """Write values into a ring buffer from `pos` on, wrapping (only the last window.size
    of them survive)."""
    size = window.size
    kept = values[-size:]
    pos = (pos + values.size - kept.size) % size
    first = min(kept.size, size - pos)
    window[pos : pos + first] = kept[:first]
    window[: kept.size - first] = kept[first:]


def _seed_window(prior_ms: ArrayLike | TableCdf, window_size: int) -> tuple[np.ndarray, int]:
    """A window holding the prior, in an order that online samples push out evenly."""
    if isinstance(prior_ms, TableCdf):
        # A model prior fills the window with its quantiles at the window's Hazen positions.
        levels = (np.arange(window_size) + 0.5) / window_size
        prior_ms = np.array([prior_ms.quantile(float(u)) for u in levels])
    prior = np.sort(np.asarray(prior_ms, dtype=np.float64).ravel())
    m = prior.size
    if m == 0:
        raise ValueError("prior_ms: need at least one sample, got none")
    if not prior[-1] <= MAX_SAMPLE_MS:  # NaN sorts last and fails this too
        raise ValueError(
            f"prior_ms: samples must be finite and at most {MAX_SAMPLE_MS:.4g} ms, "
            f"got {float(prior[-1])!r}"
        )
    if m > window_size:
        # Keep the prior's distribution at the window's size: its quantiles at the Hazen
        # positions of window_size points.
        pos = (np.arange(window_size) + 0.5) * (m / window_size) - 0.5
        prior = np.interp(pos, np.arange(m, dtype=np.float64), prior)
        m = window_size
    # Slot j gets the prior's rank of frac(j * golden ratio): any run of slots overwritten
    # first spans the prior's quantiles evenly, so the early mix of prior and online samples
    # is not biased towards the prior's fast or slow end.
    order = np.argsort((np.arange(m) * 0.6180339887498949) % 1.0, kind="stable")
    ranks = np.empty(m, dtype=np.intp)
    ranks[order] = np.arange(m)
    window = np.empty(window_size, dtype=SAMPLE_DTYPE)
    window[:m] = prior[ranks]
    return window, m


class CdfBook:
    """Per-server online windows of post-queuing times and the x_p^u solver (TailGuard §III.C)."""

    def __init__(
        self, *, window_size: int = 4096, refresh_every: int = 64, tail_fraction: float = 0.05
    ) -> None:
        if window_size < 1:
            raise ValueError(f"window_size: must be >= 1, got {window_size}")
        if refresh_every < 1:
            raise ValueError(f"refresh_every: must be >= 1, got {refresh_every}")
        if not (0.0 < tail_fraction < 1.0):
            raise ValueError(f"tail_fraction: must be in (0, 1), got {tail_fraction}")
        self._window_size = window_size
        self._refresh_every = refresh_every
        self._tail_fraction = tail_fraction
        self._version = 0
        self._slot_of: dict[str, int] = {}
        """Server -> the slot of its row's snapshot (what the solver reads)."""
        self._index = None if _SlotIndex is None else _SlotIndex()
        """The same mapping in C (gateway/_hotpath.c's SlotIndex), written with the dict,
        for the lookup of a query's ids; None where it is not built, or once a server id
        that is not an exact str registered (its own __eq__ and __hash__: the dict's rules)."""
        self._rows_by_id: dict[str, _Row] = {}
        self._group_row: dict[str, _Row] = {}
        self._snaps: list[LatencyCdf | TableCdf | None] = []
        """Slot -> the snapshot whose log F it holds (None: free)."""
        self._refs: list[int] = []
        """Slot -> rows holding its snapshot."""
        self._slot_by_snap: dict[int, int] = {}
        """id(snapshot) -> its slot (the snapshot is held in _snaps while mapped)."""
        self._seeded: dict[int, tuple[object, np.ndarray, int, LatencyCdf | TableCdf]] = {}
        """id(prior) -> (the prior, its seeded window, the samples in the window, the
        window's snapshot) for the last SEEDED_PRIORS priors rows started from, least
        recently used first: the servers of several pools registering in turn each share
        their pool's window and slot (one cached prior gave every row of two interleaved
        pools a window and a slot of its own: 49 KiB a server at window 4096, by the arrays'
        sizes)."""
        self._free: list[int] = []
        self._capacity = 0
        # log F of every row on one shared log-spaced grid of COARSE_CELLS * FINE_STEPS + 1
        # points, stored twice, point-major (a point's values of all rows side by side): the
        # coarse points (cells+1 x rows) to bracket the answer, and per coarse cell a block of
        # its fine points (cells x steps+1 x rows) to pin it down. float32 halves the bytes
        # each bisection step reads; 7 digits are plenty to bracket.
        self._grid_ms = np.empty(0)
        self._log_grid = np.empty(0)
        self._coarse = np.zeros((COARSE_CELLS + 1, 0), dtype=np.float32)
        self._blocks = np.zeros((COARSE_CELLS, FINE_STEPS + 1, 0), dtype=np.float32)
        self._threshold_ms = np.empty(0)
        self._sup_ms = np.empty(0)

    # ----- registration -------------------------------------------------------------------

    def add_server(
        self,
        server_id: str,
        prior_ms: ArrayLike | TableCdf | None = None,
        *,
        group: str | None = None,
    ) -> None:
        """Register a server with its own prior row, or as a member of a shared group row.

        The prior is post-queuing times (an offline profile's samples), or a TableCdf: the
        exact law, which the row's CDF is until online samples arrive, and whose shape
        extends the window beyond its largest sample until they have replaced the prior.
        """
        if not isinstance(server_id, str) or not server_id:
            raise ValueError(f"server_id must be a non-empty string, got {server_id!r}")
        old = self._rows_by_id.get(server_id)
        if group is not None and group in self._group_row:
            # The group's row keeps what it has learned; a prior passed again is not used.
            row = self._group_row[group]
        else:
            if prior_ms is None:
                who = f"group {group!r}" if group is not None else f"server {server_id!r}"
                raise ValueError(f"prior_ms is required for the first registration of {who}")
            row = self._new_row(prior_ms, group)
        if old is not None and old is not row:
            self._detach(server_id, old)
        self._rows_by_id[server_id] = row
        self._map(server_id, row.slot)
        row.members.add(server_id)
        self._version += 1

    def remove_server(self, server_id: str) -> None:
        """Deregister a server; a group's row stays while any member remains."""
        row = self._rows_by_id.pop(server_id, None)
        if row is None:
            raise KeyError(f"unknown server id {server_id!r}")
        del self._slot_of[server_id]
        if self._index is not None:
            self._index.discard(server_id)
        self._detach(server_id, row)
        self._version += 1

    def has_server(self, server_id: str) -> bool:
        """Whether the server is registered."""
        return server_id in self._slot_of

    # ----- online updates -----------------------------------------------------------------

    def observe(self, server_id: str, post_queue_ms: float) -> None:
        """Record one post-queuing time; unknown servers are ignored (late results)."""
        row = self._rows_by_id.get(server_id)
        if row is None:
            return
        if not (0.0 <= post_queue_ms <= MAX_SAMPLE_MS):
            raise ValueError(_bad_sample(post_queue_ms))
        row.take((float(post_queue_ms),))
        # TailGuard §III.C.2 updates F_l online; rebuilding the snapshot every refresh_every
        # samples (not per sample) keeps this hot path O(1) amortised.
        if row.pending >= self._refresh_every:
            self._refresh(row)

    def observe_many(self, server_id: str, post_queue_ms: Sequence[float]) -> None:
        """Record several post-queuing times of one server in order (a frame of results),
        as `observe` one by one would, but with the snapshot refreshed at most once."""
        row = self._rows_by_id.get(server_id)
        if row is None:
            return
        values = post_queue_ms.tolist() if isinstance(post_queue_ms, np.ndarray) else post_queue_ms
        if not values:
            return
        # min, max and sum run in C: a NaN makes the sum NaN (max alone may miss it).
        if not (min(values) >= 0.0 and max(values) <= MAX_SAMPLE_MS and math.isfinite(sum(values))):
            for value in values:
                if not (0.0 <= value <= MAX_SAMPLE_MS):
                    raise ValueError(_bad_sample(value))
        row.take(values)
        if row.pending >= self._refresh_every:
            self._refresh(row)

    def _refresh(self, row: _Row) -> None:
        """A fresh snapshot of the row's window, installed in L: in the row's own slot, or
        in a new one when the row shared its slot with rows of the old snapshot."""
        samples = row.sorted_samples()
        row.pending = 0
        model = row.model if row.model is not None and row.prior_left() else None
        old = row.cdf
        row.cdf = LatencyCdf.from_samples(samples, self._tail_fraction, model=model, presorted=True)
        row.moments = None
        slot = row.slot
        if self._refs[slot] == 1:
            del self._slot_by_snap[id(old)]
            self._snaps[slot] = row.cdf
            self._slot_by_snap[id(row.cdf)] = slot
            self._install(slot)
        else:
            self._release(slot)
            self._move(row, self._attach(row.cdf))
        self._version += 1

    def _move(self, row: _Row, slot: int) -> None:
        """The row's snapshot is in this slot now: so are its servers."""
        row.slot = slot
        for server_id in row.members:
            self._map(server_id, slot)

    @property
    def version(self) -> int:
        """Increments whenever any row's CDF snapshot or the server mapping changes."""
        return self._version

    def cdf_of(self, server_id: str) -> LatencyCdf | TableCdf:
        """The current CDF snapshot of the server's row."""
        return self._row_of(server_id).cdf

    def moments(self, server_id: str) -> ServiceMoments:
        """Mean, E[X^2] and E[X^3] of the server's window of post-queuing times: the service
        law QLM's waiting-time estimator (§6) reads, learned online like the CDF."""
        row = self._row_of(server_id)
        if row.moments is None:
            # A floor of 1 ns keeps a window of zeros (an instant emulated service) a law.
            row.moments = ServiceMoments.from_samples(np.maximum(row.window[: row.filled], 1e-6))
        return row.moments

    def row_key(self, server_id: str) -> int:
        """Which CDF row the server reads: servers with equal keys share one F."""
        slot = self._slot_of.get(server_id)
        if slot is None:
            raise KeyError(f"unknown server id {server_id!r}")
        return slot

    def samples_seen(self, server_id: str) -> int:
        """Online samples observed for the server's row (shared by its group)."""
        return self._row_of(server_id).seen

    # ----- solving ------------------------------------------------------------------------

    def solve(self, server_ids: Sequence[str], percentile: float) -> Solution:
        """x_p^u over exactly these servers (a multiset): TailGuard eq. (1)-(2)."""
        log_level = _log_level(percentile)
        return self._solve_rows(self._rows_of(server_ids), log_level)

    def composition_key(self, server_ids: Sequence[str]) -> bytes:
        """Bytes naming the multiset of CDF rows behind these servers (valid for one version)."""
        return self.composition(server_ids).key

    def composition(self, server_ids: Sequence[str]) -> Composition:
        """The rows behind these servers and their key, for solve_composition (one version)."""
        rows = self._rows_of(server_ids)
        if self._sorts(rows):
            return Composition(self._version, rows, b"s" + np.sort(rows).tobytes())
        # Many servers over few rows: their counts name the multiset in fewer bytes and time.
        return Composition(
            self._version, rows, b"c" + np.bincount(rows, minlength=self._capacity).tobytes()
        )

    def solve_composition(self, composition: Composition, percentile: float) -> Solution:
        """solve() for a composition taken at this version (ids mapped once for key and solve)."""
        if composition.version != self._version:
            raise ValueError(
                f"stale composition: taken at version {composition.version}, "
                f"the book is at {self._version}"
            )
        return self._solve_rows(composition.rows, _log_level(percentile))

    # ----- internals ----------------------------------------------------------------------

    def _sorts(self, rows: np.ndarray) -> bool:
        """Whether a composition's key is its sorted rows (few servers for the book's rows)
        rather than its count per row."""
        return rows.size * 8 < self._capacity

    def _solve_rows(self, rows: np.ndarray, log_level: float) -> Solution:
        """x_p^u for mapped rows (a multiset: a repeated row counts once per repeat)."""
        k = rows.size
        per_task = math.exp(log_level / k)
        found = (
            None
            if k == 1
            else _search(self._coarse, self._blocks, rows, log_level, self._threshold_ms)
        )
        if found is None:
            # One distinct row: F^k = p/100 has the closed form F^{-1}((p/100)^(1/k)).
            cdf = self._snap(int(rows[0]))
            x = cdf.quantile(per_task)
            return Solution(x, "tail-model" if x > cdf.threshold_ms else "empirical", per_task)
        cell, step, s0, s1, least_threshold_ms = found
        if cell > COARSE_CELLS:
            x = self._solve_beyond_grid(rows, log_level)
        elif cell == 0:
            # Only for p/100 below e^-700: every involved row has F = 0 at the grid's foot.
            x = float(self._grid_ms[0])
        else:
            block = self._blocks[cell - 1]
            if not 1 <= step <= FINE_STEPS:
                # Unreached: the block's end points are the coarse ones, summed in the same
                # order to the same bits. Clamp and sum afresh should that ever change.
                step = min(max(step, 1), FINE_STEPS)
                s0, s1 = _probe(block, rows, step - 1), _probe(block, rows, step)
            x = self._interpolate(s0, s1, (cell - 1) * FINE_STEPS + step, log_level)
            if s1 == 0.0:
                # Every involved row reached F = 1 (rows without a tail jump to 1 at their
                # largest sample, which is then the exact answer).
                x = min(x, float(self._sup_ms[rows].max()))
        tail_model = x > least_threshold_ms
        return Solution(x, "tail-model" if tail_model else "empirical", per_task)

    def _snap(self, slot: int) -> LatencyCdf | TableCdf:
        cdf = self._snaps[slot]
        if cdf is None:
            raise AssertionError(f"slot {slot} is mapped but holds no snapshot")
        return cdf

    def _map(self, server_id: str, slot: int) -> None:
        """The server's row is in this slot: in the dict, and in the C index."""
        self._slot_of[server_id] = slot
        if self._index is None:
            return
        if type(server_id) is str:
            self._index.set(server_id, slot)
        else:
            self._index = None

    def _row_of(self, server_id: str) -> _Row:
        row = self._rows_by_id.get(server_id)
        if row is None:
            raise KeyError(f"unknown server id {server_id!r}")
        return row

    def _rows_of(self, server_ids: Sequence[str]) -> np.ndarray:
        if isinstance(server_ids, str):
            raise TypeError("server_ids must be a sequence of ids, not one string")
        n = len(server_ids)
        if n == 0:
            raise ValueError("server_ids is empty: a query needs at least one server")
        try:
            if n == 1:
                return np.array([self._slot_of[server_ids[0]]], dtype=np.intp)
            if self._index is not None and n >= _C_ROWS_MIN:
                # gateway/_hotpath.c: a hash table of its own, ~4 ns an id where the ids are
                # the registered strings, against ~20-25 ns a dict lookup through the C API.
                found = self._index.lookup(server_ids)
                if found is not None:  # None: an id not an exact str, for the dict to judge
                    return np.frombuffer(found, dtype=np.intp)
            # itemgetter does the n dict lookups in C; fromiter unboxes the tuple (the two
            # together are ~20% faster than fromiter over map(dict.__getitem__)).
            return np.fromiter(itemgetter(*server_ids)(self._slot_of), np.intp, count=n)
        except KeyError as exc:
            raise KeyError(f"unknown server id {exc.args[0]!r}") from None

    def _new_row(self, prior_ms: ArrayLike | TableCdf, group: str | None) -> _Row:
        # Rows registered with the same prior object (the servers of a pool, in turn with
        # other pools' or not) start from one window and one snapshot, seeded once and
        # shared read-only until each row's first refresh (_Row.own_window; the slot:
        # _refresh): an idle server holds neither.
        cache = self._seeded
        seeded = cache.pop(id(prior_ms), None)
        if seeded is None or seeded[0] is not prior_ms:
            window, filled = _seed_window(prior_ms, self._window_size)
            window.setflags(write=False)
            cdf: LatencyCdf | TableCdf
            if isinstance(prior_ms, TableCdf):
                cdf = prior_ms
            else:
                cdf = LatencyCdf.from_samples(window[:filled], self._tail_fraction)
            seeded = (prior_ms, window, filled, cdf)
            while len(cache) >= SEEDED_PRIORS:
                del cache[next(iter(cache))]
        cache[id(prior_ms)] = seeded  # the most recently used, last
        _, window, filled, cdf = seeded
        model = prior_ms if isinstance(prior_ms, TableCdf) else None
        row = _Row(window, filled, cdf, group, model=model)
        row.slot = self._attach(cdf)
        if group is not None:
            self._group_row[group] = row
        return row

    def _attach(self, cdf: LatencyCdf | TableCdf) -> int:
        """The slot holding this snapshot, taken by one more row (a new slot, filled, for a
        snapshot no row holds yet)."""
        slot = self._slot_by_snap.get(id(cdf))
        if slot is not None:
            self._refs[slot] += 1
            return slot
        if self._free:
            slot = self._free.pop()
            self._snaps[slot] = cdf
            self._refs[slot] = 1
        else:
            slot = len(self._snaps)
            self._snaps.append(cdf)
            self._refs.append(1)
            if slot >= self._capacity:
                self._grow(max(8, slot + slot // 2))
        self._slot_by_snap[id(cdf)] = slot
        self._install(slot)
        return slot

    def _release(self, slot: int) -> None:
        """One row less holds the slot's snapshot; the last one frees the slot."""
        self._refs[slot] -= 1
        if self._refs[slot]:
            return
        del self._slot_by_snap[id(self._snap(slot))]
        self._snaps[slot] = None
        self._free.append(slot)
        # A free slot must add 0 to any sum over L and never win a min or max.
        self._coarse[:, slot] = 0.0
        self._blocks[:, :, slot] = 0.0
        self._threshold_ms[slot] = math.inf
        self._sup_ms[slot] = -math.inf

    def _detach(self, server_id: str, row: _Row) -> None:
        row.members.discard(server_id)
        if row.members:
            return
        if row.group is not None:
            del self._group_row[row.group]
        self._release(row.slot)

    def _grow(self, capacity: int) -> None:
        """Room for `capacity` rows in L and its side arrays; new slots are empty."""
        extra = capacity - self._capacity
        self._coarse = np.concatenate(
            [self._coarse, np.zeros((COARSE_CELLS + 1, extra), dtype=np.float32)], axis=1
        )
        self._blocks = np.concatenate(
            [self._blocks, np.zeros((COARSE_CELLS, FINE_STEPS + 1, extra), dtype=np.float32)],
            axis=2,
        )
        self._threshold_ms = np.concatenate([self._threshold_ms, np.full(extra, math.inf)])
        self._sup_ms = np.concatenate([self._sup_ms, np.full(extra, -math.inf)])
        self._capacity = capacity

    @staticmethod
    def _span_ms(cdf: LatencyCdf | TableCdf) -> tuple[float, float]:
        """Range the grid must cover for a row: its F = 0 foot to its 1 - 1e-7 level."""
        return max(cdf.min_ms, MIN_GRID_MS), cdf.quantile(1.0 - GRID_TOP_SURVIVAL)

    def _install(self, slot: int) -> None:
        """Put a row's fresh snapshot into L, rebuilding the grid if the row outgrew it."""
        lo, hi = self._span_ms(self._snap(slot))
        if self._grid_ms.size == 0 or lo <= self._grid_ms[0] or hi > self._grid_ms[-1]:
            self._rebuild_grid()
        else:
            self._fill(slot)

    def _fill(self, slot: int) -> None:
        cdf = self._snap(slot)
        grid = self._grid_ms
        # F is 0 below the smallest sample (log F floored); above it, log F on the ascending
        # grid, where log P(X > x) falls (one branch of log(1 - e^a) per point).
        first = int(np.searchsorted(grid, cdf.min_ms, side="left"))
        log_f = np.full(grid.size, LOG_FLOOR)
        log_s = (
            cdf.log_survival_ascending(grid[first:])
            if isinstance(cdf, LatencyCdf)
            else cdf.log_survival(grid[first:])
        )
        log_f[first:] = np.maximum(_log1mexp_falling(log_s), LOG_FLOOR)
        self._coarse[:, slot] = log_f[::FINE_STEPS]
        self._blocks[:, :, slot] = log_f[_BLOCK_INDEX]
        self._threshold_ms[slot] = cdf.threshold_ms
        self._sup_ms[slot] = cdf.max_ms if cdf.tail is None else math.inf

    def _rebuild_grid(self) -> None:
        """Lay a fresh grid over every live row's span (rare: a row outgrew the grid)."""
        spans = [self._span_ms(cdf) for cdf in self._snaps if cdf is not None]
        lo = min(s[0] for s in spans) / GRID_MARGIN
        hi = max(max(s[1] for s in spans), lo * GRID_MARGIN**2) * GRID_MARGIN
        self._grid_ms = np.geomspace(lo, hi, COARSE_CELLS * FINE_STEPS + 1)
        self._log_grid = np.log(self._grid_ms)
        for slot, cdf in enumerate(self._snaps):
            if cdf is not None:
                self._fill(slot)

    def _interpolate(self, s0: float, s1: float, point: int, log_level: float) -> float:
        """x between grid[point - 1] and grid[point], where the sums (s0 at the one, s1 at the
        other) cross log_level."""
        if s0 >= log_level:
            return float(self._grid_ms[point - 1])
        if s1 < 0.0:
            # Interpolate log(-sum) in log x: exact for power-law tails and nearly so for
            # exponential ones, where -sum ~ k P(X > x) falls by decades over the grid.
            w0 = math.log(-s0)
            frac = (w0 - math.log(-log_level)) / (w0 - math.log(-s1))
        else:
            frac = (log_level - s0) / (s1 - s0)
        frac = min(max(frac, 0.0), 1.0)
        y0 = self._log_grid[point - 1]
        return math.exp(y0 + frac * (self._log_grid[point] - y0))

    def _solve_beyond_grid(self, rows: np.ndarray, log_level: float) -> float:
        """Bisection on the exact CDFs above the grid (fanouts far beyond 10^4 at p99)."""
        slots, counts = np.unique(rows, return_counts=True)
        cdfs = [self._snap(s) for s in slots.tolist()]

        def total(x_ms: float) -> float:
            return sum(float(c) * float(f.log_cdf(x_ms)) for c, f in zip(counts, cdfs, strict=True))

        lo_ms = float(self._grid_ms[-1])
        hi_ms = lo_ms * 2.0
        while total(hi_ms) < log_level and hi_ms < 1e300:
            lo_ms, hi_ms = hi_ms, hi_ms * 2.0
        for _ in range(200):
            mid = math.sqrt(lo_ms * hi_ms)
            if total(mid) < log_level:
                lo_ms = mid
            else:
                hi_ms = mid
            if hi_ms - lo_ms <= 1e-12 * hi_ms:
                break
        return hi_ms
