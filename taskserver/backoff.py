"""Retrying without hammering and without flooding the log: two small pure objects.

``Backoff`` says how long to wait before the next try: exponential (``base_s`` times
``factor`` per consecutive failure, at most ``cap_s``) with full jitter, a uniform draw from
``[0, that]`` taken from an injected ``random.Random`` (processes that fail together, such as
the task servers of one ``tailgate up`` waiting for their gateway, then do not retry in
lockstep). ``RetryLog`` says what to log about the tries: the first failure, a failure whose
error differs from the last one logged, a "still failing" line at most once per
``every_s``, and the recovery once. Time comes in as ``now``.

Task servers and edge agents use both for their registration with the gateway
(taskserver.lifecycle), the gateway for its links' reconnects (gateway.links).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "RetryLog"]


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter; `failed()` gives the next delay, `reset()` on
    success."""

    base_s: float
    """The bound of the first delay."""
    cap_s: float
    """No delay is longer."""
    rng: random.Random
    factor: float = 2.0
    """Each consecutive failure multiplies the bound by this."""
    failures: int = 0
    """Consecutive failures so far."""

    def __post_init__(self) -> None:
        """Raise ValueError naming the bad field."""
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"base_s: must be > 0 and <= cap_s ({self.cap_s}), got {self.base_s}")
        if self.factor < 1:
            raise ValueError(f"factor: must be >= 1, got {self.factor}")

    def bound_s(self, failures: int) -> float:
        """The largest delay after `failures` consecutive failures (>= 1)."""
        # the exponent is capped so that a long outage cannot overflow the float
        return min(self.cap_s, self.base_s * self.factor ** min(max(failures - 1, 0), 64))

    def failed(self) -> float:
        """Count one more failure; the delay before the next try, in [0, bound_s]."""
        self.failures += 1
        return self.rng.uniform(0.0, self.bound_s(self.failures))

    def reset(self) -> None:
        """A try succeeded: the next failure starts over at base_s."""
        self.failures = 0


@dataclass(slots=True)
class RetryLog:
    """What to say about a retried operation, and when: each method returns the line to log,
    or None to keep quiet."""

    what: str
    """The operation, for people: "registration at http://gw:8080"."""
    every_s: float = 60.0
    """At most one "still failing" line per this long."""
    failures: int = 0
    """Consecutive failures so far."""
    first_s: float | None = None
    """When the current run of failures began (None: none)."""
    _logged_s: float = field(default=0.0, init=False, repr=False)
    _logged_error: str | None = field(default=None, init=False, repr=False)

    def failed(self, error: str, now: float, next_s: float | None = None) -> str | None:
        """One more failure with `error` at `now` (next try in `next_s`): the line to log."""
        self.failures += 1
        after = f" (next try in {next_s:.1f} s)" if next_s is not None else ""
        if self.first_s is None:
            self.first_s = now
            line = f"{self.what} failed: {error}{after}"
        elif error != self._logged_error:
            line = f"{self.what} failed after {self.failures} tries: {error}{after}"
        elif now - self._logged_s >= self.every_s:
            line = (
                f"{self.what} still failing after {self.failures} tries over "
                f"{now - self.first_s:.0f} s: {error}{after}"
            )
        else:
            return None
        self._logged_s, self._logged_error = now, error
        return line

    def succeeded(self, now: float) -> str | None:
        """A try succeeded at `now`: the recovery line after failures, else None."""
        if self.first_s is None:
            return None
        line = (
            f"{self.what} succeeded after {self.failures} failed "
            f"{'try' if self.failures == 1 else 'tries'} over {now - self.first_s:.1f} s"
        )
        self.failures, self.first_s, self._logged_error = 0, None, None
        return line

    @property
    def failing(self) -> bool:
        """Whether the last try failed."""
        return self.first_s is not None
