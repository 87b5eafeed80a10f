"""Retry-After estimates: when a refused query may be taken, from what the gateway knows.

Every 503 carries a Retry-After (RFC 9110 §10.2.3, whole delta-seconds, at least 1). Its
value comes from the reason for the refusal, when the gateway can tell:

- admission control on the miss ratio: when the window's misses age out
  (`admission.AdmissionGate.release_after_s`);
- the predictive rule: its own estimate (`admission.rules.Predictive`);
- the target servers take no task now (``servers_down``, ``servers_unavailable``,
  ``cluster_unavailable``): when enough of them may take tasks again, from each one's state
  (`server_back_s`: a registering server's first heartbeat, a lost one's reconnect, a
  deregistering one's drain bound);
- the gateway drains (``draining``): what is left of its drain bound, after which its
  address serves another replica;

and falls back to the configured ``retry_after_s`` when it cannot. Pure functions: times
come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["delta_seconds", "server_back_s", "servers_back_s"]


def delta_seconds(estimate_s: float | None, fallback_s: int) -> int:
    """The Retry-After value for an estimate in seconds: whole seconds rounded up, at least
    1 (so no client retries at once); `fallback_s` when there is no finite estimate."""
    if estimate_s is None or not math.isfinite(estimate_s):
        return fallback_s
    return max(math.ceil(estimate_s), 1)


def server_back_s(
    state: str,
    registered_ago_s: float,
    drain_left_s: float | None,
    heartbeat_s: float,
    heartbeat_timeout_s: float,
) -> float | None:
    """How soon a server that takes no task now may take one again; None: not by itself.

    - ``connecting``: just registered; its link is up at its first heartbeat reply, which
      comes within heartbeat_timeout_s of the registration (the connect's own bound), so
      what is left of that, and at least one heartbeat period;
    - ``down``: the link reconnects (every 2 s at the latest) and is up at the first
      heartbeat reply on the new connection: one heartbeat timeout;
    - ``draining`` with a drain bound (DELETE /v1/servers/{id}?drain_s=...): the server is
      gone when the bound passes, and a replacement (a rolling restart's) takes its place
      about then: what is left of the bound; without a bound, None;
    - anything else (``owned_elsewhere``: another gateway holds it): None.
    """
    if state == "connecting":
        return max(heartbeat_timeout_s - registered_ago_s, heartbeat_s)
    if state == "down":
        return heartbeat_timeout_s
    if state == "draining" and drain_left_s is not None:
        return max(drain_left_s, 0.0)
    return None


def servers_back_s(estimates: Iterable[float | None], needed: int) -> float | None:
    """When `needed` of these servers may take tasks again (each one's `server_back_s`):
    the needed-th soonest; None when fewer than `needed` have an estimate."""
    known = sorted(e for e in estimates if e is not None)
    if needed < 1:
        return 0.0
    if len(known) < needed:
        return None
    return known[needed - 1]
