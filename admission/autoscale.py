"""Threshold autoscaling on the task deadline-miss ratio (TailGuard §III.E).

TailGuard sets an upper bound R_sth^U and a lower bound R_sth^L on the task deadline-miss ratio:
above the upper bound the resource is scaled up, below the lower bound it is scaled down, and
between them the system runs at high utilisation without violating the tail SLOs. The same
decision drives horizontal scaling (replicas) and vertical scaling (`vertical_step`, where
"replicas" is a scale level the shell maps to a service-time factor).

Beyond the paper: cooldowns (the miss-ratio window still holds pre-scaling tasks right after
a change), clamps to [min_replicas, max_replicas], a bounded decision history (`DecisionLog`:
one entry per change of decision, a run of equal ones counted in it), and flap
damping: when a step down has to be undone by a step up before `down_cooldown_s` has passed,
the thresholds straddle the load (one step down pushes the ratio over R_sth^U), so the
down cooldown in force doubles (`flap_backoff`, up to `max_down_cooldown_s`); a step down that
holds for at least `down_cooldown_s` (undone later, or followed by another step down) resets it.

Errors::

    AdmissionError
     └── PolicyValueError     a bad threshold, bound, step, cooldown or direction

Pure code: time comes in as `now`; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from admission.errors import PolicyValueError

__all__ = [
    "SCALE_DOWN_FACTOR",
    "SCALE_UP_FACTOR",
    "DecisionLog",
    "ScaleDecision",
    "ThresholdAutoscaler",
    "vertical_step",
]

SCALE_UP_FACTOR = 0.8  # one step up: service 20% faster (TailGuard's vertical-scaling runs)
SCALE_DOWN_FACTOR = 1.25  # one step down: service 25% slower, the exact inverse of a step up


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """A scaling step: how many replicas to add (< 0: remove), why, and the target after it."""

    delta: int
    reason: str  # e.g. "above_upper", "below_lower", "within_thresholds", "cooldown", "at_max"
    replicas: int  # the target replica count after the decision


class DecisionLog:
    """The last `size` decisions of an autoscaler, one entry per change.

    An autoscaler decides every interval, and most decisions repeat the last one ("hold:
    within thresholds", "hold: cooldown"). A decision whose `key` equals the last entry's,
    and that changes nothing (`delta` 0), is counted in that entry instead of appended:
    `repeats` (1 for a lone decision) and `last_time` (its latest `time`) grow, and the
    figures that drift from decision to decision (a ratio, a predicted rate) take their
    latest values. A step (`delta` != 0) always starts an entry of its own.
    """

    __slots__ = ("_entries", "_last_key")

    def __init__(self, size: int) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=size)
        self._last_key: tuple[Any, ...] | None = None

    def record(self, entry: dict[str, Any], key: tuple[Any, ...]) -> None:
        """Log one decision: `entry` holds its `time` and `delta`; `key` what makes two
        holds the same decision (its reason, the counts it held at)."""
        entries = self._entries
        last = entries[-1] if entries else None
        held = entry["delta"] == 0 and key == self._last_key
        if last is not None and held and last["delta"] == 0:
            first_time, repeats = last["time"], last["repeats"]
            last.update(entry)
            last["time"], last["last_time"] = first_time, entry["time"]
            last["repeats"] = repeats + 1
            return
        entries.append({**entry, "last_time": entry["time"], "repeats": 1})
        self._last_key = key

    def entries(self) -> list[dict[str, Any]]:
        """The entries, oldest first (copies)."""
        return [dict(e) for e in self._entries]


class ThresholdAutoscaler:
    """TailGuard §III.E: scale up above R_sth^U, down below R_sth^L, with cooldowns."""

    def __init__(
        self,
        *,
        upper: float = 0.015,
        lower: float = 0.005,
        min_replicas: int = 1,
        max_replicas: int = 16,
        step: int = 1,
        up_cooldown_s: float = 10.0,
        down_cooldown_s: float = 30.0,
        history: int = 100,
        flap_backoff: float = 2.0,
        max_down_cooldown_s: float | None = None,
    ) -> None:
        if not (flap_backoff >= 1 and math.isfinite(flap_backoff)):
            raise PolicyValueError(f"autoscale flap_backoff: must be >= 1, got {flap_backoff!r}")
        if not (0 <= lower < upper <= 1):
            raise PolicyValueError(
                f"autoscale thresholds: need 0 <= lower < upper <= 1, "
                f"got lower={lower!r}, upper={upper!r}"
            )
        for name, value, least in (
            ("min_replicas", min_replicas, 0),
            ("max_replicas", max_replicas, 1),
            ("step", step, 1),
            ("history", history, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise PolicyValueError(
                    f"autoscale {name}: must be an int >= {least}, got {value!r}"
                )
        if min_replicas > max_replicas:
            raise PolicyValueError(
                f"autoscale replicas: min_replicas={min_replicas!r} > max_replicas={max_replicas!r}"
            )
        for name, value in (("up_cooldown_s", up_cooldown_s), ("down_cooldown_s", down_cooldown_s)):
            if not (value >= 0 and math.isfinite(value)):
                raise PolicyValueError(f"autoscale {name}: must be >= 0, got {value!r}")
        self.upper = upper  # R_sth^U
        self.lower = lower  # R_sth^L
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.step = step
        self.up_cooldown_s = up_cooldown_s
        self.down_cooldown_s = down_cooldown_s
        self.flap_backoff = flap_backoff
        if max_down_cooldown_s is None:
            max_down_cooldown_s = 8 * down_cooldown_s
        elif not (max_down_cooldown_s >= down_cooldown_s and math.isfinite(max_down_cooldown_s)):
            raise PolicyValueError(
                f"autoscale max_down_cooldown_s: must be >= down_cooldown_s "
                f"({down_cooldown_s!r}), got {max_down_cooldown_s!r}"
            )
        self.max_down_cooldown_s = max_down_cooldown_s
        self.effective_down_cooldown_s = down_cooldown_s
        """The down cooldown now in force (grows while the scaling flaps)."""
        self.last_up_s: float | None = None
        self.last_change_s: float | None = None
        self.last_down_s: float | None = None
        self._history = DecisionLog(history)

    def decide(self, miss_ratio: float, replicas: int, now: float) -> ScaleDecision:
        """One scaling step for the current miss ratio and replica count."""
        decision = self._decide(miss_ratio, replicas, now)
        if decision.delta > 0:
            undoes_down = self.last_down_s is not None and (
                self.last_up_s is None or self.last_up_s < self.last_down_s
            )
            if undoes_down:
                assert self.last_down_s is not None
                if now - self.last_down_s < self.down_cooldown_s:  # flapped
                    self.effective_down_cooldown_s = min(
                        self.max_down_cooldown_s, self.effective_down_cooldown_s * self.flap_backoff
                    )
                else:  # the step down held: the load moved, not the thresholds
                    self.effective_down_cooldown_s = self.down_cooldown_s
            self.last_up_s = now
        elif decision.delta < 0:
            held = self.last_down_s is not None and (
                self.last_up_s is None or self.last_up_s < self.last_down_s
            )
            if held:
                self.effective_down_cooldown_s = self.down_cooldown_s
            self.last_down_s = now
        if decision.delta != 0:
            self.last_change_s = now
        self._history.record(
            {
                "time": now,
                "ratio": miss_ratio,
                "delta": decision.delta,
                "reason": decision.reason,
                "replicas": decision.replicas,
            },
            (decision.reason, decision.replicas),
        )
        return decision

    def snapshot(self, now: float) -> dict:
        """Thresholds, bounds, cooldown state and the last decisions."""
        return {
            "now": now,
            "upper": self.upper,
            "lower": self.lower,
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "step": self.step,
            "up_cooldown_s": self.up_cooldown_s,
            "down_cooldown_s": self.down_cooldown_s,
            "effective_down_cooldown_s": self.effective_down_cooldown_s,
            "last_up_s": self.last_up_s,
            "last_change_s": self.last_change_s,
            "decisions": self._history.entries(),
        }

    def _decide(self, miss_ratio: float, replicas: int, now: float) -> ScaleDecision:
        # Out of bounds (a replica crashed, bounds were changed): move back in at once.
        if replicas < self.min_replicas:
            return ScaleDecision(self.min_replicas - replicas, "below_min", self.min_replicas)
        if replicas > self.max_replicas:
            return ScaleDecision(self.max_replicas - replicas, "above_max", self.max_replicas)
        if miss_ratio > self.upper:
            if replicas >= self.max_replicas:
                return ScaleDecision(0, "at_max", replicas)
            # Up waits only for the previous step up to show in the window.
            if self.last_up_s is not None and now - self.last_up_s < self.up_cooldown_s:
                return ScaleDecision(0, "cooldown", replicas)
            delta = min(self.step, self.max_replicas - replicas)
            return ScaleDecision(delta, "above_upper", replicas + delta)
        if miss_ratio < self.lower:
            if replicas <= self.min_replicas:
                return ScaleDecision(0, "at_min", replicas)
            # Down waits after any change, so a fresh step up is not undone at once.
            cooldown = self.effective_down_cooldown_s
            if self.last_change_s is not None and now - self.last_change_s < cooldown:
                return ScaleDecision(0, "cooldown", replicas)
            delta = -min(self.step, replicas - self.min_replicas)
            return ScaleDecision(delta, "below_lower", replicas + delta)
        return ScaleDecision(0, "within_thresholds", replicas)


def vertical_step(scale: float, direction: int) -> float:
    """Service-time factor after |direction| steps: up (+) *0.8 each, down (-) *1.25 each."""
    if isinstance(direction, bool) or not isinstance(direction, int):
        raise PolicyValueError(f"vertical_step direction: must be an int, got {direction!r}")
    if not (scale > 0 and math.isfinite(scale)):
        raise PolicyValueError(f"vertical_step scale: must be > 0, got {scale!r}")
    factor = SCALE_UP_FACTOR if direction > 0 else SCALE_DOWN_FACTOR
    for _ in range(abs(direction)):
        scale *= factor
    return scale
