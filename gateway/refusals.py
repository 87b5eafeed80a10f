"""Refused requests, aggregated: one log line per source and interval with a count, and a
slowdown for a source that keeps failing (pure: time comes in as `now`).

A flood of refused registrations used to write a WARNING line per attempt (31,176 attempts,
4.8 MB in 8 minutes); `RefusalLog` writes the first refusal of a quiet source at once and
then one line per source and interval, in a table of bounded size.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["MAX_REASONS", "RefusalLog", "RefusalVerdict"]


@dataclass(slots=True)
class _Source:
    """Refusals of one source since its last log line."""

    since: float
    count: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    recent: int = 0
    """Refusals toward the next slowdown."""
    strikes: int = 0
    """Slowdowns so far: each doubles the next one."""
    slowed_until: float = -math.inf


@dataclass(frozen=True, slots=True)
class RefusalVerdict:
    """What to do about one refused request."""

    lines: tuple[str, ...] = ()
    """Log lines due now (the first refusal of a quiet source, a window that closed)."""
    retry_after_s: int | None = None
    """The source is slowed down: answer 429 with this Retry-After instead."""


MAX_REASONS = 8
"""Distinct reasons counted apart per source; the rest count as 'other'."""


class RefusalLog:
    """Refused requests aggregated per source: the first refusal of a quiet source is
    logged at once, the rest as one line per source and interval with a count; a source
    that keeps failing is slowed down. At most `max_sources` are tracked; refusals from
    any others are counted together, so a flood from many addresses cannot grow it."""

    def __init__(
        self,
        interval_s: float = 60.0,
        max_sources: int = 1024,
        slowdown_after: int = 20,
        slowdown_max_s: float = 60.0,
    ) -> None:
        self.interval_s = interval_s
        self.max_sources = max_sources
        self.slowdown_after = slowdown_after
        self.slowdown_max_s = slowdown_max_s
        self.sources: dict[str, _Source] = {}
        self.overflow = _Source(since=-math.inf)
        """Refusals from sources beyond max_sources, counted together."""
        self.total = 0

    def refuse(self, source: str, reason: str, now: float) -> RefusalVerdict:
        """Count one refused request of `source` ("POST /v1/servers: 401 unknown credential")."""
        self.total += 1
        lines = self._roll(source, now)
        entry = self.sources.get(source)
        if entry is None and len(self.sources) >= self.max_sources:
            first = self.overflow.count == 0 and self.overflow.since == -math.inf
            if first:
                self.overflow.since = now
                lines.append(
                    f"refused {reason} from {source}; more than {self.max_sources} sources "
                    f"are failing: the refusals of the others are counted together and logged "
                    f"every {self.interval_s:g} s"
                )
            else:
                self.overflow.count += 1
                _count(self.overflow.reasons, reason)
            return RefusalVerdict(tuple(lines))
        if entry is None:
            self.sources[source] = entry = _Source(since=now)
            lines.append(
                f"refused {reason} from {source}; further refusals from {source} are counted "
                f"and logged every {self.interval_s:g} s"
            )
        elif now < entry.slowed_until:
            entry.count += 1
            _count(entry.reasons, f"{reason}, answered 429")
            return RefusalVerdict(tuple(lines), max(1, math.ceil(entry.slowed_until - now)))
        else:
            entry.count += 1
            _count(entry.reasons, reason)
        entry.recent += 1
        if entry.recent >= self.slowdown_after:
            penalty_s = min(2.0**entry.strikes, self.slowdown_max_s)
            entry.strikes += 1
            entry.recent = 0
            entry.slowed_until = now + penalty_s
        return RefusalVerdict(tuple(lines))

    def flush(self, now: float, final: bool = False) -> list[str]:
        """The lines of every window that closed by `now` (`final`: of every window, as the
        gateway stops); quiet sources are forgotten."""
        lines: list[str] = []
        for source in list(self.sources):
            lines += self._roll(source, now, final)
        closed = final or now >= self.overflow.since + self.interval_s
        if self.overflow.since != -math.inf and closed:
            o = self.overflow
            if o.count:
                lines.append(
                    f"refused {o.count} more requests from sources beyond the "
                    f"{self.max_sources} counted apart in the last {now - o.since:.0f} s "
                    f"({_reasons(o.reasons)})"
                )
                self.overflow = _Source(since=now)
            else:
                self.overflow = _Source(since=-math.inf)
        return lines

    def _roll(self, source: str, now: float, final: bool = False) -> list[str]:
        """Close the source's window if it is over: its line, or forget a quiet source."""
        entry = self.sources.get(source)
        if entry is None or (now < entry.since + self.interval_s and not final):
            return []
        if entry.count == 0:
            if now >= entry.slowed_until:
                del self.sources[source]  # quiet for a whole interval: forgotten
            else:
                entry.since, entry.recent = now, 0
            return []
        slowed = ""
        if now < entry.slowed_until:
            slowed = f"; slowed down: 429 for {math.ceil(entry.slowed_until - now)} s more"
        line = (
            f"refused {entry.count} more requests from {source} in the last "
            f"{now - entry.since:.0f} s ({_reasons(entry.reasons)}){slowed}"
        )
        entry.since, entry.count, entry.recent = now, 0, 0
        entry.reasons = Counter()
        return [line]


def _count(reasons: Counter[str], reason: str) -> None:
    if reason not in reasons and len(reasons) >= MAX_REASONS:
        reason = "other"
    reasons[reason] += 1


def _reasons(reasons: Counter[str]) -> str:
    return ", ".join(f"{reason} x{n}" for reason, n in reasons.most_common())
