"""Task deadline-miss ratio over a moving window (TailGuard §III.D).

A task "misses" when it is dequeued after its pre-dequeuing deadline t_D (TailGuard eq. 4).
The window counts either the last `window_tasks` tasks (overall, and separately the last
`window_tasks` of each class) or the tasks recorded in the last `window_s` seconds.

Errors::

    AdmissionError
     └── PolicyValueError     a bad window size or record argument (also a ValueError)

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque

from admission.errors import PolicyValueError

__all__ = ["MissRatioWindow"]

_DEFAULT_WINDOW_TASKS = 100_000


class _Series:
    """Chunks [time, misses, tasks] in arrival order with running sums (overall or one class)."""

    __slots__ = ("chunks", "misses", "tasks")

    def __init__(self) -> None:
        self.chunks: deque[list] = deque()
        self.misses = 0
        self.tasks = 0

    def add(self, now: float, misses: int, tasks: int) -> None:
        """Append a chunk of tasks recorded at `now`."""
        self.chunks.append([now, misses, tasks])
        self.misses += misses
        self.tasks += tasks

    def keep_last(self, limit: int) -> None:
        """Evict the oldest tasks until at most `limit` remain (count-based window)."""
        excess = self.tasks - limit
        chunks = self.chunks
        while excess > 0:
            chunk = chunks[0]
            _, misses, tasks = chunk
            if tasks <= excess:
                chunks.popleft()
                self.misses -= misses
                self.tasks -= tasks
                excess -= tasks
                continue
            # A record_many() batch straddles the edge: the order of misses inside a batch is
            # unknown, so the kept part keeps its share of them, rounded half up (integers, so the
            # running sums never drift).
            keep = tasks - excess
            misses_kept = (2 * misses * keep + tasks) // (2 * tasks)
            self.misses -= misses - misses_kept
            self.tasks -= excess
            chunk[1] = misses_kept
            chunk[2] = keep
            excess = 0

    def drop_until(self, cutoff: float) -> None:
        """Evict chunks recorded at or before `cutoff` (time-based window)."""
        chunks = self.chunks
        while chunks and chunks[0][0] <= cutoff:
            _, misses, tasks = chunks.popleft()
            self.misses -= misses
            self.tasks -= tasks

    def ratio(self) -> float:
        """Misses over tasks; 0.0 when empty."""
        return self.misses / self.tasks if self.tasks else 0.0


class MissRatioWindow:
    """Fraction of tasks dequeued after their t_D over a moving window (TailGuard §III.D)."""

    __slots__ = ("_classes", "_latest", "_overall", "window_s", "window_tasks")

    def __init__(
        self,
        *,
        window_tasks: int | None = _DEFAULT_WINDOW_TASKS,
        window_s: float | None = None,
    ) -> None:
        # Exactly one window: passing window_s alone selects a time window, so window_tasks
        # must then be None or left at its default.
        if window_s is not None:
            if window_tasks not in (None, _DEFAULT_WINDOW_TASKS):
                raise PolicyValueError(
                    f"miss-ratio window: give window_tasks or window_s, not both "
                    f"(window_tasks={window_tasks!r}, window_s={window_s!r})"
                )
            if isinstance(window_s, bool) or not isinstance(window_s, int | float):
                raise PolicyValueError(f"miss-ratio window_s: must be a number, got {window_s!r}")
            if not (window_s > 0 and math.isfinite(window_s)):
                raise PolicyValueError(f"miss-ratio window_s: must be > 0, got {window_s!r}")
            window_tasks = None
        elif window_tasks is None:
            raise PolicyValueError("miss-ratio window: one of window_tasks or window_s is needed")
        elif (
            isinstance(window_tasks, bool) or not isinstance(window_tasks, int) or window_tasks < 1
        ):
            raise PolicyValueError(
                f"miss-ratio window_tasks: must be an int >= 1, got {window_tasks!r}"
            )
        self.window_tasks: int | None = window_tasks
        self.window_s: float | None = None if window_s is None else float(window_s)
        self._overall = _Series()
        self._classes: dict[str, _Series] = {}
        self._latest = -math.inf

    def record(self, missed: bool, now: float, cls: str | None = None) -> None:
        """Count one dequeued task; `missed` means it left after its t_D."""
        self._add(1 if missed else 0, 1, now, cls)

    def record_many(self, misses: int, total: int, now: float, cls: str | None = None) -> None:
        """Count `total` tasks at once, `misses` of them late (e.g. a server's batch report)."""
        for name, value in (("misses", misses), ("total", total)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyValueError(f"miss-ratio {name}: must be an int >= 0, got {value!r}")
        if misses > total:
            raise PolicyValueError(f"miss-ratio misses: {misses} is more than total {total}")
        if total:
            self._add(misses, total, now, cls)

    def ratio(self, now: float, cls: str | None = None) -> float:
        """Windowed miss ratio, overall when cls is None; 0.0 when the window is empty."""
        series = self._series(now, cls)
        return 0.0 if series is None else series.ratio()

    def count(self, now: float, cls: str | None = None) -> int:
        """Tasks in the window, overall when cls is None."""
        series = self._series(now, cls)
        return 0 if series is None else series.tasks

    def release_after_s(self, level: float, now: float) -> float | None:
        """Seconds from `now` until the overall ratio falls below `level` as the window's
        records age out, if no task is recorded meanwhile: 0.0 when it is below already.

        None for a count window (its records leave only as new tasks push them out) and for
        a `level` <= 0. New tasks that meet their deadlines only bring the moment closer, so
        for a time window this is the latest moment the window alone releases.
        """
        series = self._series(now, None)
        assert series is not None
        if series.ratio() < level:
            return 0.0
        if self.window_s is None or level <= 0:
            return None
        latest = self._latest
        misses, tasks = series.misses, series.tasks
        for t, m, n in series.chunks:
            misses -= m
            tasks -= n
            # The chunk recorded at t leaves the window at t + window_s (see _evict).
            if (misses / tasks if tasks else 0.0) < level:
                return max(t + self.window_s - latest, 0.0)
        raise AssertionError("an empty window's ratio is 0.0, below any level > 0")

    def snapshot(self, now: float) -> dict:
        """Overall and per-class ratio, tasks and misses, plus the window size."""
        overall = self._series(now, None)
        assert overall is not None
        classes = {}
        for cls in sorted(self._classes):
            series = self._series(now, cls)
            assert series is not None
            classes[cls] = {"ratio": series.ratio(), "tasks": series.tasks, "misses": series.misses}
        return {
            "ratio": overall.ratio(),
            "tasks": overall.tasks,
            "misses": overall.misses,
            "window_tasks": self.window_tasks,
            "window_s": self.window_s,
            "classes": classes,
        }

    def _add(self, misses: int, tasks: int, now: float, cls: str | None) -> None:
        # Records are taken in time order: an earlier `now` (another shell's clock read a hair
        # late) counts as the latest time seen, so the deques stay sorted and eviction O(1).
        now = self._advance(now)
        targets = [self._overall]
        if cls is not None:
            series = self._classes.get(cls)
            if series is None:
                series = self._classes[cls] = _Series()
            targets.append(series)
        for series in targets:
            series.add(now, misses, tasks)
            self._evict(series, now)

    def _series(self, now: float, cls: str | None) -> _Series | None:
        series = self._overall if cls is None else self._classes.get(cls)
        if series is not None:
            self._evict(series, self._advance(now))
        return series

    def _advance(self, now: float) -> float:
        if now > self._latest:
            self._latest = now
        return self._latest

    def _evict(self, series: _Series, now: float) -> None:
        if self.window_tasks is not None:
            series.keep_last(self.window_tasks)
        else:
            assert self.window_s is not None
            # A record at t counts while now < t + window_s: the window is (now - window_s, now].
            series.drop_until(now - self.window_s)
