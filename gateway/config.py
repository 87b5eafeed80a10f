"""Typed configuration of the gateway: classes, pools and limits.

Every field has a default, so a gateway runs with no file at all. Values are
validated in ``__post_init__``; a ValueError's message starts with the
field's name so the loader can prefix the full key path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from admission.config import AdmissionConfig, AllocationConfig
from taskserver.queues import QueuePolicy
from taskserver.registration import check_cluster_name, check_token
from taskserver.service_time import ServiceSpec
from taskserver.tls import TlsConfig
from taskserver.tracing import TracingConfig


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
    cluster: str | None = None
    """Cluster label (targets.cluster, targets.per_cluster, cdf = "cluster")."""

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id: must not be empty")
        parse_address(self.address)
        if self.slots < 1:
            raise ValueError(f"slots: must be >= 1, got {self.slots}")
        if self.cluster is not None:
            check_cluster_name(self.cluster)


DISPATCHES = ("queue", "retry")
"""A pool's `dispatch` values: queue at the server, or Swayam's random dispatch with retries."""
MAX_RETRY_DELAY_MS = 60_000.0
"""Largest Δ a pool may set: a retry later than this is past any SLO worth keeping."""


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
    policy: QueuePolicy = QueuePolicy.TF_EDFQ
    """Queue discipline of the gateway-side queues in central mode; in server mode, the order
    the wait estimates assume until a server reports its own."""
    cdf: str = "per-server"
    """`per-server`: one online CDF per server; `shared`: one CDF for the pool; `cluster`: one
    CDF per cluster label (a server without a label keeps its own)."""
    prior: ServiceSpec = field(default_factory=_default_prior)
    """Offline profile of post-queuing times each CDF starts from."""
    prior_overhead_ms: float = 0.3
    """Added to the prior's service times for dispatch and return on the wire."""
    servers: tuple[ServerEntry, ...] = ()
    """Servers of this pool known at start."""
    clusters: tuple[str, ...] = ()
    """Clusters known before any of their servers registers: a query naming one with no live
    server gets 503 (try again) rather than 400 (unknown cluster)."""
    pick: str = "random"
    """How `fanout: k` picks k servers: `random`, or `least-wait`: the k with the smallest
    estimated queue wait for a task joining the back of their queue (QLM's load balancing;
    ties to the faster server, then at random)."""
    dispatch: str = "queue"
    """`queue`: a task waits for a slot in its server's queue (or the gateway's, central);
    `retry`: Swayam's random dispatch with retries (§4.5): servers started with
    `--reject-when-busy` send back a task they have no free slot for, and the gateway sends
    it to another random server of the pool after `retry_delay_ms` (server queueing only)."""
    retry_delay_ms: float = 1.0
    """Δ of a `retry` pool: the least time between two tries of one task (Swayam §4.5, eq. (1)),
    so that a burst of refusals under overload does not become a storm of messages."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"dispatch: must be 'queue' or 'retry', got {self.dispatch!r}")
        if self.dispatch == "retry" and self.queueing != "server":
            raise ValueError(
                f"dispatch: 'retry' needs queueing = 'server' (a central queue sends a task "
                f"only into a free slot, so no server refuses it), got queueing {self.queueing!r}"
            )
        if not 0 <= self.retry_delay_ms <= MAX_RETRY_DELAY_MS:
            raise ValueError(
                f"retry_delay_ms: must be in 0..{MAX_RETRY_DELAY_MS:g}, got {self.retry_delay_ms}"
            )
        if self.pick not in ("random", "least-wait"):
            raise ValueError(f"pick: must be 'random' or 'least-wait', got {self.pick!r}")
        if self.queueing not in ("server", "central"):
            raise ValueError(f"queueing: must be 'server' or 'central', got {self.queueing!r}")
        object.__setattr__(self, "policy", QueuePolicy.parse(self.policy))
        if self.cdf not in ("per-server", "shared", "cluster"):
            raise ValueError(f"cdf: must be 'per-server', 'shared' or 'cluster', got {self.cdf!r}")
        if self.prior_overhead_ms < 0:
            raise ValueError(f"prior_overhead_ms: must be >= 0, got {self.prior_overhead_ms}")
        for i, name in enumerate(self.clusters):
            try:
                check_cluster_name(name)
            except ValueError as exc:
                raise ValueError(f"clusters[{i}]{str(exc).removeprefix('cluster')}") from None
        if len(set(self.clusters)) != len(self.clusters):
            raise ValueError(f"clusters: a cluster is named twice in {list(self.clusters)}")


@dataclass(frozen=True, slots=True)
class AutoscalingConfig:
    """Horizontal autoscaling of one pool on the miss ratio (TailGuard §III.E) or Swayam's model."""

    enabled: bool = False
    """Run the autoscaler (also switched on by `tailgate up --autoscale`)."""
    policy: str = "threshold"
    """`threshold` (R_sth^U / R_sth^L) or `swayam` (rate prediction and n_B search)."""
    pool: str = "default"
    """The pool it scales."""
    upper: float = 0.015
    """R_sth^U: scale up when the miss ratio is above it."""
    lower: float = 0.005
    """R_sth^L: scale down when the miss ratio is below it."""
    min_replicas: int = 1
    """Fewest servers."""
    max_replicas: int = 16
    """Most servers."""
    up_cooldown_s: float = 10.0
    """Least time between two scale-ups."""
    down_cooldown_s: float = 30.0
    """Least time after any scaling before a scale-down."""
    interval_s: float = 1.0
    """How often the autoscaler decides."""
    window_tasks: int = 5_000
    """Miss-ratio window of the autoscaler, in tasks."""
    actuator: str = "local"
    """`local` (processes on this machine) or `kubernetes`."""
    k8s_name: str = "tailgate-taskserver"
    """Kubernetes actuator: the Deployment or StatefulSet to scale."""
    k8s_namespace: str = "default"
    """Kubernetes actuator: its namespace."""
    k8s_kind: str = "Deployment"
    """Kubernetes actuator: Deployment or StatefulSet."""
    setup_s: float = 5.0
    """Swayam: time for a new backend to become ready (the prediction horizon)."""
    burst: float = 1.5
    """Swayam: burst factor U over the predicted rate."""
    idle_s: float = 60.0
    """Swayam: a backend idle this long retires itself (passive scale-in)."""
    history_s: float = 60.0
    """Swayam: the rate regression's window (§4.2: a line through the recent rates)."""
    link_delay_ms: float | None = None
    """Swayam: d1 and d2 of eq. (1), one way each. None (default): measured on the pool's
    links, half the least heartbeat round trip, median over its servers."""

    def __post_init__(self) -> None:
        if self.policy not in ("threshold", "swayam"):
            raise ValueError(f"policy: must be 'threshold' or 'swayam', got {self.policy!r}")
        if not 0 <= self.lower < self.upper < 1:
            raise ValueError(
                f"lower/upper: need 0 <= lower < upper < 1, got {self.lower}, {self.upper}"
            )
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"min_replicas: need 1 <= min_replicas <= max_replicas, got "
                f"{self.min_replicas}, {self.max_replicas}"
            )
        if self.interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {self.interval_s}")
        if self.window_tasks < 1:
            raise ValueError(f"window_tasks: must be >= 1, got {self.window_tasks}")
        if self.actuator not in ("local", "kubernetes"):
            raise ValueError(f"actuator: must be 'local' or 'kubernetes', got {self.actuator!r}")
        if self.k8s_kind not in ("Deployment", "StatefulSet"):
            raise ValueError(f"k8s_kind: must be Deployment or StatefulSet, got {self.k8s_kind!r}")
        if self.burst < 1:
            raise ValueError(f"burst: must be >= 1, got {self.burst}")
        if not (self.history_s > 0 and math.isfinite(self.history_s)):
            raise ValueError(f"history_s: must be > 0, got {self.history_s}")
        if self.link_delay_ms is not None and not (
            self.link_delay_ms >= 0 and math.isfinite(self.link_delay_ms)
        ):
            raise ValueError(f"link_delay_ms: must be >= 0, got {self.link_delay_ms}")


TENANT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""A tenant name: what a Prometheus label and a TOML key take without quoting trouble."""
_TENANT_RE = re.compile(TENANT_PATTERN)
MAX_ROTATING_TOKENS = 2
"""Admin or read tokens valid at once: the current one and the next, while rotating."""
MAX_TENANT_KEYS = 16
"""API keys one tenant may hold at once."""


def check_tokens(tokens: tuple[str, ...], name: str, limit: int) -> None:
    """ValueError naming `name` unless every token can travel as a Bearer credential and
    there are at most `limit` (the message never quotes a token)."""
    if len(tokens) > limit:
        raise ValueError(f"{name}: at most {limit} at once, got {len(tokens)}")
    for i, token in enumerate(tokens):
        try:
            check_token(token)
        except ValueError as exc:
            raise ValueError(f"{name}[{i}]: {str(exc).removeprefix('token: ')}") from None


@dataclass(frozen=True, slots=True)
class TenantAccess:
    """A tenant's API keys for POST /v1/queries and /v1/requests, and each key's limits
    (`[tenants.NAME]` in tailgate.toml)."""

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    """Keys a client of this tenant sends as `Authorization: Bearer <key>`; a query with
    one runs as this tenant (keep keys out of shared files: prefer api_keys_file)."""
    api_keys_file: str | None = None
    """A file of keys, one per line (# comments): re-read when it changes and on SIGHUP."""
    rate_per_s: float = 0.0
    """Queries per second each key may send (a token bucket); 0: no limit."""
    burst: int = 0
    """Queries a key may send at once above its rate; 0: the rate rounded up, at least 1."""
    max_in_flight: int = 0
    """Queries of one key running at once; 0: no limit."""

    def __post_init__(self) -> None:
        check_tokens(self.api_keys, "api_keys", MAX_TENANT_KEYS)
        if self.api_keys_file is not None and not self.api_keys_file:
            raise ValueError("api_keys_file: must be a file path")
        if not self.api_keys and self.api_keys_file is None:
            raise ValueError("api_keys: give api_keys or api_keys_file")
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s >= 0):
            raise ValueError(f"rate_per_s: must be >= 0 (0: no limit), got {self.rate_per_s}")
        if self.burst < 0:
            raise ValueError(f"burst: must be >= 0, got {self.burst}")
        if self.max_in_flight < 0:
            raise ValueError(f"max_in_flight: must be >= 0, got {self.max_in_flight}")


READ_ROUTES = ("open", "token")
"""`[auth] read_routes`: GET routes open to anyone, or for an admin or read token."""
QUERY_ACCESS = ("open", "key")
"""`[auth] queries`: queries open to anyone, or for a tenant's API key (or an admin token)."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Who may call which route ([auth] in tailgate.toml; gateway.auth applies it).

    Write routes (POST and DELETE /v1/servers, and any route that changes state) take an
    admin token; registration also takes the registration token (`token`). They are open
    only while neither is set, as before this section existed.
    """

    admin_tokens: tuple[str, ...] = field(default=(), repr=False)
    """Admin tokens (at most 2: the current and the next while rotating); every route takes
    one. Prefer admin_tokens_file."""
    admin_tokens_file: str | None = None
    """A file of admin tokens, one per line (# comments), re-read when it changes and on
    SIGHUP: rotate by writing old and new, moving clients over, then writing the new alone."""
    read_routes: str = "open"
    """`open`: the read-only routes (GET /v1/..., /metrics) need no credential; `token`: they
    need an admin or read token. Probes, /openapi.json and the dashboard's files stay open."""
    read_tokens: tuple[str, ...] = field(default=(), repr=False)
    """Tokens for the read-only routes alone (a scraper, a dashboard proxy); at most 2."""
    read_tokens_file: str | None = None
    """A file of read tokens, re-read as admin_tokens_file is."""
    queries: str | None = None
    """`open` or `key` (a tenant's API key or an admin token); None: `key` when a tenant
    has API keys, else `open`. A query with a key runs as the key's tenant in any case."""
    tenants: dict[str, TenantAccess] = field(default_factory=dict)
    """API keys and per-key limits by tenant (`[tenants.NAME]` at the top of the file)."""
    reload_interval_s: float = 1.0
    """How often the token and key files are checked for changes."""
    refusal_interval_s: float = 60.0
    """Refused requests are logged once per source and interval, with a count."""
    refusal_sources: int = 1024
    """Sources whose refusals are counted apart; beyond them they are counted together."""
    slowdown_after: int = 20
    """Refusals of one source within an interval before it is slowed down: its next
    failing requests get 429 with a Retry-After that doubles each time, up to slowdown_max_s
    (a right credential is always served)."""
    slowdown_max_s: float = 60.0
    """The longest Retry-After a failing source is given."""

    def __post_init__(self) -> None:
        check_tokens(self.admin_tokens, "admin_tokens", MAX_ROTATING_TOKENS)
        check_tokens(self.read_tokens, "read_tokens", MAX_ROTATING_TOKENS)
        for key in ("admin_tokens_file", "read_tokens_file"):
            if getattr(self, key) == "":
                raise ValueError(f"{key}: must be a file path")
        if self.admin_tokens and self.admin_tokens_file is not None:
            raise ValueError("admin_tokens: give admin_tokens or admin_tokens_file, not both")
        if self.read_tokens and self.read_tokens_file is not None:
            raise ValueError("read_tokens: give read_tokens or read_tokens_file, not both")
        if self.read_routes not in READ_ROUTES:
            raise ValueError(f"read_routes: must be 'open' or 'token', got {self.read_routes!r}")
        if self.queries is not None and self.queries not in QUERY_ACCESS:
            raise ValueError(f"queries: must be 'open' or 'key', got {self.queries!r}")
        for name in self.tenants:
            if not _TENANT_RE.fullmatch(name):
                raise ValueError(
                    f"tenants: a tenant name is 1..64 of A-Z a-z 0-9 . _ - starting with a "
                    f"letter or digit, got {name[:80]!r}"
                )
        if self.read_routes == "token" and not (self.has_admin or self.has_read):
            raise ValueError("read_routes: 'token' needs admin_tokens(_file) or read_tokens(_file)")
        if self.queries == "key" and not (self.has_admin or self.tenants):
            raise ValueError("queries: 'key' needs [tenants.NAME] api_keys or admin tokens")
        if not (math.isfinite(self.reload_interval_s) and self.reload_interval_s > 0):
            raise ValueError(f"reload_interval_s: must be > 0, got {self.reload_interval_s}")
        if not (math.isfinite(self.refusal_interval_s) and self.refusal_interval_s > 0):
            raise ValueError(f"refusal_interval_s: must be > 0, got {self.refusal_interval_s}")
        if not 1 <= self.refusal_sources <= 1_000_000:
            raise ValueError(f"refusal_sources: must be 1..1000000, got {self.refusal_sources}")
        if self.slowdown_after < 1:
            raise ValueError(f"slowdown_after: must be >= 1, got {self.slowdown_after}")
        if not (math.isfinite(self.slowdown_max_s) and self.slowdown_max_s >= 1):
            raise ValueError(f"slowdown_max_s: must be >= 1, got {self.slowdown_max_s}")

    @property
    def has_admin(self) -> bool:
        """Whether admin tokens are configured."""
        return bool(self.admin_tokens) or self.admin_tokens_file is not None

    @property
    def has_read(self) -> bool:
        """Whether read tokens are configured."""
        return bool(self.read_tokens) or self.read_tokens_file is not None

    @property
    def query_access(self) -> str:
        """`open` or `key`: `queries`, or its default."""
        if self.queries is not None:
            return self.queries
        return "key" if self.tenants else "open"


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
            # The agents of one Pi cluster are alike, so they share a CDF (TailGuard §III.C.2).
            cdf="cluster",
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
    prune_late: bool = False
    """Answer a query still running at its SLO at once (504) and cancel its tasks, instead
    of waiting for the grace (Swayam's request pruning, Algorithm 1 line 6)."""
    max_body_bytes: int = 1024 * 1024
    """Largest accepted request body."""
    header_timeout_s: float = 10.0
    """A request's headers must arrive within this long of its first byte (or of the
    connection opening), else the connection is closed (408 if part had come)."""
    body_timeout_s: float = 30.0
    """A request's body must arrive within this long of its headers, else 408 and the
    connection is closed."""
    keepalive_timeout_s: float = 75.0
    """An idle connection is closed after this long without a request."""
    max_connections: int = 10_000
    """HTTP connections open at most; at the limit a new one closes the longest idle, and
    16 more are kept for /healthz, /livez, /readyz and /metrics (lowered to what
    `ulimit -n` allows, with a WARNING)."""
    max_in_flight_per_client: int = 256
    """Queries one client (IPv4 address, IPv6 /64) may have unanswered; more get 429
    (0: no limit)."""
    max_frame_bytes: int = 64 * 1024 * 1024
    """Largest Thrift frame accepted from a task server; one that sends or declares more is
    disconnected (taskserver.framecheck)."""
    max_fanout: int = 10_000
    """Largest fanout a query may ask for."""
    heartbeat_s: float = 1.0
    """Heartbeat (status call) period on every server link."""
    heartbeat_timeout_s: float = 3.0
    """A server that has not answered a heartbeat for this long is marked down; also how long
    a central-queueing gateway's claim on a server lasts without renewal."""
    registration_grace_s: float = 10.0
    """For this long after the gateway starts, servers may still be registering (a restarted
    replica, a fresh `tailgate up`): a fanout above the servers registered so far is a 503
    `servers_registering` with Retry-After, not a 400; 0: always a 400."""
    retry_after_s: int = 1
    """Retry-After sent with 503 answers."""
    cdf_window: int = 4096
    """Post-queuing samples kept per CDF."""
    cdf_refresh_every: int = 256
    """New samples between rebuilds of a CDF (and of its deadlines)."""
    tail_fraction: float = 0.05
    """Fraction of samples above the peaks-over-threshold tail threshold."""
    wait_estimates: bool = False
    """Estimate every task's queue wait at dispatch (QLM §6) and export the estimate's error
    (tailgate_wait_estimate_error_seconds); the predictive admission rule does so anyway."""
    default_class: str | None = None
    """Class used when a query names neither a class nor an SLO (None: required)."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """Admission control ([admission] in tailgate.toml)."""
    autoscaling: AutoscalingConfig = field(default_factory=AutoscalingConfig)
    """Autoscaling ([autoscaling] in tailgate.toml)."""
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    """Fair share between tenants or classes ([allocation] in tailgate.toml)."""
    token: str | None = field(default=None, repr=False)
    """Registration token: POST and DELETE on /v1/servers need `Authorization: Bearer <token>`
    (or an admin token; open while neither is set). Give it as $TAILGATE_AGENT_TOKEN or in a
    token file."""
    auth: AuthConfig = field(default_factory=AuthConfig)
    """Admin and read tokens, tenants' API keys and refusal logging ([auth], [tenants.NAME])."""
    storage_url: str = "sqlite:///tailgate-gateway.db"
    """Where the history behind the dashboard is kept: any SQLAlchemy URL (a relative SQLite
    path is in the working directory; postgresql+psycopg://... for PostgreSQL); "" keeps it in
    memory only."""
    history_interval_s: float = 5.0
    """Seconds between two history samples."""
    history_retention_s: float = 6 * 3600.0
    """History older than this is deleted."""
    replica: str = ""
    """This gateway's name in a history store that several replicas share (each reads back
    only its own samples); "" uses the host name, which a StatefulSet keeps per replica."""
    tracing: TracingConfig = field(default_factory=TracingConfig)
    """OpenTelemetry spans of queries and tasks ([tracing] in tailgate.toml)."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """TLS on the HTTP API and on the links to the servers ([tls] in tailgate.toml)."""
    access_log: bool = False
    """Log one line per HTTP request (logger gateway.access): method, path, status, duration,
    bytes and the X-Request-Id; in the process's log format (--log-format)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be 0..65535, got {self.port}")
        if self.storage_url and "://" not in self.storage_url:
            raise ValueError(
                f"storage_url: expected a SQLAlchemy URL such as sqlite:///tailgate-gateway.db "
                f'or "" (in memory), got {self.storage_url!r}'
            )
        if not (math.isfinite(self.history_interval_s) and self.history_interval_s > 0):
            raise ValueError(f"history_interval_s: must be > 0, got {self.history_interval_s}")
        if not self.history_retention_s >= self.history_interval_s:
            raise ValueError(
                f"history_retention_s: must be >= history_interval_s "
                f"({self.history_interval_s}), got {self.history_retention_s}"
            )
        if self.token is not None:
            check_token(self.token)
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
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and 0 < seconds <= 3600):
                raise ValueError(f"{name}: must be seconds in (0, 3600], got {seconds}")
        if not 1 <= self.max_connections <= 1_000_000:
            raise ValueError(f"max_connections: must be 1..1000000, got {self.max_connections}")
        if not 0 <= self.max_in_flight_per_client <= 1_000_000:
            raise ValueError(
                f"max_in_flight_per_client: must be 0 (no limit)..1000000, got "
                f"{self.max_in_flight_per_client}"
            )
        if not 1024 <= self.max_frame_bytes <= 1 << 30:
            raise ValueError(f"max_frame_bytes: must be 1024..2**30, got {self.max_frame_bytes}")
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
        if not (math.isfinite(self.registration_grace_s) and self.registration_grace_s >= 0):
            raise ValueError(
                f"registration_grace_s: must be a finite number >= 0, got "
                f"{self.registration_grace_s}"
            )
        if self.cdf_window < 100:
            raise ValueError(f"cdf_window: must be >= 100, got {self.cdf_window}")
        if self.cdf_refresh_every < 1:
            raise ValueError(f"cdf_refresh_every: must be >= 1, got {self.cdf_refresh_every}")
        if not 0 < self.tail_fraction < 0.5:
            raise ValueError(f"tail_fraction: must be in (0, 0.5), got {self.tail_fraction}")
        if self.autoscaling.enabled and self.autoscaling.pool not in pnames:
            raise ValueError(f"autoscaling: no pool named {self.autoscaling.pool!r}")
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
