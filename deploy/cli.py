"""The ``tailgate`` command: up, gateway, taskserver, edge-agent, query, config."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import selectors
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from taskserver.extras import EXTRAS, needs
from taskserver.heap import settle_heap
from taskserver.logformat import LOG_FORMATS, configure_logging
from taskserver.queues import QueuePolicy

if TYPE_CHECKING:
    from deploy.config import TailgateConfig

# Imports of our packages sit inside the command handlers: `tailgate edge-agent` runs on a
# Raspberry Pi, and every module imported here is resident memory there.

log = logging.getLogger("tailgate")


def run_async(
    main: Coroutine[Any, Any, None],
    stop: asyncio.Event | None = None,
    *,
    select_loop: bool = False,
) -> None:
    """Run a service coroutine on uvloop when installed; SIGINT/SIGTERM stop it cleanly.

    With `stop`, the first signal sets it (the service drains and returns) and a second one
    cancels at once; without, the first signal cancels. `select_loop` runs it on asyncio's
    loop over select() instead, whose timers wake to the microsecond where epoll's and
    uvloop's round up to whole milliseconds (for emulated service times; select() takes
    descriptors below 1024 only).
    """

    async def guarded() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: signal.Signals) -> None:
            if stop is not None and not stop.is_set():
                log.info("%s: draining (send it again to cut the drain short)", sig.name)
                stop.set()
            else:
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal, sig)
        with contextlib.suppress(asyncio.CancelledError):
            await main

    if select_loop:
        with asyncio.Runner(
            loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())
        ) as runner:
            runner.run(guarded())
        return
    try:
        import uvloop
    except ImportError:
        asyncio.run(guarded())
    else:
        uvloop.run(guarded())


def _announce(line: str) -> None:
    """Print the bound address on stdout once listening (scripts and tests read it); the
    service is set up then, so its heap is settled (taskserver.heap)."""
    settle_heap()
    print(line, flush=True)


def _load(args: argparse.Namespace) -> TailgateConfig:
    from deploy.config import load_config

    return load_config(args.config)


def _load_gateway(args: argparse.Namespace) -> TailgateConfig:
    """The config of a command that runs (or prints) the gateway: its token files checked."""
    from deploy.config import check_credentials

    cfg = _load(args)
    check_credentials(cfg)
    return cfg


ENV_CLIENT_TOKEN = "TAILGATE_TOKEN"
"""The credential `tailgate query` sends when --token is not given."""


def _client_token(args: argparse.Namespace) -> str | None:
    """What `tailgate query` sends as its Bearer credential: --token, else $TAILGATE_TOKEN,
    else, when the configuration's queries need a key, its first admin token (on the
    gateway's own host), else none."""
    if args.token:
        return str(args.token).strip()
    if os.environ.get(ENV_CLIENT_TOKEN):
        return os.environ[ENV_CLIENT_TOKEN].strip()
    from gateway.config import MAX_ROTATING_TOKENS
    from gateway.guard import read_token_file

    auth = _load(args).gateway.auth
    if auth.query_access == "open":
        return None  # no credential leaves this machine that the gateway does not need
    if auth.admin_tokens:
        return auth.admin_tokens[0]
    if auth.admin_tokens_file is not None:
        try:
            return read_token_file(auth.admin_tokens_file, MAX_ROTATING_TOKENS)[0]
        except ValueError:
            return None  # not this host's file: the gateway's answer says what is missing
    return None


def _service_overrides(args: argparse.Namespace, spec: Any) -> Any:
    changes = {
        name: getattr(args, f"service_{name}")
        for name in ("kind", "mean_ms", "median_ms", "sigma", "value_ms", "path", "scale", "tail")
        if getattr(args, f"service_{name}", None) is not None
    }
    if "kind" in changes and changes["kind"] != spec.kind:
        # A new kind starts from a clean spec: the old kind's parameters do not apply.
        return type(spec)(**changes)
    return dataclasses.replace(spec, **changes) if changes else spec


def _add_service_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("emulated service time")
    g.add_argument(
        "--service-kind",
        choices=["constant", "exponential", "lognormal", "quantiles"],
        help="service-time distribution ([taskserver.service] kind, exponential)",
    )
    g.add_argument("--service-mean-ms", type=float, help="exponential: mean service time")
    g.add_argument("--service-median-ms", type=float, help="lognormal: median service time")
    g.add_argument("--service-sigma", type=float, help="lognormal: sigma of the log")
    g.add_argument("--service-value-ms", type=float, help="constant: the service time")
    g.add_argument("--service-path", help="quantile file (one value in ms per line)")
    g.add_argument("--service-scale", type=float, help="time scale factor")
    g.add_argument(
        "--service-tail",
        choices=["paper", "fitted"],
        help="quantile file: exponential tail beyond the last quantile, mean last/2 (paper, "
        "the default) or fitted to the top 1%% (fitted)",
    )
    g.add_argument(
        "--emulation",
        choices=["sleep", "spin"],
        help="how a service time is spent: sleep (default) or spin on the CPU",
    )
    g.add_argument("--seed", type=int, help="seed of the service-time draws")


def _add_tls_args(p: argparse.ArgumentParser, *, server: bool = True) -> None:
    """--tls-* options: this process's certificate and the cluster's CA ([tls] of the config,
    file by file); for a server, TLS on its Thrift port and what it asks of the gateway."""
    g = p.add_argument_group("TLS (README: TLS)")
    g.add_argument("--tls-cert", metavar="FILE", help="this process's certificate (PEM)")
    g.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    g.add_argument(
        "--tls-ca", metavar="FILE", help="the CA that peers' certificates must come from (PEM)"
    )
    if not server:
        return
    g.add_argument(
        "--tls-links",
        action="store_true",
        default=None,
        help="serve the Thrift port with TLS (the gateway's [tls] links = true)",
    )
    g.add_argument(
        "--tls-client-auth",
        choices=["none", "optional", "required"],
        help="required: refuse a gateway without a certificate from --tls-ca (mutual TLS)",
    )


def _tls_options(args: argparse.Namespace, tls: Any) -> Any:
    """[tls] with the --tls-* options on top; ValueError naming the option."""
    from taskserver.tls import with_tls_options

    return with_tls_options(
        tls,
        cert=args.tls_cert,
        key=args.tls_key,
        ca=args.tls_ca,
        links=getattr(args, "tls_links", None),
        client_auth=getattr(args, "tls_client_auth", None),
    )


def _exit_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphaned servers)."""
    import ctypes
    import os

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return  # not Linux/glibc: best effort only
    parent = os.getppid()
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def cmd_taskserver(args: argparse.Namespace) -> int:
    """Run one task server."""
    from taskserver.config import TaskServerConfig
    from taskserver.server import dense_configs, serve, serve_many
    from taskserver.service_time import make_distribution

    if not args.pipeline:
        stray = _pipeline_only_options(args)
        if stray:
            print(
                f"tailgate taskserver: {', '.join(stray)} only apply with --pipeline",
                file=sys.stderr,
            )
            return 2
    cfg = _load(args).taskserver
    changes: dict[str, Any] = {}
    for name, attr in (
        ("server_id", "id"),
        ("host", "host"),
        ("port", "port"),
        ("metrics_port", "metrics_port"),
        ("policy", "policy"),
        ("slots", "slots"),
        ("gateway_url", "gateway"),
        ("pool", "pool"),
        ("advertise", "advertise"),
        ("emulation", "emulation"),
        ("seed", "seed"),
        ("idle_exit_s", "idle_exit_s"),
        ("drain_timeout_s", "drain_timeout_s"),
        ("reject_when_busy", "reject_when_busy"),
    ):
        value = getattr(args, attr, None)
        if value is not None:
            changes[name] = value
    try:
        changes["service"] = _service_overrides(args, cfg.service)
        changes["tls"] = _tls_options(args, cfg.tls)
        cfg = dataclasses.replace(cfg, **changes)
        make_distribution(cfg.service)
    except (ValueError, OSError) as exc:
        print(f"tailgate taskserver: {exc}", file=sys.stderr)
        return 2
    executor = None
    if args.pipeline:
        problem = needs("tailgate taskserver --pipeline", "onnxruntime")
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
        try:
            executor = _pipeline_executor(args)
        except (ValueError, OSError, ImportError) as exc:
            print(f"tailgate taskserver: {exc}", file=sys.stderr)
            return 2
        if args.slots is None and cfg.slots == TaskServerConfig().slots:
            # A pipeline batches across tasks: it needs many tasks in flight at once. Slots
            # from --slots or [taskserver] win (a configured value equal to the default
            # cannot be told apart from none).
            cfg = dataclasses.replace(cfg, slots=PIPELINE_SLOTS)
    try:
        configs = dense_configs(cfg, args.count)
    except ValueError as exc:
        print(f"tailgate taskserver: --{exc}", file=sys.stderr)
        return 2
    if len(configs) > 1 and executor is not None:
        print("tailgate taskserver: --count runs emulated servers; not with --pipeline",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.exit_with_parent:
        _exit_with_parent()
    stop = asyncio.Event()
    try:
        if len(configs) > 1:
            # Dense emulated servers sleep their service times: on a select() loop those
            # sleeps are exact (see taskserver.executors), up to DENSE_SELECT_MAX servers.
            dense = serve_many(configs, ready=_announce, stop=stop)
            run_async(dense, stop, select_loop=len(configs) <= DENSE_SELECT_MAX)
        else:
            run_async(serve(cfg, ready=_announce, executor=executor, stop=stop), stop)
    except OSError as exc:  # a port taken or not bindable: one line, as for the edge agent
        print(f"tailgate taskserver: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    """`tailgate live run|maxload`: loadtests.live; `tailgate live pool`: loadtests.swayam_live."""
    if args.rest[:1] == ["pool"]:
        from loadtests.swayam_live import main as pool_main

        return pool_main(args.rest[1:])
    from loadtests.live import main as live_main

    return live_main(args.rest)


UP_EDGE_AGENTS = 4
"""Edge agents `tailgate up` starts by default (one per cluster) when pool 'edge' exists."""


def _check_pipeline(spec: str) -> None:
    """Fail before anything starts: a spec that does not load (onnxruntime is checked first)."""
    from onnx_models.pipeline_config import pipeline_config

    pipeline_config(spec)


def _gateway_extras(command: str, gw: Any, autoscale: bool = False) -> str | None:
    """The line naming the extra the gateway's configuration needs and lacks, if any: the
    database driver of its storage URL, kubernetes for the Kubernetes actuator."""
    if (gw.autoscaling.enabled or autoscale) and gw.autoscaling.actuator == "kubernetes":
        problem = needs(f"{command} (actuator kubernetes)", "kubernetes")
        if problem is not None:
            return problem
    return _storage_driver_problem(command, gw.storage_url)


def _storage_driver_problem(command: str, url: str) -> str | None:
    """One line when the storage URL's database driver does not import, else None."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url or "sqlite://")
        driver = parsed.get_driver_name()
    except (ArgumentError, ValueError):
        return None  # not a URL SQLAlchemy reads: the history store reports it by name
    if driver in EXTRAS:
        return needs(f"{command} (storage {parsed.drivername})", driver)
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as exc:
        hint = "for PostgreSQL use postgresql+psycopg:// and pip install -e '.[postgres]'"
        extra = f"; {hint}" if parsed.get_backend_name() == "postgresql" else ""
        return f"{command}: storage {parsed.drivername} needs its driver {driver} ({exc}){extra}"
    return None


def up_edge_agents(given: int | None, cfg: Any) -> int:
    """The edge agents `up` starts: as given, else UP_EDGE_AGENTS if the config has pool edge."""
    if given is not None:
        return given
    return UP_EDGE_AGENTS if cfg.gateway.pool_named("edge") is not None else 0


DENSE_SELECT_MAX = 200
"""Most servers of one `--count` process on a select() loop. select() takes descriptors
below 1024 only; a server holds about two (its listener and the gateway's link: 55 for a
process of 25 in a live replay). Above it, the process runs on uvloop and the emulated
sleeps poll their last millisecond instead."""

PIPELINE_SLOTS = 256
"""Default slots of a pipeline task server (well above the largest batch size)."""


def _pipeline_only_options(args: argparse.Namespace) -> list[str]:
    """The pipeline options given other than at their defaults (they need --pipeline)."""
    defaults = (
        ("--profile", "profile", None),
        ("--dropper", "dropper", "pard"),
        ("--providers", "providers", "auto"),
        ("--modules", "modules", None),
        ("--peer", "peer", None),
        ("--workers", "workers", "1"),
        ("--max-workers", "max_workers", None),
        ("--cold-start-s", "cold_start_s", None),
        ("--worker-mode", "worker_mode", "auto"),
    )
    return [flag for flag, attr, default in defaults if getattr(args, attr) != default]


def _pipeline_executor(args: argparse.Namespace) -> Any:
    from onnx_models.pipeline_config import pipeline_config
    from taskserver.pipeline import PipelineExecutor

    local = tuple(m.strip() for m in (args.modules or "").split(",") if m.strip())
    peers: dict[str, str] = {}
    for item in args.peer or ():
        module_id, sep, address = item.partition("=")
        if not sep or not module_id.strip() or not address.strip():
            raise ValueError(f"--peer: need MODULE=HOST:PORT, got {item!r}")
        peers[module_id.strip()] = address.strip()
    config = pipeline_config(
        args.pipeline,
        profile=args.profile,
        dropper=args.dropper,
        providers=args.providers,
        local=local,
        peers=peers,
        workers=_pipeline_workers(args),
    )
    config = dataclasses.replace(config, worker_mode=args.worker_mode)
    return PipelineExecutor(config)


def _pipeline_workers(args: argparse.Namespace) -> Any:
    """--workers N (fixed) or auto, with --max-workers and --cold-start-s (auto only)."""
    from taskserver.pard import ScalingConfig
    from taskserver.pipeline.sessions import usable_cpus

    text = str(args.workers).strip().lower()
    if text != "auto":
        if args.max_workers is not None or args.cold_start_s is not None:
            raise ValueError("--max-workers and --cold-start-s only apply with --workers auto")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--workers: need an int >= 1 or auto, got {args.workers!r}")
        return int(text)
    total = usable_cpus() if args.max_workers is None else args.max_workers
    try:
        return ScalingConfig(
            max_workers=total,
            total_workers=total,
            cold_start_s=2.0 if args.cold_start_s is None else args.cold_start_s,
        )
    except ValueError as exc:
        raise ValueError(f"--workers auto: {exc}") from exc


def cmd_edge_agent_run(args: argparse.Namespace) -> int:
    """Run one edge agent, or --count of them in this process (imports stay here: the
    agent's path must stay Pi-light)."""
    import os

    from edge_agent.config import (
        AgentConfigError,
        dense_agent_configs,
        load_agent_config,
        option_of,
    )

    try:
        cfg = load_agent_config(vars(args), os.environ)
    except AgentConfigError as exc:
        print(f"tailgate edge-agent run: {exc}", file=sys.stderr)
        return 2
    if args.first is not None and args.count == 1:
        print("tailgate edge-agent run: --first: only applies with --count > 1", file=sys.stderr)
        return 2
    if "://" in cfg.database:  # a URL, not a file: its driver may be an extra (postgres)
        problem = _storage_driver_problem("tailgate edge-agent run", cfg.database)
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
    try:
        configs = dense_agent_configs(cfg, args.count, 1 if args.first is None else args.first)
    except ValueError as exc:
        name, _, message = str(exc).partition(": ")
        print(f"tailgate edge-agent run: {option_of(name)}: {message}", file=sys.stderr)
        return 2
    from edge_agent.agent import run_agent, run_agents, tune_malloc
    from edge_agent.store import StoreError

    if args.exit_with_parent:
        _exit_with_parent()
    tune_malloc()  # before any thread starts: a Pi has little memory to lose to fragmentation
    stop = asyncio.Event()
    try:
        if len(configs) > 1:
            # Their sensing work is mostly a sleep of the profile's draw: on a select() loop
            # those sleeps are exact to the microsecond, as for dense task servers.
            dense = run_agents(configs, ready=_announce, stop=stop)
            run_async(dense, stop, select_loop=len(configs) <= DENSE_SELECT_MAX)
        else:
            run_async(run_agent(cfg, ready=_announce, stop=stop), stop)
    except (StoreError, OSError) as exc:
        print(f"tailgate edge-agent run: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_edge_agent_seed(args: argparse.Namespace) -> int:
    """Backfill an agent's store with simulated readings; print rows and rows/s."""
    from edge_agent.backfill import seed_store
    from edge_agent.config import AgentConfigError, option_of, parse_interval, parse_sensors
    from edge_agent.store import StoreError

    if "://" in args.db:  # a URL, not a file: its driver may be an extra (postgres)
        problem = _storage_driver_problem("tailgate edge-agent seed", args.db)
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
    try:
        interval_s = parse_interval(args.interval)
        if interval_s < 1 or interval_s != int(interval_s):
            raise AgentConfigError(
                "--interval", f"must be a whole number of seconds >= 1s, got {args.interval!r}"
            )
        sensors = parse_sensors(args.sensors)
        result = seed_store(
            args.db,
            months=args.months,
            interval_s=int(interval_s),
            seed=args.seed,
            sensors=sensors,
            init=args.init_store,
        )
    except AgentConfigError as exc:
        print(f"tailgate edge-agent seed: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"tailgate edge-agent seed: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        name, _, message = str(exc).partition(": ")
        print(f"tailgate edge-agent seed: {option_of(name)}: {message}", file=sys.stderr)
        return 2
    print(
        f"seeded {result.rows} rows ({', '.join(sensors)} every {result.interval_s} s, "
        f"{(result.end_s - result.start_s) / 86400:.0f} days) into {args.db} "
        f"in {result.seconds:.2f} s: {result.rows_per_s:,.0f} rows/s",
        flush=True,
    )
    return 0


def cmd_edge_agent_salvage(args: argparse.Namespace) -> int:
    """Copy the readable readings of a damaged store into a new one; print what it did."""
    from edge_agent.salvage import salvage_store
    from edge_agent.store import StoreError

    try:
        result = salvage_store(args.source, args.db, init=args.init_store)
    except StoreError as exc:
        print(f"tailgate edge-agent salvage: {exc}", file=sys.stderr)
        return 1
    skipped = ", ".join(f"{name} {lo}..{hi}" for name, lo, hi in result.skipped[:10])
    more = f" (+{len(result.skipped) - 10} more)" if len(result.skipped) > 10 else ""
    print(
        f"salvaged {result.readings} readings of {', '.join(result.sensors) or 'no sensor'} "
        f"from {args.source} into {args.db}; "
        f"{len(result.skipped)} unreadable stretches skipped{': ' if skipped else ''}"
        f"{skipped}{more}",
        flush=True,
    )
    return 0


def _add_edge_agent_parser(sub: Any) -> None:
    """`tailgate edge-agent run|seed`; values are checked by edge_agent.config (exit 2)."""
    p = sub.add_parser("edge-agent", help="a Raspberry-Pi sensing agent: run, seed, salvage")
    edge = p.add_subparsers(dest="edge_command", required=True)
    r = edge.add_parser("run", help="serve sensing tasks from the local sensor store")
    r.add_argument("--id", required=True, help="agent id the gateway knows it by")
    r.add_argument(
        "--count",
        type=int,
        default=1,
        help="emulated agents in this process, ID-FIRST..ID-(FIRST+COUNT-1), each with its "
        "own port, queue, slots, seed and registration, on one shared store (default 1)",
    )
    r.add_argument("--first", type=int, help="with --count: number of the first agent (1)")
    r.add_argument("--cluster", required=True, help="cluster (site) label, e.g. wet-lab")
    r.add_argument("--gateway", help="gateway URL to register with (default: do not register)")
    r.add_argument("--host", help="Thrift bind address (127.0.0.1)")
    r.add_argument("--port", type=int, help="Thrift port (9201; 0: any free port)")
    r.add_argument("--advertise", help="host:port the gateway should dial (default: bound)")
    r.add_argument("--pool", help="gateway pool (edge)")
    r.add_argument("--db", help="store file or SQLAlchemy URL (edge-agent-ID.db)")
    r.add_argument(
        "--init-store",
        action="store_true",
        default=None,
        help="start a new, empty store in an empty (0-byte) store file; without it such a "
        "file is refused, as a truncated store would lose the agent's history silently",
    )
    r.add_argument("--reader", help="simulated (default), iio or command")
    r.add_argument("--sensors", help="simulated reader: sensors (temperature,humidity)")
    r.add_argument("--iio-device", help="iio reader: device dir (/sys/bus/iio/devices/...)")
    r.add_argument("--command", dest="reader_command", help="command reader: command line")
    r.add_argument("--command-timeout-s", type=float, help="command reader: timeout (10)")
    r.add_argument("--sample-interval-s", type=float, help="seconds between samples (60)")
    r.add_argument("--retention-days", type=float, help="keep readings this long (548)")
    r.add_argument("--prune-interval-s", type=float, help="seconds between prunes (3600)")
    r.add_argument("--policy", help="task queue policy: tf-edfq (default), t-edfq, priq, fifo")
    r.add_argument("--slots", type=int, help="tasks served at once (1)")
    r.add_argument("--profile", help="emulated cluster: none, server-room, wet-lab, faculty, gta")
    r.add_argument("--seed", type=int, help="seed of simulated readings and profile draws (0)")
    r.add_argument(
        "--read-sample",
        type=float,
        help="share of range tasks that read the store; the rest sleep their profile draw "
        "alone and answer without readings (1: every task reads; below 1 needs --profile)",
    )
    r.add_argument(
        "--time-scale", type=float, help="factor on the profile's draws (1; needs --profile)"
    )
    r.add_argument("--token-file", help="registration token file (else $TAILGATE_AGENT_TOKEN)")
    r.add_argument("--metrics-port", type=int, help="/metrics and /healthz port (0: none)")
    r.add_argument("--register-interval-s", type=float, help="heartbeat period (3)")
    r.add_argument(
        "--drain-timeout-s", type=float, help="on SIGTERM, finish queued tasks this long (3)"
    )
    r.add_argument(
        "--max-frame-bytes",
        type=int,
        help="largest Thrift frame taken; a peer declaring more is disconnected (8388608)",
    )
    r.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one dies (Linux)",
    )
    _add_tls_args(r)
    r.set_defaults(func=cmd_edge_agent_run)
    s = edge.add_parser("seed", help="backfill a store with simulated readings")
    s.add_argument("--db", required=True, help="store file or SQLAlchemy URL")
    s.add_argument(
        "--init-store",
        action="store_true",
        help="seed an empty (0-byte) store file as a new store (refused without it)",
    )
    s.add_argument("--months", type=float, default=18.0, help="months back from now (18)")
    s.add_argument("--interval", default="5m", help="reading interval: 30s, 5m, 1h (5m)")
    s.add_argument("--seed", type=int, default=0, help="seed of the simulated readings (0)")
    s.add_argument("--sensors", default="temperature,humidity", help="comma-separated sensors")
    s.set_defaults(func=cmd_edge_agent_seed)
    v = edge.add_parser(
        "salvage", help="copy the readable readings of a damaged store into a new one"
    )
    v.add_argument(
        "--from",
        dest="source",
        required=True,
        help="the damaged store, moved aside (with its -wal file renamed alike); only read",
    )
    v.add_argument("--db", required=True, help="the new store (created; existing rows win)")
    v.add_argument("--init-store", action="store_true", help="allow an empty (0-byte) file as --db")
    v.set_defaults(func=cmd_edge_agent_salvage)


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the gateway."""
    from prometheus_client import CollectorRegistry

    from gateway.app import serve
    from gateway.service import GatewayService

    gw = _load_gateway(args).gateway
    given = (("host", args.host), ("port", args.port), ("storage_url", args.storage_url))
    changes = {k: v for k, v in (*given, ("access_log", args.access_log)) if v is not None}
    try:
        gw = dataclasses.replace(gw, **changes)
    except ValueError as exc:
        print(f"tailgate gateway: {exc}", file=sys.stderr)
        return 2
    problem = _gateway_extras("tailgate gateway", gw)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    stop = asyncio.Event()
    service = GatewayService(gw, registry=CollectorRegistry())
    run_async(serve(service, ready=_announce, stop=stop), stop)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Gateway plus local task servers (and emulated edge agents) on this machine."""
    from deploy.launcher import UpOptions, up

    cfg = _load_gateway(args)
    if args.storage_url is not None:
        try:
            gw = dataclasses.replace(cfg.gateway, storage_url=args.storage_url)
        except ValueError as exc:
            print(f"tailgate up: {exc}", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, gateway=gw)
    if args.access_log:
        cfg = dataclasses.replace(cfg, gateway=dataclasses.replace(cfg.gateway, access_log=True))
    opts = UpOptions(
        servers=args.servers,
        edge_agents=up_edge_agents(args.edge_agents, cfg),
        pipeline_servers=args.pipeline_servers,
        pipeline=args.pipeline,
        port=args.port,
        host=args.host,
        policy=args.policy,
        slots=args.slots,
        metrics=args.metrics_ports,
        autoscale=args.autoscale,
        max_servers=args.max_servers,
        edge_data=args.edge_data,
        edge_months=args.edge_months,
        edge_profiles=args.edge_profiles,
        agents_per_process=args.agents_per_process,
        edge_read_sample=args.edge_read_sample,
        edge_time_scale=args.edge_time_scale,
        edge_seed=args.edge_seed,
    )
    problem = _gateway_extras("tailgate up", cfg.gateway, args.autoscale)
    if problem is None and opts.pipeline_servers:
        problem = needs("tailgate up --pipeline-servers", "onnxruntime")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        opts.validate()
        if opts.pipeline_servers:
            _check_pipeline(opts.pipeline)
    except (ValueError, OSError, ImportError) as exc:
        print(f"tailgate up: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    run_async(up(cfg, opts, stop), stop)
    return 0


def _targets(args: argparse.Namespace) -> dict[str, Any]:
    if args.servers:
        return {"servers": [s for s in args.servers.split(",") if s]}
    if args.all:
        return {"pool": args.pool, "all": True}
    return {"pool": args.pool, "fanout": args.fanout}


def cmd_query(args: argparse.Namespace) -> int:
    """Submit one query and print the answer."""
    import urllib.error
    import urllib.request

    body: dict[str, Any] = {"targets": _targets(args)}
    if args.slo_ms is not None:
        body["slo"] = {"percentile": args.percentile, "latency_ms": args.slo_ms}
    else:
        body["class"] = args.class_name
    if args.task:
        try:
            body["task"] = json.loads(args.task)
        except ValueError as exc:
            print(f"tailgate query: --task is not valid JSON: {exc}", file=sys.stderr)
            return 2
    context = None
    if args.url.lower().startswith("https:"):
        from deploy.config import ConfigError
        from taskserver.tls import TlsConfig, client_context

        try:
            context = client_context(_tls_options(args, TlsConfig()))
        except ValueError as exc:
            print(f"tailgate query: {exc}", file=sys.stderr)
            return 2
        except ConfigError as exc:  # a file that cannot be loaded
            print(f"tailgate query: {exc.message}", file=sys.stderr)
            return 2
    headers = {"Content-Type": "application/json"}
    token = _client_token(args)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        args.url.rstrip("/") + "/v1/queries",
        data=json.dumps(body).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:
            answer, status = json.loads(resp.read()), resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"error": {"message": raw.decode("utf-8", "replace")}}
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        print(f"tailgate query: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    if status >= 400:
        err = answer.get("error", {})
        field = f" (field {err['field']})" if err.get("field") else ""
        print(f"tailgate query: HTTP {status}: {err.get('message')}{field}", file=sys.stderr)
        return 1
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Validate a config file and print the effective configuration as tailgate.toml text."""
    from deploy.config_toml import dump_config

    cfg = _load_gateway(args)
    # Redacted: tokens are left out and a storage password shows as ***.
    print(dump_config(cfg.redacted()), end="")
    return 0


def _add_access_log(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--access-log",
        action="store_true",
        default=None,
        help="log one line per HTTP request (method, path, status, duration, bytes, request "
        "id) in the --log-format; default: [gateway] access_log, off",
    )


def build_parser(*, light: bool = False) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (light: leave out `sim`, for the edge agent)."""
    parser = argparse.ArgumentParser(prog="tailgate", description=DESCRIPTION)
    parser.add_argument(
        "--config", help="tailgate.toml (default: $TAILGATE_CONFIG, else built-in defaults)"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="DEBUG, INFO (default), WARNING or ERROR, in any case",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text (default) or json: one JSON object per line, for a log collector; "
        "tailgate up starts its children with the same format",
    )
    parser.add_argument("--version", action="version", version=f"tailgate {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="gateway + local task servers + emulated edge agents")
    p.add_argument(
        "--storage-url",
        help="the gateway's history store (SQLAlchemy URL; '' in memory); "
        "default: tailgate-gateway.db in this folder",
    )
    p.add_argument("--servers", type=int, default=8, help="task servers in pool 'default' (8)")
    p.add_argument(
        "--edge-agents",
        type=int,
        default=None,
        help=f"edge agents in pool 'edge' (central queueing), four clusters "
        f"({UP_EDGE_AGENTS} when the config has a pool 'edge', else 0)",
    )
    p.add_argument(
        "--pipeline-servers",
        type=int,
        default=0,
        help="task servers running an ONNX pipeline, in pool 'pipeline' (0; needs onnxruntime)",
    )
    p.add_argument(
        "--pipeline",
        default="traffic",
        help="their pipeline: traffic, live, ga, dag or a spec file (traffic)",
    )
    p.add_argument("--port", type=int, default=8080, help="gateway HTTP port (8080)")
    p.add_argument("--host", default="127.0.0.1", help="gateway bind address (127.0.0.1)")
    p.add_argument("--policy", default=None, help="task-server queue policy (tf-edfq)")
    p.add_argument("--slots", type=int, default=None, help="slots per task server")
    p.add_argument(
        "--metrics-ports",
        action="store_true",
        help="give each task server a /metrics port (gateway port + 100 + i)",
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="scale pool 'default' on the task deadline-miss ratio ([autoscaling] in the config)",
    )
    p.add_argument("--max-servers", type=int, help="autoscaling: most task servers")
    p.add_argument(
        "--edge-data",
        default="tailgate-edge-data",
        help="folder of the edge agents' sensor stores, kept between runs (tailgate-edge-data)",
    )
    p.add_argument(
        "--edge-months", type=int, default=18, help="months of readings seeded into new stores"
    )
    p.add_argument(
        "--no-edge-profiles",
        dest="edge_profiles",
        action="store_false",
        help="do not emulate the four clusters' latency profiles",
    )
    p.add_argument(
        "--agents-per-process",
        type=int,
        default=1,
        help="dense edge agents: up to this many agents of one cluster per process, "
        "each with its own id, port, queue and registration, on one shared store (1)",
    )
    p.add_argument(
        "--edge-read-sample",
        type=float,
        default=1.0,
        help="share of the agents' range tasks that read the store; the rest sleep their "
        "cluster profile's draw and answer without readings (1)",
    )
    p.add_argument(
        "--edge-time-scale",
        type=float,
        default=1.0,
        help="run the edge testbed this many times slower: agents' draws, class SLOs, grace "
        "and the edge pool's prior are all multiplied by it (1)",
    )
    p.add_argument(
        "--edge-seed",
        type=int,
        default=1,
        help="seed of the agents' profile draws (1: agent i draws with seed i)",
    )
    _add_access_log(p)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("gateway", help="run the gateway")
    p.add_argument("--host", help="HTTP bind address (default: [gateway] host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default: [gateway] port, 8080)")
    p.add_argument(
        "--storage-url",
        help="history store: an SQLAlchemy URL (sqlite:///FILE, postgresql+psycopg://...), "
        "'' to keep it in memory (default: [gateway] storage_url)",
    )
    _add_access_log(p)
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("taskserver", help="run one task server (or --count emulated ones)")
    p.add_argument("--id", help="server id the gateway knows it by ([taskserver] server_id)")
    p.add_argument(
        "--count",
        type=int,
        default=1,
        help="emulated servers in this process, ID-1..ID-N, each with its own port, queue, "
        "slots, seed and registration (default 1)",
    )
    p.add_argument("--host", help="Thrift bind address ([taskserver] host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="Thrift port (0: any free port)")
    p.add_argument("--metrics-port", type=int, help="/metrics and /healthz port (0: none)")
    p.add_argument(
        "--policy",
        choices=[p.value for p in QueuePolicy],
        help="task queue policy ([taskserver] policy, tf-edfq)",
    )
    p.add_argument("--slots", type=int, help="tasks served at once ([taskserver] slots, 1)")
    p.add_argument("--gateway", help="gateway URL to register with")
    p.add_argument("--pool", help="gateway pool it registers in ([taskserver] pool, default)")
    p.add_argument("--advertise", help="host:port the gateway should dial")
    p.add_argument(
        "--idle-exit-s", type=float, help="retire after this long without a task (0: never)"
    )
    p.add_argument(
        "--drain-timeout-s", type=float, help="on SIGTERM, finish queued tasks this long (3)"
    )
    p.add_argument(
        "--reject-when-busy",
        action="store_true",
        default=None,
        help="queue nothing: a task that finds every slot busy goes back REJECTED with an "
        "error starting 'busy:', for a gateway pool with dispatch = \"retry\" (Swayam §4.5)",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one dies (Linux)",
    )
    _add_service_args(p)
    _add_tls_args(p)
    g = p.add_argument_group("inference pipeline (instead of the emulated executor)")
    g.add_argument(
        "--pipeline", help="pipeline spec: a shipped name (traffic, live, ga, dag) or a file"
    )
    g.add_argument("--profile", help="its profile file (default: beside the spec)")
    g.add_argument(
        "--dropper",
        default="pard",
        help="dropping policy: pard (default), none, nexus, clipper++, or an ablation",
    )
    g.add_argument(
        "--providers", default="auto", choices=["auto", "cpu", "cuda"], help="onnxruntime"
    )
    g.add_argument(
        "--modules",
        metavar="IDS",
        help="run only these modules of the pipeline (comma-separated ids): one stage of a "
        "pipeline split across task servers (default: all)",
    )
    g.add_argument(
        "--peer",
        action="append",
        metavar="MODULE=HOST:PORT",
        help="the task server that runs a later stage, entered at MODULE (repeat per module)",
    )
    g.add_argument(
        "--workers",
        default="1",
        metavar="N|auto",
        help="workers (model sessions, each with its own thread) per module: N, or auto to "
        "follow each module's request rate at run time (PARD §5.1) (1)",
    )
    g.add_argument(
        "--worker-mode",
        default="auto",
        choices=["auto", "process", "thread"],
        help="where each worker's model runs: its own process, or a thread of this one; auto: "
        "process on the CPU with 4 or more cores, thread on CUDA and smaller hosts (auto)",
    )
    g.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="with --workers auto: most workers over all modules (default: usable CPU cores)",
    )
    g.add_argument(
        "--cold-start-s",
        type=float,
        metavar="S",
        help="with --workers auto: a new worker serves this long after it is started, at "
        "the earliest (2.0)",
    )
    p.set_defaults(func=cmd_taskserver)

    _add_edge_agent_parser(sub)

    p = sub.add_parser("query", help="submit one query and print the answer")
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8080",
        help="the gateway (http://127.0.0.1:8080; match the port of tailgate up --port)",
    )
    p.add_argument("--class", dest="class_name", default="A", help="query class (A)")
    p.add_argument("--slo-ms", type=float, help="explicit SLO latency instead of a class")
    p.add_argument(
        "--percentile", type=float, default=99.0, help="with --slo-ms: its percentile (99)"
    )
    p.add_argument("--pool", default="default", help="target pool (default)")
    p.add_argument("--fanout", type=int, default=1, help="random servers of the pool (1)")
    p.add_argument("--all", action="store_true", help="every server of the pool")
    p.add_argument("--servers", help="comma-separated server ids")
    p.add_argument("--task", help="task payload as JSON")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (60)")
    p.add_argument(
        "--token",
        help=f"Bearer credential: a tenant's API key or an admin token (default: "
        f"${ENV_CLIENT_TOKEN}, else the config's first admin token; prefer the variable: "
        f"arguments show in ps)",
    )
    _add_tls_args(p, server=False)
    p.set_defaults(func=cmd_query)

    if not light:
        from loadtests.sim.cli import add_parser as add_sim_parser
        from onnx_models.cli import add_parser as add_profile_parser

        add_sim_parser(sub)
        add_profile_parser(sub)
        p = sub.add_parser(
            "live",
            help="replay a simulator scenario on real processes (live run | maxload | pool)",
            add_help=False,
        )
        p.add_argument("rest", nargs=argparse.REMAINDER, help="see tailgate live run --help")
        p.set_defaults(func=cmd_live)

    p = sub.add_parser(
        "config",
        help="validate the config and print the effective values as TOML (a tailgate.toml)",
    )
    p.set_defaults(func=cmd_config)
    return parser


DESCRIPTION = (
    "Tailgate: a fanout gateway that keeps per-class tail-latency SLOs. Commands: up, "
    "gateway, taskserver, edge-agent, query, sim, profile, live, config."
)
"""The top-level help's description (plain text: argparse prints it as is)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""--log-level values (any case)."""


def _version() -> str:
    try:
        return importlib.metadata.version("tailgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tailgate`` console script.

    The global options (--config, --log-level, --log-format) may come before or after the
    subcommand: `tailgate up --config x.toml` is `tailgate --config x.toml up`.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    pre.add_argument("--log-level")
    pre.add_argument("--log-format")
    given, rest = pre.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    head = [
        *(["--config", given.config] if given.config is not None else []),
        *(["--log-level", given.log_level] if given.log_level is not None else []),
        *(["--log-format", given.log_format] if given.log_format is not None else []),
    ]
    parser = build_parser(light=bool(rest) and rest[0] == "edge-agent")
    args = parser.parse_args([*head, *rest])
    configure_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`tailgate config | head`): stop quietly, as a process
        # killed by SIGPIPE does, and keep the interpreter from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        from deploy.config import ConfigError

        if not isinstance(exc, ConfigError):
            raise
        print(f"tailgate: invalid configuration: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
