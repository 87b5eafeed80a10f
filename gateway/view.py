"""The gateway as its readers see it: a narrow, read-only view of the service.

The scrape-time metrics collector (`gateway.metrics`), the history recorder
(`gateway.history`), the autoscaler loop (`gateway.autoscaling`) and the dashboard
(`gateway.dashboard`) read the service through these protocols and never import
`gateway.service`, so there is no circle between them and the query path.
`GatewayService` satisfies `GatewayView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from admission import AdmissionGate
    from gateway.cdf import CdfBook
    from gateway.config import AutoscalingConfig, GatewayConfig
    from gateway.links import TaskLink
    from gateway.server_windows import ServerMissRatios

__all__ = ["AutoscalerView", "GatewayView", "HistoryView", "MetricsView"]


class AutoscalerView(Protocol):
    """What readers see of the autoscaler loop."""

    @property
    def config(self) -> AutoscalingConfig: ...

    @property
    def decisions(self) -> Mapping[str, int]: ...

    def replicas_now(self) -> int: ...

    def snapshot(self) -> dict[str, Any]: ...


class HistoryView(Protocol):
    """What the dashboard shows of the history recorder."""

    @property
    def where(self) -> str: ...

    @property
    def last_error(self) -> str: ...

    @property
    def samples_written(self) -> int: ...

    async def since(self, since_s: float) -> list[dict[str, Any]]:
        """The samples taken since a wall-clock time."""
        ...


class MetricsView(Protocol):
    """What the history recorder reads of the gateway's metrics."""

    @property
    def queries(self) -> Any:
        """The queries counter (prometheus_client), by class and outcome."""
        ...

    @property
    def drop_counts(self) -> Mapping[tuple[str, str], int]:
        """(pool, pipeline module) -> tasks dropped there, since start."""
        ...

    def drain_latencies(self) -> dict[str, list[float]]:
        """The answered-query latencies since the last call, per class."""
        ...


class GatewayView(Protocol):
    """What the readers of the gateway read; none of them changes it."""

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def links(self) -> Mapping[str, TaskLink]: ...

    @property
    def pool_members(self) -> Mapping[str, Any]: ...

    @property
    def book(self) -> CdfBook: ...

    @property
    def gate(self) -> AdmissionGate: ...

    @property
    def server_windows(self) -> ServerMissRatios: ...

    @property
    def metrics(self) -> MetricsView: ...

    @property
    def autoscaler(self) -> AutoscalerView | None: ...

    @property
    def history(self) -> HistoryView: ...

    def clock(self) -> float:
        """The service clock (monotonic seconds)."""
        ...

    def server_view(self, link: TaskLink) -> dict[str, Any]:
        """One server as GET /v1/servers shows it."""
        ...

    def groups_view(self) -> list[dict[str, Any]]:
        """The request groups as GET /v1/groups shows them."""
        ...

    def tenants_view(self) -> dict[str, Any]:
        """The allocation layer's flows as GET /v1/tenants shows them."""
        ...
