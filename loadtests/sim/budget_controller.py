"""Per-class budget adjustment from measured tail-vs-SLO gaps.

Beyond TailGuard: the paper stamps T_b = x_p^SLO - x_p^u(k_f) and leaves how
to share slack between classes as future work (§III.C, request budgets).
Under one fixed rule, one class usually reaches its SLO at a lower load than
the others, which still have slack. This controller scales each class's
budget by s_c, T_b' = s_c · T_b: a class whose tail sits closer to its SLO
than the others' gets a smaller budget (earlier deadlines, served sooner),
one with more slack a larger one, until the classes' tail/SLO ratios meet.
Then all classes reach their limits at the same load.

Update, once per measurement window, with r_c = tail_c / SLO_c:

    log s_c += gain · (mean_c r_c - r_c);   then recentre: geometric mean of s = 1

and clamp s_c to [min_scale, max_scale]. Recentring keeps the budgets
anchored to the paper's: only the classes' relative urgency moves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetUpdate:
    """One controller step: the ratios it saw and the scales it set."""

    ratios: dict[str, float]
    scales: dict[str, float]


class BudgetController:
    """Scales for each class's pre-dequeuing budget (pure: fed tails, returns scales)."""

    def __init__(
        self,
        classes: Sequence[str],
        *,
        gain: float = 1.0,
        min_scale: float = 0.2,
        max_scale: float = 5.0,
    ) -> None:
        if not classes:
            raise ValueError("classes: at least one class is needed")
        if not gain > 0:
            raise ValueError(f"gain: must be > 0, got {gain}")
        if not 0 < min_scale <= 1 <= max_scale:
            raise ValueError(
                f"min_scale/max_scale: need 0 < min <= 1 <= max, got {min_scale}, {max_scale}"
            )
        self.gain = gain
        self.min_scale = min_scale
        self.max_scale = max_scale
        self._log = {c: 0.0 for c in classes}

    def scale(self, cls: str) -> float:
        """Current multiplier of the class's budget."""
        return math.exp(self._log[cls])

    @property
    def scales(self) -> dict[str, float]:
        """Every class's multiplier."""
        return {c: math.exp(v) for c, v in self._log.items()}

    def update(self, tails: Mapping[str, tuple[float, float]]) -> BudgetUpdate:
        """Feed {class: (tail latency ms, SLO ms)} of the last window; classes without a
        measurement keep their scale."""
        ratios = {
            c: (lat / slo if math.isfinite(lat) else 10.0)
            for c, (lat, slo) in tails.items()
            if c in self._log and slo > 0 and not math.isnan(lat)
        }
        if len(ratios) >= 2:
            mean = sum(ratios.values()) / len(ratios)
            for c, r in ratios.items():
                self._log[c] += self.gain * (mean - r)
            centre = sum(self._log.values()) / len(self._log)
            lo, hi = math.log(self.min_scale), math.log(self.max_scale)
            for c in self._log:
                self._log[c] = min(hi, max(lo, self._log[c] - centre))
        return BudgetUpdate(ratios, self.scales)
