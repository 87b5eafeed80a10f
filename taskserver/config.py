"""Typed configuration of a task server (the ``[taskserver]`` table of tailgate.toml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskserver.framecheck import DEFAULT_MAX_FRAME_BYTES, check_max_frame_bytes
from taskserver.queues import QueuePolicy
from taskserver.service_time import ServiceSpec
from taskserver.tls import TlsConfig
from taskserver.tracing import TracingConfig

BUSY_PREFIX = "busy:"
"""How the error of a task refused by a busy server (`reject_when_busy`) starts: the wire
mark that lets a gateway tell it from the other REJECTED results (draining, queue full,
owned elsewhere) and send the task to another server (Swayam §4.5)."""


def _default_service() -> ServiceSpec:
    return ServiceSpec(kind="exponential", mean_ms=2.0)


@dataclass(frozen=True, slots=True)
class TaskServerConfig:
    """One task server process."""

    server_id: str = "ts-1"
    """Unique id the gateway knows this server by."""
    host: str = "127.0.0.1"
    """Address the Thrift listener binds to."""
    port: int = 9101
    """Thrift port (0 picks a free one)."""
    metrics_port: int = 0
    """HTTP port for /metrics and /healthz (0 disables it)."""
    policy: QueuePolicy = QueuePolicy.TF_EDFQ
    """Queue discipline: tf-edfq, t-edfq, priq or fifo."""
    slots: int = 1
    """Tasks served concurrently (the server's cores or GPU streams)."""
    max_queue: int = 100_000
    """Queued tasks beyond which new ones are REJECTED."""
    reject_when_busy: bool = False
    """Queue nothing: a task that arrives while every slot is busy is answered at once
    REJECTED with an error starting with BUSY_PREFIX (Swayam §4.5's RAND: a busy backend
    sends the request back, and the gateway retries another one)."""
    executor: str = "emulated"
    """Task executor; `emulated` draws service times from `service`."""
    emulation: str = "sleep"
    """How the emulated executor spends service time: sleep or spin (burn CPU)."""
    service: ServiceSpec = field(default_factory=_default_service)
    """Service-time distribution of the emulated executor."""
    seed: int | None = None
    """Seed of the emulated service-time draws (None: random)."""
    gateway_url: str | None = None
    """Gateway to register with (e.g. http://127.0.0.1:8080), or several replicas separated by
    commas; None: do not register."""
    pool: str = "default"
    """Pool this server registers into."""
    advertise: str | None = None
    """host:port the gateway should dial (default: host:port actually bound)."""
    register_interval_s: float = 5.0
    """Re-registration period; keeps the server known across gateway restarts."""
    idle_exit_s: float = 0.0
    """Retire after this long without a task (Swayam's passive scale-in); 0: never."""
    drain_timeout_s: float = 3.0
    """On SIGTERM, serve what is queued for at most this long, then send the rest back
    REJECTED; keep it above the largest class SLO plus the gateway's grace."""
    token: str | None = field(default=None, repr=False)
    """Shared registration token sent to the gateway as a Bearer credential (None: none)."""
    cluster: str | None = None
    """Cluster label sent with the registration (edge agents: the Pi cluster)."""
    task_grace_s: float = 2.0
    """A running task whose SLO budget plus this grace has passed gives its slot back (the
    task is reported FAILED); keep it above the gateway's grace, which times the query out."""
    max_task_s: float = 300.0
    """No task holds a slot longer than this, whatever budget it carries."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """Largest Thrift frame accepted (8 MiB); a peer that declares more is disconnected at
    its frame's length prefix, before anything is allocated (a logged, counted violation).
    Keep it above 1 MiB plus the largest task payload: batches are sent in ~1 MiB frames."""
    tracing: TracingConfig = field(default_factory=TracingConfig)
    """OpenTelemetry spans of traced tasks (the top-level [tracing] table of tailgate.toml)."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """TLS on the Thrift port and towards an https gateway (the top-level [tls] table)."""

    def __post_init__(self) -> None:
        if not self.server_id or not self.server_id.strip():
            raise ValueError("server_id: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be 0..65535, got {self.port}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: must be 0..65535, got {self.metrics_port}")
        object.__setattr__(self, "policy", QueuePolicy.parse(self.policy))
        if self.slots < 1:
            raise ValueError(f"slots: must be >= 1, got {self.slots}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue: must be >= 1, got {self.max_queue}")
        if self.executor != "emulated":
            raise ValueError(f"executor: must be 'emulated', got {self.executor!r}")
        if self.emulation not in ("sleep", "spin"):
            raise ValueError(f"emulation: must be 'sleep' or 'spin', got {self.emulation!r}")
        if self.idle_exit_s < 0:
            raise ValueError(f"idle_exit_s: must be >= 0, got {self.idle_exit_s}")
        if not 0 <= self.drain_timeout_s <= 600:
            raise ValueError(f"drain_timeout_s: must be 0..600, got {self.drain_timeout_s}")
        if self.register_interval_s <= 0:
            raise ValueError(f"register_interval_s: must be > 0, got {self.register_interval_s}")
        if not 0 <= self.task_grace_s <= 3600:
            raise ValueError(f"task_grace_s: must be 0..3600, got {self.task_grace_s}")
        if not 0 < self.max_task_s <= 86400:
            raise ValueError(f"max_task_s: must be in (0, 86400], got {self.max_task_s}")
        check_max_frame_bytes(self.max_frame_bytes)
