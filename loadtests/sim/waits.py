"""QLM's waiting-time estimator in the simulator: what each server's state predicts.

The event-driven engine (`loadtests.sim.events`) asks `SimWaits` for every target of an
arriving query when the admission rule reads the estimate (``predictive``) or when the run
records estimates for the `wait-estimator` experiment. The estimate is the same function the
gateway calls (`admission.waiting.estimate_wait`), on the moments of the same CDF rows
(`CdfBook.moments`); here the server's state is exact (the queue itself and its slots),
where the gateway sees only the tasks it has outstanding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from admission.groups import RATE_WINDOW_SERVICES, ArrivalRates
from admission.waiting import LogCdf, ServiceMoments, WaitEstimate, meet_probability
from gateway.cdf import CdfBook

__all__ = ["SimWaits"]


@dataclass(slots=True)
class SimWaits:
    """Per-server service moments and CDF rows, and (when recording) every task's estimate."""

    moments: list[ServiceMoments]
    """Per server: the moments of its CDF row (QLM §6's mean and variance)."""
    row: list[int]
    """Per server: its CDF row (servers of one row share F)."""
    log_cdf: dict[int, LogCdf]
    """Per row: log F of the post-queuing time."""
    record: bool = False
    """Keep every admitted task's last estimate (est_mean/est_sd/est_ahead/est_groups)."""
    est_mean: np.ndarray = field(default_factory=lambda: np.empty(0))
    est_sd: np.ndarray = field(default_factory=lambda: np.empty(0))
    est_ahead: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    est_groups: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """Distinct request groups (here: classes) among the tasks queued ahead."""
    base_mean: np.ndarray = field(default_factory=lambda: np.empty(0))
    base_sd: np.ndarray = field(default_factory=lambda: np.empty(0))
    """The estimate from the queue as it stands (QLM's, without overtaking)."""
    rates: list[ArrivalRates] = field(default_factory=list)
    """Per server: each request group's task arrival rate (per ms), for overtaking."""
    group_keys: dict[tuple[int, int], tuple[float, float, int]] = field(default_factory=dict)
    """Per request group (class, fanout): (budget T_b ms, SLO ms, priority), its order key."""
    overtaking: bool = True
    """Add the work of later arrivals that go ahead (admission.waiting.with_overtaking)."""
    query_meet: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Per query: the last P(meet SLO) the predictive rule was given (NaN: never)."""

    @classmethod
    def of(
        cls,
        book: CdfBook,
        ids: list[str],
        tasks: int,
        record: bool = False,
        overtaking: bool = True,
        queries: int = 0,
    ) -> SimWaits:
        """The estimator's inputs for the servers `ids` of `book`; arrays for `tasks` tasks.

        Each server's group rates are weighted over RATE_WINDOW_SERVICES of its mean
        service times."""
        rows = [book.row_key(s) for s in ids]
        log_cdf: dict[int, LogCdf] = {}
        for s, r in zip(ids, rows, strict=True):
            if r not in log_cdf:
                log_cdf[r] = book.cdf_of(s).log_cdf
        n = tasks if record else 0
        moments = [book.moments(s) for s in ids]
        return cls(
            moments,
            rows,
            log_cdf,
            record,
            np.full(n, np.nan),
            np.full(n, np.nan),
            np.full(n, -1, dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
            np.full(n, np.nan),
            np.full(n, np.nan),
            [ArrivalRates(RATE_WINDOW_SERVICES * m.mean_ms) for m in moments],
            {},
            overtaking,
            np.full(queries, np.nan),
        )

    def meet(self, servers: list[int], estimates: list[WaitEstimate], slack_ms: float) -> float:
        """P(the query meets its SLO) from its targets' estimates (admission.waiting)."""
        by_row: dict[int, list[WaitEstimate]] = {}
        for s, e in zip(servers, estimates, strict=True):
            by_row.setdefault(self.row[s], []).append(e)
        return meet_probability(((self.log_cdf[r], es) for r, es in by_row.items()), slack_ms)
