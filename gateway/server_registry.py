"""The gateway's server registry: its links to the task servers, their CDF rows and the
pools' selection.

Servers register and deregister here (POST/DELETE /v1/servers, and the servers named in
the configuration); each gets a `TaskLink` built by the link factory (`ServerLink` in
service), a row in the CDF book primed from its pool's offline profile, and a place in
its pool's target selection, which it leaves while it drains. The link reports every
task's fate to the query path through the callbacks wired in by `GatewayService`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from functools import partial
from typing import Any

from admission.allocation import DrrArbiter, FairArbiter
from gateway.cdf import CdfBook
from gateway.config import GatewayConfig, PoolConfig, parse_address
from gateway.errors import NotFound
from gateway.links import (
    DequeueCallback,
    FailureCallback,
    ResultCallback,
    ResultsCallback,
    TaskLink,
)
from gateway.metrics import GatewayMetrics
from gateway.pacing import heartbeat_period_s, refresh_period_s
from gateway.requests import RegisterRequest
from gateway.retry_after import server_back_s
from gateway.table_cdf import prior_of
from gateway.targets import TargetPicker
from gateway.waits import backlog_wait
from taskserver.framecheck import WireLimits
from taskserver.heap import Refreeze, refreeze
from taskserver.service_time import make_distribution
from taskserver.tls import link_client_tls

__all__ = ["ServerLinks", "ServerRegistry"]

log = logging.getLogger(__name__)

_VIEW_PERCENTILES = (50, 90, 99, 99.9)
_VIEW_LEVELS = tuple(q / 100.0 for q in _VIEW_PERCENTILES)
_VIEW_NAMES = tuple(f"p{q:g}" for q in _VIEW_PERCENTILES)
"""The post-queuing quantiles a server's view shows."""


def _cdf_group(pool: PoolConfig, cluster: str | None) -> str | None:
    """The CDF row a server of the pool shares (None: a row of its own)."""
    if pool.cdf == "shared":
        return pool.name
    if pool.cdf == "cluster" and cluster is not None:
        return f"{pool.name}/{cluster}"
    return None


def _unwired(*args: Any) -> None:
    raise RuntimeError("ServerRegistry: link callbacks are not wired (GatewayService does it)")


class ServerLinks(dict[str, TaskLink]):
    """The registered links by id (a dict: the query path's lookups are the dict's own),
    with what the scrape and the views need of all of them kept as links come and go:
    each pool's slots and the links with a gateway-held (central) queue. At 10,000 servers
    a walk of every link for these took ~10 ms of a scrape's head on the 2-core VM.

    A link's pool, slots and queue are set when it is built and never change (a server
    registering again with others gets a new link), so adding and removing keep them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool_slots: dict[str, int] = {}
        """Pool -> the slots of its registered servers (whatever their state)."""
        self.central: dict[str, TaskLink] = {}
        """The links whose tasks wait in a gateway-held queue, by id."""

    def _added(self, link: TaskLink) -> None:
        self.pool_slots[link.pool] = self.pool_slots.get(link.pool, 0) + link.slots
        if link.queue is not None:
            self.central[link.server_id] = link

    def _removed(self, key: str, link: TaskLink) -> None:
        left = self.pool_slots[link.pool] - link.slots
        if left:
            self.pool_slots[link.pool] = left
        else:
            del self.pool_slots[link.pool]
        if self.central.get(key) is link:
            del self.central[key]

    def __setitem__(self, key: str, link: TaskLink) -> None:
        old = self.get(key)
        if old is not None:
            self._removed(key, old)
        super().__setitem__(key, link)
        self._added(link)

    def __delitem__(self, key: str) -> None:
        link = self[key]
        super().__delitem__(key)
        self._removed(key, link)

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        link = super().pop(key)
        self._removed(key, link)
        return link

    def popitem(self) -> tuple[str, TaskLink]:
        key, link = super().popitem()
        self._removed(key, link)
        return key, link

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, link in dict(*args, **kwargs).items():
            self[key] = link

    def clear(self) -> None:
        super().clear()
        self.pool_slots.clear()
        self.central.clear()

    def __ior__(self, other: Any) -> ServerLinks:  # type: ignore[override,misc]
        self.update(other)
        return self


class ServerRegistry:
    """The servers this gateway knows, by id, with their links and pool selection."""

    def __init__(
        self,
        config: GatewayConfig,
        book: CdfBook,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        rng: random.Random,
        instance_id: str,
        link_factory: Callable[..., TaskLink],
    ) -> None:
        self.config = config
        self.book = book
        self.metrics = metrics
        self.clock = clock
        self.instance_id = instance_id
        self._link_factory = link_factory
        self._link_rng = random.Random()
        """The links' jitter (reconnect backoff, quiet heartbeat periods): one generator for
        all of them, not a Mersenne Twister state (2.5 KB) per server."""
        self.links = ServerLinks()
        self._grace_from: float | None = None
        """When the registration grace began (the service's start; None: not started)."""
        self.targets = TargetPicker(
            config, self.links, rng, self._wait_of, self._back_in, self._registering_left
        )
        self._drain_ends: dict[str, float] = {}
        """Servers being deregistered with a drain bound -> when it passes (clock time)."""
        self._pools = {p.name: p for p in config.pools}
        self._priors: dict[str, Any] = {}
        self._wire_limits = WireLimits.for_frames_of(config.max_frame_bytes)
        self._tls = link_client_tls(config.tls)
        """TLS on every link ([tls] links): one context, reloaded for all (taskserver.tls);
        loaded here, so a bad certificate file stops the gateway before it listens."""
        self._refreeze = Refreeze()
        """When to freeze the objects of servers that joined since start-up (their links,
        rows, connections): a full collection then does not walk them (taskserver.heap)."""
        self._refreeze_timer: asyncio.TimerHandle | None = None
        self.on_result: ResultCallback = _unwired
        """Told each task's result (the query path's, wired by GatewayService)."""
        self.on_results: ResultsCallback | None = None
        """Told a frame's results at once, when wired (the query path's batch form)."""
        self.on_failure: FailureCallback = _unwired
        self.on_dequeue: DequeueCallback = _unwired
        self.arbiter_for: Callable[[], DrrArbiter | FairArbiter | None] = lambda: None
        """A new allocation arbiter for a central queue (wired by GatewayService)."""

    def _wait_of(self, link: TaskLink) -> tuple[float, float]:
        """(estimated wait of a task joining the back of its queue, mean service), in ms:
        a least-wait pool's ranking of its servers."""
        if not self.book.has_server(link.server_id):
            return (math.inf, math.inf)
        moments = partial(self.book.moments, link.server_id)
        return (backlog_wait(link, moments).mean_ms, moments().mean_ms)

    def _back_in(self, link: TaskLink) -> float | None:
        """How soon a server that takes no task now may take one again (Retry-After)."""
        now = self.clock()
        ends = self._drain_ends.get(link.server_id) if link.draining else None
        return server_back_s(
            link.display_state,
            now - link.registered_s,
            None if ends is None else ends - now,
            self.config.heartbeat_s,
            self.config.heartbeat_timeout_s,
        )

    def _prior(self, pool: PoolConfig) -> Any:
        prior = self._priors.get(pool.name)
        if prior is None:
            # The offline profile (TailGuard §III.C.2): the service law plus wire overhead;
            # a quantile table is primed as its exact model (tail included).
            dist = make_distribution(pool.prior)
            prior = prior_of(dist, shift_ms=pool.prior_overhead_ms, points=self.config.cdf_window)
            self._priors[pool.name] = prior
        return prior

    async def register(self, req: RegisterRequest) -> tuple[bool, dict[str, Any]]:
        """Add or refresh a server; returns (created, its view)."""
        existing = self.links.get(req.id)
        if existing is not None:
            if (existing.address, existing.pool, existing.slots, existing.cluster) == (
                req.address,
                req.pool,
                req.slots,
                req.cluster,
            ):
                existing.registered_s = self.clock()  # a refresh is the server's heartbeat
                return False, self._registered_view(existing)
            await self.deregister(req.id)
        host, port = parse_address(req.address)
        pool = self._pools[req.pool]
        central = pool.queueing == "central"
        arbiter = self.arbiter_for() if central else None
        shared: dict[str, Any] = {} if arbiter is None else {"arbiter": arbiter}
        if self._tls is not None:
            shared.update(tls=self._tls, server_name=self.config.tls.server_name)
        link = self._link_factory(
            req.id,
            host,
            port,
            pool=req.pool,
            cluster=req.cluster,
            slots=req.slots,
            central=central,
            policy=pool.policy,
            on_result=self.on_result,
            on_results=self.on_results,
            on_failure=self.on_failure,
            quiet_period=self._quiet_period,
            clock=self.clock,
            heartbeat_s=self.config.heartbeat_s,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            gateway_id=self.instance_id,
            on_change=self.on_link_change,
            on_dequeue=self.on_dequeue,
            limits=self._wire_limits,
            rng=self._link_rng,
            token=self.config.token,
            on_violation=lambda lk, v: self.metrics.wire_violations.labels(
                lk.server_id, v.reason
            ).inc(),
            **shared,
        )
        self.book.add_server(req.id, self._prior(pool), group=_cdf_group(pool, req.cluster))
        self.links[req.id] = link
        self.targets.join(link)
        link.start()
        self._joined()
        # A fresh registration is usually followed by queries: give the link a moment.
        await link.wait_up(min(0.5, self.config.heartbeat_timeout_s))
        log.info(
            "server %s registered in pool %s%s at %s",
            req.id,
            req.pool,
            f" (cluster {req.cluster})" if req.cluster else "",
            req.address,
            extra={"server_id": req.id, "pool": req.pool, "outcome": "registered"},
        )
        return True, self._registered_view(link)

    def start_grace(self) -> None:
        """The service has started: `registration_grace_s` of registrations begins now."""
        self._grace_from = self.clock()

    def _registering_left(self) -> float:
        """Seconds left of the registration grace (0 before the start and after it)."""
        if self._grace_from is None:
            return 0.0
        return max(0.0, self.config.registration_grace_s - (self.clock() - self._grace_from))

    def _joined(self) -> None:
        """A server joined: once a burst of them is over, freeze what they brought."""
        wait_s = self._refreeze.joined(self.clock())
        if wait_s is None:
            return
        if self._refreeze_timer is not None:
            self._refreeze_timer.cancel()
        self._refreeze_timer = asyncio.get_running_loop().call_later(wait_s, self._settle_joined)

    def _settle_joined(self) -> None:
        self._refreeze_timer = None
        now = self.clock()
        if not self._refreeze.due(now):
            # The loop's timers may fire a little early (uvloop: whole milliseconds): ask
            # again when the quiet time is over, unless the clock did not move (tests).
            left_s = self._refreeze.quiet_s - (now - self._refreeze.last_join_s)
            if 0.0 < left_s < self._refreeze.quiet_s:
                self._refreeze_timer = asyncio.get_running_loop().call_later(
                    left_s + 0.001, self._settle_joined
                )
            return
        servers = self._refreeze.new
        self._refreeze.frozen()
        if refreeze():
            log.info("froze the long-lived objects of %d servers that joined", servers)

    def _quiet_period(self) -> float:
        """Seconds between heartbeats to a server that holds no task (gateway.pacing)."""
        return heartbeat_period_s(self.config.heartbeat_s, len(self.links))

    def _registered_view(self, link: TaskLink) -> dict[str, Any]:
        """A registration's answer: the server's view and how long it should wait before
        refreshing the registration (gateway.pacing: more servers, rarer refreshes)."""
        refresh_s = refresh_period_s(len(self.links))
        return {**self.server_view(link), "refresh_s": round(refresh_s, 3)}

    async def deregister(self, server_id: str, drain_s: float = 0.0) -> dict[str, Any]:
        """Remove a server; with drain_s, first let its outstanding tasks finish.

        The server leaves the pool's selection at once; whatever is still outstanding
        after drain_s fails (its queries answer 502 and their siblings are cancelled).
        """
        link = self.links.get(server_id)
        if link is None:
            raise NotFound(f"no server {server_id!r}", field="id")
        link.draining = True
        self.targets.leave(link)
        if drain_s > 0:
            self._drain_ends[server_id] = self.clock() + drain_s
            try:
                await link.wait_idle(drain_s)
            finally:
                self._drain_ends.pop(server_id, None)
        failed = len(link.outstanding)
        if self.links.get(server_id) is link:
            del self.links[server_id]
            self.book.remove_server(server_id)
        await link.close(f"server {server_id} deregistered")
        if server_id not in self.links:  # not replaced by a new registration meanwhile
            self.metrics.server_windows.forget(server_id, self.clock())
        return {"id": server_id, "deleted": True, "drained": failed == 0, "failed_tasks": failed}

    def server_view(self, link: TaskLink) -> dict[str, Any]:
        """A server as GET /v1/servers shows it."""
        cdf = self.book.cdf_of(link.server_id) if self.book.has_server(link.server_id) else None
        view: dict[str, Any] = {
            "id": link.server_id,
            "pool": link.pool,
            "cluster": link.cluster,
            "address": link.address,
            "slots": link.slots,
            "state": link.display_state,
            "queueing": "central" if link.central else "server",
            # What the server runs (its heartbeat says): "pipeline" and "sensing" servers get
            # panels of their own on the dashboard.
            "executor": link.executor,
            "outstanding": len(link.outstanding),
            "tasks_sent": link.tasks_sent,
            "results": link.results,
            "rtt_ms": None if link.rtt_ms is None else round(link.rtt_ms, 4),
            # What comes off each task's budgets for the way there (half the least recent RTT).
            "dispatch_delay_ms": round(link.one_way_ms, 4),
            "cdf_samples": self.book.samples_seen(link.server_id) if cdf is not None else 0,
            "registered_ago_s": round(max(self.clock() - link.registered_s, 0.0), 3),
        }
        if link.queue is not None:
            view["queued"] = len(link.queue)
        if link.last_error:
            view["last_error"] = link.last_error
        if link.owner is not None:
            view["owner"] = link.owner
        if cdf is not None:
            values = cdf.quantiles(_VIEW_LEVELS)
            view["post_queue_ms"] = {
                name: round(v, 4) for name, v in zip(_VIEW_NAMES, values, strict=True)
            }
            # QLM §6: what a task joining at the back of its queue now would wait.
            wait = backlog_wait(link, partial(self.book.moments, link.server_id))
            view["estimated_wait_ms"] = round(wait.mean_ms, 4)
            view["estimated_wait_sd_ms"] = round(wait.sd_ms, 4)
        return view

    def on_link_change(self, link: TaskLink) -> None:
        """A server began or ended draining: it leaves or rejoins its pool's selection."""
        if self.links.get(link.server_id) is not link or link.draining:
            return  # being deregistered: deregister() has taken it out already
        member = link.server_id in self.targets.pool_members[link.pool]
        if link.server_draining and member:
            self.targets.leave(link)
            log.info(
                "server %s drains: out of pool %s's selection",
                link.server_id,
                link.pool,
                extra={"server_id": link.server_id, "pool": link.pool, "outcome": "draining"},
            )
        elif not link.server_draining and not member:
            self.targets.join(link)
            log.info(
                "server %s is back in pool %s",
                link.server_id,
                link.pool,
                extra={"server_id": link.server_id, "pool": link.pool, "outcome": "back"},
            )

    async def close_all(self, reason: str) -> None:
        """Close every link; the tasks they hold fail at once."""
        if self._refreeze_timer is not None:
            self._refreeze_timer.cancel()
            self._refreeze_timer = None
        for link in list(self.links.values()):
            await link.close(reason)
        self.links.clear()
