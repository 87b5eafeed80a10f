"""How often a gateway asks its servers for word: a bounded share of a core, whatever N.

A gateway hears from each server in two ways besides its results: the link's heartbeat
(a ``status`` call every ``heartbeat_s``) and the server's registration refresh (a POST
every ``register_interval_s``). Each costs the gateway a fixed amount of CPU (about 150 µs
a heartbeat and most of a millisecond a refresh, an HTTP request on a new connection), so
at one a second and one every 5 s, 1,000 servers kept a sixth of a core busy while nothing
happened, and 6,000 would have filled it.

So both are paced by the number of servers registered (Envoy's health checking and
Kubernetes' node leases make the same trade):

- A server's results are its liveness signal while it has work: a link that heard from
  its server within the period sends no heartbeat (gateway.links).
- A quiet server is asked at most every `heartbeat_period_s`: ``heartbeat_s`` up to
  HEARTBEATS_PER_S * heartbeat_s servers, longer beyond, so that all quiet servers together
  take at most HEARTBEATS_PER_S heartbeats a second (each period drawn with JITTER, so that
  servers registered together spread out). Given work, a quiet server's results stand in
  for the heartbeat, and it is asked at once when none came within ``heartbeat_s``: a server
  that stalled while quiet is still found within ``heartbeat_timeout_s`` of being given work.
- The answer to a registration asks the server to refresh it every `refresh_period_s`
  at the earliest: its own interval up to REFRESHES_PER_S * interval servers, longer
  beyond (taskserver.lifecycle honours it). A restarted gateway learns a server again
  within that period.

Below about a hundred servers nothing changes: the periods are the configured ones.

The budgets are set by what an idle gateway may spend: at 10,000 servers, 100 heartbeats and
20 refreshes a second cost it 7.8% of a core on a 2-core machine (loadtests/bench_scale),
against a target of 5%. Most of that is wake-ups, one per heartbeat sent and one per reply,
not the heartbeats' Python: the quiet periods now end together on ticks (QUIET_TICK_S).
At 50 and 10 a second a quiet server is asked every N / 50 s (200 s at 10,000: it is still
found within heartbeat_timeout_s of being given work) and a restarted
gateway learns every server again within N / 10 s.
"""

from __future__ import annotations

__all__ = [
    "HEARTBEATS_PER_S",
    "JITTER",
    "QUIET_TICK_S",
    "REFRESHES_PER_S",
    "heartbeat_period_s",
    "refresh_period_s",
]

HEARTBEATS_PER_S = 50.0
"""Explicit heartbeats a second the quiet servers take together, at most."""
REFRESHES_PER_S = 10.0
"""Registration refreshes a second the servers are asked to send together, at most."""
JITTER = 0.25
"""A quiet link's period is drawn from period * (1 ± JITTER) beyond heartbeat_s."""
QUIET_TICK_S = 0.1
"""A quiet period beyond heartbeat_s ends on the next tick of this grid (or of heartbeat_s / 4,
if finer), all the links' together (gateway.links.QuietTicks): what an idle gateway spends is
mostly its wake-ups, not the heartbeats' Python. 100 links to quiet servers taking 50
heartbeats a second cost their process 545 µs of CPU a heartbeat with the periods spread
(jittered), 103 µs with the same periods in step (one run each, the 2-core VM): on a grid,
the ~5 heartbeats due in a tenth of a second go out in one turn of the loop."""


def heartbeat_period_s(heartbeat_s: float, servers: int) -> float:
    """Seconds between heartbeats to a quiet server when `servers` are registered."""
    return max(heartbeat_s, servers / HEARTBEATS_PER_S)


def refresh_period_s(servers: int) -> float:
    """Seconds a server is asked to wait at least between registration refreshes."""
    return servers / REFRESHES_PER_S
