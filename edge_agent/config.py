"""Typed configuration of an edge agent, and its loader from CLI options and the environment.

The environment is read in ``load_agent_config`` only (``TAILGATE_AGENT_TOKEN``,
``TAILGATE_AGENT_TOKEN_FILE``), from the mapping it is given.

Errors::

    ValueError
     └── AgentConfigError   a bad option; ``option`` names it (--sample-interval-s, ...)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from edge_agent.profiles import PROFILE_NAMES
from edge_agent.readers import SIMULATED_SENSORS, check_sensor_name
from taskserver.framecheck import DEFAULT_MAX_FRAME_BYTES, check_max_frame_bytes
from taskserver.queues import QueuePolicy
from taskserver.registration import check_cluster_name, check_token
from taskserver.tls import TlsConfig, with_tls_options

__all__ = [
    "ENV_TOKEN",
    "READERS",
    "AgentConfig",
    "AgentConfigError",
    "dense_agent_configs",
    "load_agent_config",
    "option_of",
    "parse_interval",
    "parse_sensors",
]

ENV_TOKEN = "TAILGATE_AGENT_TOKEN"
ENV_TOKEN_FILE = "TAILGATE_AGENT_TOKEN_FILE"
READERS = ("simulated", "iio", "command")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class AgentConfigError(ValueError):
    """A bad option; the message starts with the option's name."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One edge agent process."""

    agent_id: str = "edge-1"
    """Unique id the gateway knows this agent by (letters, digits, _ . -)."""
    cluster: str = "local"
    """Cluster (site) label sent with the registration, e.g. wet-lab."""
    pool: str = "edge"
    """Gateway pool the agent registers into."""
    host: str = "127.0.0.1"
    """Address the Thrift listener binds to (0.0.0.0 on a Pi, with `advertise`)."""
    port: int = 9201
    """Thrift port (0 picks a free one)."""
    advertise: str | None = None
    """host:port the gateway should dial (default: host:port actually bound)."""
    gateway_url: str | None = None
    """Gateway to register with (http://gw:8080); None: serve without registering."""
    token: str | None = field(default=None, repr=False)
    """Registration token, sent as a Bearer credential (from a file or the environment)."""
    db: str | None = None
    """Store: a file path or SQLAlchemy URL; None: edge-agent-<agent_id>.db in the cwd."""
    init_store: bool = False
    """Start a new, empty store in an empty (zero-byte) store file; without it such a file is
    refused, since a truncated store would lose the agent's history without a word."""
    reader: str = "simulated"
    """Sensor reader: simulated, iio or command."""
    sensors: tuple[str, ...] = SIMULATED_SENSORS
    """Sensors the simulated reader produces."""
    iio_device: str | None = None
    """IIO device directory for the iio reader (/sys/bus/iio/devices/iio:device0)."""
    command: str | None = None
    """Command line for the command reader; it prints {sensor: number} as JSON."""
    command_timeout_s: float = 10.0
    """How long the command reader waits for its command."""
    sample_interval_s: float = 60.0
    """Seconds between two samples of the reader."""
    retention_days: float = 548.0
    """Readings older than this are pruned (548 days: 18 months)."""
    prune_interval_s: float = 3600.0
    """Seconds between two prunes."""
    policy: QueuePolicy = QueuePolicy.TF_EDFQ
    """Queue discipline of the agent's task queue: tf-edfq, t-edfq, priq or fifo."""
    slots: int = 1
    """Tasks served concurrently (a Pi serves one query at a time)."""
    seed: int = 0
    """Seed of the simulated readings and the profile's delay draws."""
    profile: str = "none"
    """Heterogeneity emulation: none, server-room, wet-lab, faculty or gta."""
    read_sample: float = 1.0
    """Share of range tasks that read the store; the rest only sleep their profile draw."""
    time_scale: float = 1.0
    """Factor on the profile's draws (a testbed run s times slower than the Pis it emulates)."""
    metrics_port: int = 0
    """HTTP port for /metrics and /healthz (0: none, and prometheus_client is not loaded)."""
    register_interval_s: float = 3.0
    """Registration period: the agent's heartbeat towards the gateway."""
    drain_timeout_s: float = 3.0
    """On SIGTERM, serve queued tasks for at most this long; the rest go back REJECTED."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """Largest Thrift frame the agent's port takes (8 MiB); a peer declaring more is
    disconnected before anything is allocated."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """TLS on the Thrift port and towards an https gateway (--tls-* options)."""

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.agent_id):
            raise ValueError(f"agent_id: must match {_ID.pattern}, got {self.agent_id!r}")
        check_cluster_name(self.cluster)  # the gateway's rule: it must accept the label
        if not self.pool:
            raise ValueError("pool: must not be empty")
        for name in ("port", "metrics_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}: must be 0..65535, got {getattr(self, name)}")
        if self.gateway_url is not None and not self.gateway_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(f"gateway_url: must be an http(s) URL, got {self.gateway_url!r}")
        if self.reader not in READERS:
            raise ValueError(f"reader: must be one of {', '.join(READERS)}, got {self.reader!r}")
        if self.reader == "iio" and not self.iio_device:
            raise ValueError("iio_device: the iio reader needs a device directory")
        if self.reader == "command" and not (self.command or "").strip():
            raise ValueError("command: the command reader needs a command line")
        bad = [s for s in self.sensors if s not in SIMULATED_SENSORS]
        if not self.sensors or bad:
            raise ValueError(
                f"sensors: must be among {', '.join(SIMULATED_SENSORS)}, got {self.sensors!r}"
            )
        for name in (
            "command_timeout_s",
            "sample_interval_s",
            "retention_days",
            "prune_interval_s",
            "register_interval_s",
        ):
            _positive(name, getattr(self, name))
        if not 0 <= self.drain_timeout_s <= 600:
            raise ValueError(f"drain_timeout_s: must be 0..600, got {self.drain_timeout_s}")
        object.__setattr__(self, "policy", QueuePolicy.parse(self.policy))
        if self.slots < 1:
            raise ValueError(f"slots: must be >= 1, got {self.slots}")
        if self.profile not in PROFILE_NAMES:
            names = ", ".join(PROFILE_NAMES)
            raise ValueError(f"profile: must be one of {names}, got {self.profile!r}")
        if not 0.0 <= self.read_sample <= 1.0:
            raise ValueError(f"read_sample: must be in [0, 1], got {self.read_sample}")
        _positive("time_scale", self.time_scale)
        check_max_frame_bytes(self.max_frame_bytes)
        if self.profile == "none" and (self.read_sample < 1.0 or self.time_scale != 1.0):
            raise ValueError(
                "profile: read_sample below 1 and time_scale need a cluster profile "
                "(server-room, wet-lab, faculty or gta) to draw service times from"
            )

    @property
    def database(self) -> str:
        """The store's path or URL, with the default filled in."""
        return self.db or f"edge-agent-{self.agent_id}.db"

    @property
    def retention_s(self) -> float:
        """The retention in seconds."""
        return self.retention_days * 86_400.0


def dense_agent_configs(config: AgentConfig, count: int, first: int = 1) -> list[AgentConfig]:
    """`count` agents from one config, to run in one process (`edge_agent.run_agents`).

    Agent i (from 0) is ``<agent_id>-<first + i>`` with its own listener (``port + i``, or
    any free port with port 0), its own metrics port when one is set and its own seed
    (``seed + i``: its own profile draws); each registers on its own, as a process of its
    own would. They share one store: the config's (``edge-agent-<agent_id>.db`` by
    default). With count 1 the config is returned unchanged.
    """
    for name, value, least in (("count", count, 1), ("first", first, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}: must be an integer >= {least}, got {value!r}")
    if count == 1:
        return [config]
    if config.advertise is not None:
        raise ValueError("count: --advertise names one address; it cannot serve several agents")
    last_port = config.port + count - 1 if config.port else 0
    last_metrics = config.metrics_port + count - 1 if config.metrics_port else 0
    if max(last_port, last_metrics) > 65535:
        raise ValueError(f"count: {count} agents from port {config.port} run past 65535")
    return [
        dataclasses.replace(
            config,
            agent_id=f"{config.agent_id}-{first + i}",
            port=config.port + i if config.port else 0,
            metrics_port=config.metrics_port + i if config.metrics_port else 0,
            seed=config.seed + i,
            db=config.database,
        )
        for i in range(count)
    ]


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: must be a finite number > 0, got {value}")


def parse_interval(text: str, option: str = "--interval") -> float:
    """'30s', '5m', '1h', '1d', '250ms' or bare seconds -> seconds; AgentConfigError if bad."""
    match = _INTERVAL.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise AgentConfigError(option, f"expected a duration like 30s, 5m or 1h, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def parse_sensors(text: str, option: str = "--sensors") -> tuple[str, ...]:
    """'temperature,humidity' -> ('temperature', 'humidity'); AgentConfigError if bad."""
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    try:
        for name in names:
            check_sensor_name(name)
    except ValueError as exc:
        raise AgentConfigError(option, str(exc)) from exc
    if not names:
        raise AgentConfigError(option, f"expected comma-separated sensor names, got {text!r}")
    return names


# Config field -> the CLI option that sets it, for messages that name what the user typed.
OPTION_OF = {
    "agent_id": "--id",
    "gateway_url": "--gateway",
    "db": "--db",
    "token": "--token-file",
}
# Config field -> the argparse dest that sets it, where they differ (`command` is taken
# by the CLI's subcommand, so the command reader's option lands in `reader_command`).
_DEST_OF = {"agent_id": "id", "gateway_url": "gateway", "command": "reader_command"}


def option_of(name: str) -> str:
    """The CLI option of a config field."""
    return OPTION_OF.get(name, "--" + name.replace("_", "-"))


def _token(args: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    path, where = args.get("token_file"), "--token-file"
    if not path:
        token = env.get(ENV_TOKEN, "").strip()
        if token:
            return _checked(token, ENV_TOKEN)
        path, where = env.get(ENV_TOKEN_FILE, "").strip(), ENV_TOKEN_FILE
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise AgentConfigError(where, f"cannot read {path}: {exc.strerror}") from exc
        if not token:
            raise AgentConfigError(where, f"{path} is empty")
        return _checked(token, where)
    return None


def _checked(token: str, where: str) -> str:
    """The token, held to the gateway's rule (a bad one would fail every registration)."""
    try:
        return check_token(token)
    except ValueError as exc:
        raise AgentConfigError(where, str(exc)) from exc


def load_agent_config(args: Mapping[str, Any], env: Mapping[str, str]) -> AgentConfig:
    """Build the config from CLI options (argparse dests, None = default) and the environment.

    The token comes from ``token_file`` if given, else from ``TAILGATE_AGENT_TOKEN``, else
    from the file named by ``TAILGATE_AGENT_TOKEN_FILE`` (as for the gateway).
    """
    values: dict[str, Any] = {}
    for f in fields(AgentConfig):
        value = args.get(_DEST_OF.get(f.name, f.name))
        if value is not None and f.name != "token":
            values[f.name] = value
    if isinstance(values.get("sensors"), str):
        values["sensors"] = parse_sensors(values["sensors"])
    values["token"] = _token(args, env)
    try:
        values["tls"] = with_tls_options(
            TlsConfig(),
            cert=args.get("tls_cert"),
            key=args.get("tls_key"),
            ca=args.get("tls_ca"),
            links=args.get("tls_links"),
            client_auth=args.get("tls_client_auth"),
        )
    except ValueError as exc:
        option, _, message = str(exc).partition(": ")
        raise AgentConfigError(option, message) from exc
    try:
        return AgentConfig(**values)
    except ValueError as exc:
        name, _, message = str(exc).partition(": ")
        raise AgentConfigError(option_of(name), message or str(exc)) from exc
