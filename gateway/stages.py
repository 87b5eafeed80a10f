"""Multi-query requests: one SLO over M sequential fanout queries (TailGuard eq. (5)).

TailGuard §III.C: a request made of M queries that run one after another meets its SLO when
the sum of their latencies does, so its budget is additive over its queries; how to split it
between them the paper leaves to future work. Here each stage's SLO is assigned when the
stage starts, from what remains of the request's SLO, so time a stage did not use passes to
the stages after it. With R the request's SLO minus the time already spent and u_j the
unloaded p-th latency x_p^u of stage j over its own servers (eq. 2), for the stage s about to
run:

- ``remaining``: x_s^SLO = R - sum_{j>s} u_j. Every bit of slack goes to the stage that runs
  now; the later stages are left their unloaded latencies and what the earlier stages leave.
- ``proportional``: the slack S = R - sum_{j>=s} u_j is shared in proportion to the stages'
  unloaded latencies, x_s^SLO = u_s + S u_s / sum_{j>=s} u_j.
- ``equal``: the slack is shared equally between the stages left, x_s^SLO = u_s + S / (M - s).

A stage's task budget is then its SLO less its own x_p^u (eq. 4), as for a single query. The
rules are ours (beyond the paper); `tailgate sim experiment multi-query` compares them.

Pure code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["STAGE_RULES", "stage_slo_ms"]

STAGE_RULES = ("remaining", "proportional", "equal")
"""How a request's remaining SLO is shared between its stages."""


def stage_slo_ms(rule: str, remaining_ms: float, unloaded_ms: Sequence[float]) -> float:
    """The SLO of the stage about to run: `unloaded_ms` holds x_p^u of it and of every stage
    after it, in order; `remaining_ms` is the request's SLO less the time already spent."""
    if rule not in STAGE_RULES:
        raise ValueError(f"stage rule: must be one of {', '.join(STAGE_RULES)}, got {rule!r}")
    if not unloaded_ms:
        raise ValueError("unloaded_ms: the stage about to run needs its x_p^u")
    if any(not (u >= 0 and math.isfinite(u)) for u in unloaded_ms):
        raise ValueError(f"unloaded_ms: must be finite and >= 0, got {list(unloaded_ms)!r}")
    u_now = unloaded_ms[0]
    later = sum(unloaded_ms[1:])
    if rule == "remaining":
        return remaining_ms - later
    slack = remaining_ms - u_now - later
    if rule == "equal":
        return u_now + slack / len(unloaded_ms)
    total = u_now + later
    share = u_now / total if total > 0 else 1.0 / len(unloaded_ms)
    return u_now + slack * share
