"""The gateway's wiring: one server registry, one query path, and what they share.

`GatewayService` builds the CDF book, the deadline estimator, the admission gate and the
metrics, and connects the server registry (`gateway.server_registry`: links, CDF rows,
pool selection) to the query path (`gateway.query_path`: plan, dispatch, gather, answer)
through the links' callbacks. The HTTP shell (`gateway.app`) and the readers
(`gateway.view.GatewayView`: metrics, history, autoscaler, dashboard) see this object.

Lifecycle: ``start`` registers the configured servers and makes it ready; ``drain`` stops
admitting and waits for the queries in flight; ``stop`` closes every link.
"""

from __future__ import annotations

import logging
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from admission import AdmissionGate, SwayamPolicy
from gateway.auth import open_writes_warning
from gateway.autoscaling import AutoscalerLoop, make_actuator
from gateway.cdf import CdfBook
from gateway.config import GatewayConfig
from gateway.deadlines import DeadlineEstimator, DeadlinePlan
from gateway.history import HistoryRecorder
from gateway.links import ServerLink, TaskLink
from gateway.metrics import GatewayMetrics
from gateway.query_path import DRAIN_MARGIN_S, DrainReport, QueryAnswer, QueryPath
from gateway.requests import QueryRequest, RegisterRequest
from gateway.server_registry import ServerRegistry
from gateway.server_windows import ServerMissRatios
from gateway.targets import TargetPicker
from gateway.tracing import Caller, open_gateway_tracer
from taskserver.tls import tls_argv

__all__ = ["DRAIN_MARGIN_S", "DrainReport", "GatewayService", "QueryAnswer"]

log = logging.getLogger(__name__)


class GatewayService:
    """Servers, CDFs, admission and the fanout query path, wired together."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.perf_counter,
        rng: random.Random | None = None,
        link_factory: Callable[..., TaskLink] = ServerLink,
    ) -> None:
        """`link_factory` builds the link to a registering server with ServerLink's
        arguments (a fake in unit tests of the query path)."""
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.registry = registry or CollectorRegistry()
        self.metrics = GatewayMetrics(self.registry, [c.latency_ms for c in config.classes])
        self.book = CdfBook(
            window_size=config.cdf_window,
            refresh_every=config.cdf_refresh_every,
            tail_fraction=config.tail_fraction,
        )
        self.estimator = DeadlineEstimator(self.book)
        # The gate's draws (the throttle's) follow the service's generator, so a seeded
        # service repeats its decisions.
        self.gate = AdmissionGate(
            config.admission, config.classes, clock, seed=self.rng.getrandbits(64)
        )
        self.metrics.bind_window(self.gate.miss_ratio, [c.name for c in config.classes])
        self.metrics.bind_objectives(config.classes)
        id_prefix = uuid.uuid4().hex[:8]
        self.instance_id = f"{socket.gethostname()}-{id_prefix}"
        """This replica's id: names it as the owner of the central-queueing servers it claims."""
        self.servers = ServerRegistry(
            config, self.book, self.metrics, clock, self.rng, self.instance_id, link_factory
        )
        self.query = QueryPath(
            config, clock, self.servers, self.book, self.estimator, self.gate, self.metrics,
            id_prefix,
        )  # fmt: skip
        # Tracing on: spans of queries and tasks; the extra missing is a ConfigError here,
        # before anything listens (gateway.tracing).
        self.query.tracer = open_gateway_tracer(config.tracing, clock)
        self.servers.on_result = self.query.on_result
        self.servers.on_results = self.query.on_results
        self.servers.on_failure = self.query.on_failure
        self.servers.on_dequeue = self.query.on_dequeue
        self.servers.arbiter_for = self.query.tenants.arbiter
        self.autoscaler: AutoscalerLoop | None = None
        self.started = False
        """start() is done: the gateway admits queries (GET /readyz)."""
        self.metrics.bind_servers(
            lambda: [(lk.pool, lk.display_state) for lk in self.links.values()], of_view=True
        )
        self.metrics.bind_service(self)
        self.history = HistoryRecorder(self)

    # -- what the registry and the query path hold ----------------------------------------

    @property
    def links(self) -> dict[str, TaskLink]:
        """Every registered server's link, by id."""
        return self.servers.links

    @property
    def targets(self) -> TargetPicker:
        """The pools' target selection."""
        return self.servers.targets

    @property
    def pool_members(self) -> dict[str, Any]:
        """Servers in each pool's selection."""
        return self.servers.targets.pool_members

    @property
    def server_windows(self) -> ServerMissRatios:
        """Windowed miss ratio per server and per pool (GatewayView)."""
        return self.metrics.server_windows

    @property
    def draining(self) -> bool:
        """Stopping: new queries get 503 `draining`; those in flight finish."""
        return self.query.draining

    # -- servers -----------------------------------------------------------------------

    async def start(self) -> None:
        """Register the servers named in the configuration and start the history sampler."""
        warning = open_writes_warning(self.config)
        if warning is not None:
            log.warning("%s", warning)
        for pool in self.config.pools:
            for entry in pool.servers:
                await self.register(
                    RegisterRequest(entry.id, pool.name, entry.address, entry.slots, entry.cluster)
                )
        self.servers.start_grace()
        self.started = True
        await self.history.start()

    async def enable_autoscaler(
        self,
        gateway_url: str,
        extra_args: list[str],
        initial: int | None = None,
        slots: int = 1,
        metrics_port_base: int | None = None,
    ) -> AutoscalerLoop:
        """Scale the pool to `initial` (default: min replicas), then start the autoscaler.

        Its local actuator dials gateway_url.
        """
        cfg = self.config.autoscaling
        # The servers it starts listen with TLS when the links use it ([tls]).
        extra_args = [*extra_args, *tls_argv(self.config.tls)]
        if cfg.policy == "swayam":
            extra_args = [*extra_args, "--idle-exit-s", f"{cfg.idle_s:g}"]
        pool = self.config.pool_named(cfg.pool)
        if pool is not None and pool.dispatch == "retry":
            # Swayam §4.5: the servers it starts turn tasks away when busy.
            extra_args = [*extra_args, "--reject-when-busy"]
        actuator = make_actuator(
            cfg,
            gateway_url,
            extra_args,
            slots,
            token=self.config.token,
            metrics_port_base=metrics_port_base,
        )
        loop = AutoscalerLoop(self, cfg, actuator, self.clock)
        self.autoscaler = loop
        self.query.autoscaler = loop
        policy = loop.policy
        if isinstance(policy, SwayamPolicy):
            # Swayam §4.4: the pool routes by its ordered prefix of policy.in_use backends.
            self.targets.prefix[cfg.pool] = lambda: policy.in_use
        start = cfg.min_replicas if initial is None else initial
        started = await loop.actuator.scale_to(min(max(start, cfg.min_replicas), cfg.max_replicas))
        if isinstance(policy, SwayamPolicy):
            # Route to every server started (not to min_replicas of them) until the model
            # says otherwise: the extra ones then idle and retire, as Swayam's scale-in does.
            policy.in_use = max(policy.in_use, started)
        loop.start()
        return loop

    async def stop(self) -> None:
        """Close every link; queries still running fail at once."""
        await self.history.stop()
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        await self.servers.close_all("gateway stopping")
        if self.query.tracer is not None:
            self.query.tracer.shutdown()  # export the spans still batched

    async def register(self, req: RegisterRequest) -> tuple[bool, dict[str, Any]]:
        """Add or refresh a server; returns (created, its view)."""
        return await self.servers.register(req)

    async def deregister(self, server_id: str, drain_s: float = 0.0) -> dict[str, Any]:
        """Remove a server; with drain_s, first let its outstanding tasks finish."""
        return await self.servers.deregister(server_id, drain_s)

    def server_view(self, link: TaskLink) -> dict[str, Any]:
        """A server as GET /v1/servers shows it."""
        return self.servers.server_view(link)

    def groups_view(self) -> list[dict[str, Any]]:
        """GET /v1/groups: every request group (QLM §4) with its statistics."""
        return self.query.groups.snapshot(self.clock(), dict(self.servers.links.pool_slots))

    def tenants_view(self) -> dict[str, Any]:
        """GET /v1/tenants: the allocation layer's flows with their shares and counters."""
        # Only links with a gateway-held queue have tasks of the flows waiting.
        return self.query.tenants.view(self.servers.links.central.values(), self.clock())

    # -- queries -----------------------------------------------------------------------

    def resolve(self, req: QueryRequest) -> list[TaskLink]:
        """The k_f target servers of a query."""
        return self.query.resolve(req)

    def plan(self, req: QueryRequest, links: list[TaskLink]) -> DeadlinePlan:
        """x_p^u over exactly these servers and the task budget."""
        return self.query.plan(req, links)

    async def run_query(
        self, req: QueryRequest, t0: float | None = None, caller: Caller | None = None
    ) -> QueryAnswer:
        """Fan a validated query out and answer it; never later than SLO + grace. `caller`:
        the HTTP request's id and trace context (gateway.request_ids)."""
        return await self.query.run_query(req, t0, caller)

    def drain_bound_s(self) -> float:
        """Longest a query already admitted may still run: the largest class SLO plus grace."""
        return self.query.drain_bound_s()

    async def drain(self, timeout_s: float | None = None) -> DrainReport:
        """Admit nothing new; wait for the queries in flight, at most timeout_s."""
        return await self.query.drain(timeout_s)
