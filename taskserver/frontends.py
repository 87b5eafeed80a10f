"""The gateways in front of a pool and their local request rates: λ = Σ λ_i (Swayam §4.2).

Swayam sizes a pool for the global request rate λ, while each frontend (here: each gateway
replica) sees only its local rate λ_i. The paper lets every frontend compute λ = n_F · λ_i,
which holds when the broker spreads requests evenly, and gossips n_F through backend replies:
a backend reports the number of frontends it heard from within the last t_setup.

Here the gossip rides on the heartbeat. Each gateway sends its λ_i with its ``status`` call
(``FrontendLoad``); a task server keeps the latest rate it heard from each gateway within a
horizon and lists them all in its reply (``ServerStatus.frontends``); each gateway merges what
its links report and sums: λ = λ_own + Σ_{other gateways} λ_j. Beyond the paper: summing the
rates, instead of multiplying n_F by the local rate, stays right when the load is uneven across
gateways (a client pinned to one replica, a load balancer with sticky sessions).

`FrontendRates` is the table both sides keep: pure (time comes in as ``now``), bounded (at
most ``max_frontends`` gateways; a new one is refused while the table is full of live ones).
`load_problem` and `reported_loads` check what arrives from the wire before the table takes
it. The module lives here, in the lowest package that needs it: the task server keeps one
table, the gateway another, and the task server imports nothing of ours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from taskserver.messages import MAX_ID_CHARS

__all__ = [
    "FRONTEND_HORIZON_S",
    "MAX_FRONTENDS",
    "MAX_RATE_PER_S",
    "FrontendRates",
    "load_problem",
    "reported_loads",
]

MAX_FRONTENDS = 64
"""Most gateways a table keeps, and a gateway reads from one reply (the rest is ignored)."""
MAX_RATE_PER_S = 1e9
"""Largest rate a gateway may report."""
FRONTEND_HORIZON_S = 10.0
"""A task server's default horizon: a gateway not heard from for this long is forgotten
(about three of the gateway's default heartbeat timeouts of 3 s)."""


@dataclass(frozen=True, slots=True)
class _Heard:
    rate_per_s: float
    heard_s: float


def load_problem(gateway_id: Any, rate_per_s: Any) -> str | None:
    """Why a reported (gateway id, rate) must not be believed (None: it may)."""
    if type(gateway_id) is not str or not 0 < len(gateway_id) <= MAX_ID_CHARS:
        return f"gateway_id: must be a UTF-8 string of 1..{MAX_ID_CHARS} characters"
    # A chained comparison is False for NaN and raises TypeError for None.
    try:
        if not 0.0 <= rate_per_s <= MAX_RATE_PER_S:
            raise TypeError
    except TypeError:
        return f"rate_per_s: must be a finite number within 0..{MAX_RATE_PER_S:g}"
    return None


def reported_loads(loads: Any) -> list[tuple[str, float]]:
    """The believable (gateway id, rate) pairs of a ``ServerStatus.frontends`` list: at most
    MAX_FRONTENDS of them, the rest ignored; anything but a list gives none."""
    if type(loads) is not list:
        return []
    out: list[tuple[str, float]] = []
    for load in loads[:MAX_FRONTENDS]:
        gateway_id = getattr(load, "gateway_id", None)
        rate = getattr(load, "rate_per_s", None)
        if load_problem(gateway_id, rate) is None:
            out.append((gateway_id, float(rate)))
    return out


class FrontendRates:
    """The latest rate heard from each gateway, forgotten `horizon_s` after it was heard."""

    __slots__ = ("_heard", "horizon_s", "max_frontends", "refused")

    def __init__(self, horizon_s: float, max_frontends: int = MAX_FRONTENDS) -> None:
        if not (horizon_s > 0 and math.isfinite(horizon_s)):
            raise ValueError(f"horizon_s: must be a finite number > 0, got {horizon_s!r}")
        if isinstance(max_frontends, bool) or not isinstance(max_frontends, int):
            raise ValueError(f"max_frontends: must be an int >= 1, got {max_frontends!r}")
        if max_frontends < 1:
            raise ValueError(f"max_frontends: must be an int >= 1, got {max_frontends!r}")
        self.horizon_s = horizon_s
        self.max_frontends = max_frontends
        self.refused = 0
        """Reports of a new gateway turned away because the table was full."""
        self._heard: dict[str, _Heard] = {}

    def heard(self, gateway_id: str, rate_per_s: float, now: float) -> bool:
        """Take a gateway's rate heard at `now`; False if the table is full of others.

        A report older than the one kept (merged from several servers' replies) is ignored.
        """
        problem = load_problem(gateway_id, rate_per_s)
        if problem is not None:
            raise ValueError(problem)
        kept = self._heard.get(gateway_id)
        if kept is not None:
            if now >= kept.heard_s:
                self._heard[gateway_id] = _Heard(float(rate_per_s), now)
            return True
        if len(self._heard) >= self.max_frontends:
            self._expire(now)
            if len(self._heard) >= self.max_frontends:
                self.refused += 1
                return False
        self._heard[gateway_id] = _Heard(float(rate_per_s), now)
        return True

    def forget(self, gateway_id: str) -> None:
        """Drop a gateway at once (its last connection closed)."""
        self._heard.pop(gateway_id, None)

    def rates(self, now: float) -> dict[str, float]:
        """Gateway id -> its latest rate, for every gateway heard within the horizon."""
        self._expire(now)
        return {gid: h.rate_per_s for gid, h in sorted(self._heard.items())}

    def ids(self, now: float, own_id: str | None = None) -> list[str]:
        """The gateways heard within the horizon, and `own_id` with them, sorted."""
        live = set(self.rates(now))
        if own_id:
            live.add(own_id)
        return sorted(live)

    def frontends(self, now: float, own_id: str | None = None) -> int:
        """n_F: the gateways heard within the horizon, counting `own_id` once (Swayam §4.2)."""
        return len(self.ids(now, own_id))

    def global_rate(self, own_id: str | None, own_rate: float, now: float) -> float:
        """λ: this gateway's own rate plus every other gateway's latest (beyond the paper's
        n_F · λ_i); an entry under `own_id` (our own rate, echoed back) is not counted."""
        return own_rate + math.fsum(r for gid, r in self.rates(now).items() if gid != own_id)

    def merge(self, reports: Iterable[tuple[str, float]], heard_s: float) -> None:
        """Take one reply's (gateway id, rate) pairs, all heard at `heard_s`."""
        for gateway_id, rate in reports:
            self.heard(gateway_id, rate, heard_s)

    def _expire(self, now: float) -> None:
        # An entry heard at t counts while now < t + horizon_s (as RatePredictor's samples).
        cutoff = now - self.horizon_s
        stale = [gid for gid, h in self._heard.items() if h.heard_s <= cutoff]
        for gid in stale:
            del self._heard[gid]

    def __len__(self) -> int:
        return len(self._heard)
