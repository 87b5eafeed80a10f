"""A dependency-free progress bar on stderr: done/total, elapsed time and ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_WIDTH = 30
"""Characters of the bar itself."""


def format_duration(seconds: float) -> str:
    """Seconds as m:ss (or h:mm:ss)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressBar:
    """Counts units of work; redraws in place on a TTY, else prints a line per ~10%."""

    def __init__(
        self,
        total: int,
        label: str = "",
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._start = clock()
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._last_decile = -1
        self._closed = False
        self._draw()

    def advance(self, n: int = 1) -> None:
        """Count n more units as done."""
        self.update(self.done + n)

    def update(self, done: int) -> None:
        """Set the units done (clamped to [0, total]; the bar never moves backwards)."""
        done = min(max(done, self.done), self.total)
        if done != self.done:
            self.done = done
            self._draw()

    def close(self) -> None:
        """Finish the bar: mark everything done and end its line."""
        if self._closed:
            return
        self.update(self.total)
        self._closed = True
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()

    def line(self) -> str:
        """The current state as one line of text."""
        frac = self.done / self.total
        filled = int(frac * _WIDTH)
        bar = "#" * filled + "." * (_WIDTH - filled)
        elapsed = self._clock() - self._start
        # ETA from the average pace so far; unknown until something is done.
        eta = format_duration(elapsed * (self.total - self.done) / self.done) if self.done else "?"
        label = f"{self.label} " if self.label else ""
        return (
            f"{label}[{bar}] {self.done}/{self.total} {frac:4.0%} "
            f"elapsed {format_duration(elapsed)} eta {eta}"
        )

    def _draw(self) -> None:
        if self._tty:
            self._stream.write("\r" + self.line())
            self._stream.flush()
            return
        # Not a terminal (a log file, CI): one line per tenth, so logs stay short.
        decile = int(10 * self.done / self.total)
        if decile != self._last_decile:
            self._last_decile = decile
            self._stream.write(self.line() + "\n")
            self._stream.flush()
