"""Typed configuration of the gateway: classes, pools and limits.

Every field has a default, so a gateway runs with no file at all. Values are
validated in ``__post_init__``; a ValueError's message starts with the
field's name so the loader can prefix the full key path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from taskserver.service_time import ServiceSpec


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """A query class: its tail-latency SLO and its priority."""

    name: str
    """Class name used in queries (`"class": "A"`)."""
    latency_ms: float
    """SLO latency x_p^SLO in milliseconds."""
    percentile: float = 99.0
    """SLO percentile p, in (0, 100)."""
    priority: int = 0
    """Priority for the PRIQ policy: smaller is served first."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if not (math.isfinite(self.latency_ms) and self.latency_ms > 0):
            raise ValueError(f"latency_ms: must be > 0, got {self.latency_ms}")
        if not (0 < self.percentile < 100):
            raise ValueError(f"percentile: must be in (0, 100), got {self.percentile}")


@dataclass(frozen=True, slots=True)
class ServerEntry:
    """A task server known from the configuration (others register over HTTP)."""

    id: str
    """Server id."""
    address: str
    """host:port of its Thrift listener."""
    slots: int = 1
    """Concurrent tasks it serves (used by central queueing)."""

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id: must not be empty")
        parse_address(self.address)
        if self.slots < 1:
            raise ValueError(f"slots: must be >= 1, got {self.slots}")


def _default_prior() -> ServiceSpec:
    return ServiceSpec(kind="exponential", mean_ms=2.0)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A pool of task servers that share a queueing mode and a CDF prior."""

    name: str = "default"
    """Pool name used in targets (`{"pool": "default", ...}`)."""
    queueing: str = "server"
    """`server`: tasks go out at once and queue on the server; `central`: the
    gateway keeps a policy queue per server and sends when a slot is free."""
    policy: str = "tf-edfq"
    """Queue discipline of the gateway-side queues in central mode."""
    cdf: str = "per-server"
    """`per-server`: one online CDF per server; `shared`: one CDF for the pool."""
    prior: ServiceSpec = field(default_factory=_default_prior)
    """Offline profile of post-queuing times each CDF starts from."""
    prior_overhead_ms: float = 0.3
    """Added to the prior's service times for dispatch and return on the wire."""
    servers: tuple[ServerEntry, ...] = ()
    """Servers of this pool known at start."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if self.queueing not in ("server", "central"):
            raise ValueError(f"queueing: must be 'server' or 'central', got {self.queueing!r}")
        if self.policy not in ("tf-edfq", "t-edfq", "priq", "fifo"):
            raise ValueError(
                f"policy: must be one of tf-edfq, t-edfq, priq, fifo, got {self.policy!r}"
            )
        if self.cdf not in ("per-server", "shared"):
            raise ValueError(f"cdf: must be 'per-server' or 'shared', got {self.cdf!r}")
        if self.prior_overhead_ms < 0:
            raise ValueError(f"prior_overhead_ms: must be >= 0, got {self.prior_overhead_ms}")


def _default_classes() -> tuple[ClassConfig, ...]:
    return (
        ClassConfig(name="A", latency_ms=100.0, percentile=99.0, priority=0),
        ClassConfig(name="B", latency_ms=300.0, percentile=99.0, priority=1),
        ClassConfig(name="C", latency_ms=1000.0, percentile=95.0, priority=2),
    )


def _default_pools() -> tuple[PoolConfig, ...]:
    return (
        PoolConfig(),
        # Edge agents: slow, heterogeneous devices behind a gateway-held queue, as in
        # TailGuard's Sensing-as-a-Service testbed.
        PoolConfig(
            name="edge",
            queueing="central",
            prior=ServiceSpec(kind="lognormal", median_ms=20.0, sigma=0.4),
            prior_overhead_ms=1.0,
        ),
    )


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The gateway process."""

    host: str = "127.0.0.1"
    """HTTP bind address."""
    port: int = 8080
    """HTTP port."""
    classes: tuple[ClassConfig, ...] = field(default_factory=_default_classes)
    """Query classes."""
    pools: tuple[PoolConfig, ...] = field(default_factory=_default_pools)
    """Server pools."""
    grace_ms: float = 1000.0
    """A query is answered at the latest at its SLO plus this grace."""
    max_body_bytes: int = 1024 * 1024
    """Largest accepted request body."""
    max_fanout: int = 10_000
    """Largest fanout a query may ask for."""
    heartbeat_s: float = 1.0
    """Ping period on every server link."""
    heartbeat_timeout_s: float = 3.0
    """A server that has not answered a ping for this long is marked down."""
    retry_after_s: int = 1
    """Retry-After sent with 503 answers."""
    cdf_window: int = 4096
    """Post-queuing samples kept per CDF."""
    cdf_refresh_every: int = 256
    """New samples between rebuilds of a CDF (and of its deadlines)."""
    tail_fraction: float = 0.05
    """Fraction of samples above the peaks-over-threshold tail threshold."""
    default_class: str | None = None
    """Class used when a query names neither a class nor an SLO (None: required)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be 0..65535, got {self.port}")
        if not self.classes:
            raise ValueError("classes: at least one class is needed")
        names = [c.name for c in self.classes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"classes: duplicate class name {sorted(dup)[0]!r}")
        if not self.pools:
            raise ValueError("pools: at least one pool is needed")
        pnames = [p.name for p in self.pools]
        pdup = {n for n in pnames if pnames.count(n) > 1}
        if pdup:
            raise ValueError(f"pools: duplicate pool name {sorted(pdup)[0]!r}")
        sids = [s.id for p in self.pools for s in p.servers]
        sdup = {s for s in sids if sids.count(s) > 1}
        if sdup:
            raise ValueError(f"pools: server id {sorted(sdup)[0]!r} appears twice")
        if self.grace_ms < 0:
            raise ValueError(f"grace_ms: must be >= 0, got {self.grace_ms}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes: must be >= 1024, got {self.max_body_bytes}")
        if self.max_fanout < 1:
            raise ValueError(f"max_fanout: must be >= 1, got {self.max_fanout}")
        if self.heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s: must be > 0, got {self.heartbeat_s}")
        if self.heartbeat_timeout_s <= self.heartbeat_s:
            raise ValueError(
                f"heartbeat_timeout_s: must exceed heartbeat_s ({self.heartbeat_s}), "
                f"got {self.heartbeat_timeout_s}"
            )
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s: must be >= 0, got {self.retry_after_s}")
        if self.cdf_window < 100:
            raise ValueError(f"cdf_window: must be >= 100, got {self.cdf_window}")
        if self.cdf_refresh_every < 1:
            raise ValueError(f"cdf_refresh_every: must be >= 1, got {self.cdf_refresh_every}")
        if not 0 < self.tail_fraction < 0.5:
            raise ValueError(f"tail_fraction: must be in (0, 0.5), got {self.tail_fraction}")
        if self.default_class is not None and self.default_class not in names:
            raise ValueError(f"default_class: no class named {self.default_class!r}")

    def class_named(self, name: str) -> ClassConfig | None:
        """The class of that name, if any."""
        for c in self.classes:
            if c.name == name:
                return c
        return None

    def pool_named(self, name: str) -> PoolConfig | None:
        """The pool of that name, if any."""
        for p in self.pools:
            if p.name == name:
                return p
        return None


def parse_address(address: str) -> tuple[str, int]:
    """Split `host:port`, raising ValueError naming the address when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address: expected host:port, got {address!r}")
    return host.strip("[]"), int(port)
