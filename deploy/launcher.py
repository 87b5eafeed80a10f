"""``tailgate up``: the gateway in this process, task servers as child processes.

Every child is described by a ``ChildSpec`` built in one function per kind:
``taskserver_spec`` for pool "default" and ``edge_agent_spec`` for pool "edge".
The children register themselves with the gateway, sending the registration
token ``up`` passes them in their environment.

Edge agents are real ``tailgate edge-agent run`` processes, each on its own sensor
store in ``--edge-data`` (seeded with ``--edge-months`` of simulated readings the
first time, reused afterwards), in four clusters of the Sensing-as-a-Service
testbed whose latency profiles emulate the paper's heterogeneous Pis on loopback.
With ``--agents-per-process N`` they are dense: one ``edge-agent run --count N``
process hosts up to N agents of one cluster (each with its own id, listener, queue and
registration), all on the store of its first agent, and with ``--edge-read-sample``
below 1 only that share of their range tasks reads it (the rest sleep their profile
draw). ``--edge-time-scale s`` runs the whole testbed s times slower: the agents' draws,
the classes' SLOs, the grace and the edge pool's prior are all multiplied by s.

``ChildSupervisor`` watches every child and applies ``deploy.supervisor``'s restart policy:
during start-up a child that exits is fatal (``up`` exits 1 naming it: a child that cannot
start at all must not restart forever); once everything came up, a child that fails (killed
by a signal such as SIGKILL, or a non-zero exit code) is logged once and started again with
the same argv and environment after a jittered exponential backoff (0.5 s doubling to 30 s),
and the rest keep serving; a clean exit (code 0: a retired idle server, or one stopped on
purpose with SIGTERM) stays down. The restarted child binds a new port and registers again,
and the gateway replaces the dead server's link. Only Ctrl-C or SIGTERM of ``up`` stops
everything: the gateway drains first, then the children get SIGTERM; from then on nothing
is restarted, and a child still waiting out its backoff is never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import secrets
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from deploy.config import ENV_TOKEN, TailgateConfig
from deploy.supervisor import Action, Phase, RestartBackoff, RestartDecision, RestartPolicy
from gateway.config import GatewayConfig, PoolConfig
from taskserver.queues import QueuePolicy
from taskserver.spawn import tailgate_argv, taskserver_argv
from taskserver.tls import http_server_tls, tls_argv

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
AGENT_START_S = 2.0
"""Extra start-up allowance per edge agent (each imports SQLAlchemy and opens its store)."""
EDGE_CLUSTERS = ("server-room", "wet-lab", "faculty", "gta")
"""Clusters of the emulated Sensing-as-a-Service testbed, assigned to edge servers in blocks."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """Command-line options of ``tailgate up``."""

    servers: int = 8
    edge_agents: int = 0
    port: int = 8080
    host: str = "127.0.0.1"
    policy: str | None = None
    slots: int | None = None
    metrics: bool = False
    autoscale: bool = False
    max_servers: int | None = None
    edge_data: str = "tailgate-edge-data"
    """Folder of the edge agents' sensor stores (kept between runs)."""
    edge_months: int = 18
    """Months of readings seeded into a new store."""
    edge_profiles: bool = True
    """Emulate each cluster's latency profile (the SaaS testbed's heterogeneity)."""
    agents_per_process: int = 1
    """Edge agents one process hosts (``edge-agent run --count``); 1: a process each."""
    edge_read_sample: float = 1.0
    """Share of the agents' range tasks that read the store (the rest sleep their draw)."""
    edge_time_scale: float = 1.0
    """Time scale of the edge testbed: agents' draws, class SLOs, grace and edge prior x it."""
    edge_seed: int = 1
    """Seed of the agents' profile draws: agent i (from 0) gets i + 1 + 1000 (edge_seed - 1)."""
    pipeline_servers: int = 0
    """Task servers running an ONNX inference pipeline, in pool "pipeline"."""
    pipeline: str = "traffic"
    """Their pipeline: a shipped name (traffic, live, ga, dag) or a spec file."""

    def validate(self) -> None:
        """Raise ValueError naming the bad option."""
        if not 0 <= self.servers <= 512:
            raise ValueError(f"--servers: must be 0..512, got {self.servers}")
        if not 0 <= self.edge_agents <= 512:
            raise ValueError(f"--edge-agents: must be 0..512, got {self.edge_agents}")
        if not 0 <= self.pipeline_servers <= 64:
            raise ValueError(f"--pipeline-servers: must be 0..64, got {self.pipeline_servers}")
        if self.servers + self.edge_agents + self.pipeline_servers == 0:
            raise ValueError(
                "--servers, --edge-agents and --pipeline-servers are all 0: "
                "nothing would serve queries"
            )
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port: must be 1..65535, got {self.port}")
        if self.policy is not None:
            QueuePolicy.parse(self.policy, "--policy")
        if self.max_servers is not None and self.max_servers < max(self.servers, 1):
            raise ValueError(
                f"--max-servers: must be >= --servers ({self.servers}), got {self.max_servers}"
            )
        if self.autoscale and self.servers < 1:
            raise ValueError("--autoscale needs --servers >= 1 (the starting replica count)")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--slots: must be >= 1, got {self.slots}")
        if not 1 <= self.edge_months <= 120:
            raise ValueError(f"--edge-months: must be 1..120, got {self.edge_months}")
        if not 1 <= self.agents_per_process <= 512:
            raise ValueError(f"--agents-per-process: must be 1..512, got {self.agents_per_process}")
        if not 0.0 <= self.edge_read_sample <= 1.0:
            raise ValueError(f"--edge-read-sample: must be in [0, 1], got {self.edge_read_sample}")
        if not 0.01 <= self.edge_time_scale <= 100.0:
            raise ValueError(
                f"--edge-time-scale: must be in [0.01, 100], got {self.edge_time_scale}"
            )
        if not self.edge_profiles and (self.edge_read_sample < 1 or self.edge_time_scale != 1):
            raise ValueError(
                "--no-edge-profiles: --edge-read-sample below 1 and --edge-time-scale need "
                "the clusters' profiles to draw service times from"
            )
        if not 1 <= self.edge_seed <= 1_000_000:
            raise ValueError(f"--edge-seed: must be 1..1000000, got {self.edge_seed}")


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One process ``up`` starts: the server it registers as, and how to run it."""

    server_id: str
    pool: str
    argv: tuple[str, ...]
    cluster: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Set on top of the launcher's own environment."""
    servers: int = 1
    """Servers the process registers (dense edge agents: several)."""


def _cli(config_path: str) -> list[str]:
    return tailgate_argv(config_path or None)


def _taskserver_argv(
    config_path: str, opts: UpOptions, server_id: str, pool: str, url: str, metrics_index: int
) -> list[str]:
    return taskserver_argv(
        server_id,
        host=opts.host,
        gateway_url=url,
        pool=pool,
        policy=opts.policy,
        slots=opts.slots or None,
        metrics_port=opts.port + 100 + metrics_index if opts.metrics else None,
        config_path=config_path or None,
        exit_with_parent=True,
    )


def taskserver_spec(
    cfg: TailgateConfig, opts: UpOptions, index: int, url: str, token: str
) -> ChildSpec:
    """Task server ts-(index+1) of pool "default"."""
    sid = f"ts-{index + 1}"
    argv = _taskserver_argv(cfg.source, opts, sid, "default", url, index)
    return ChildSpec(sid, "default", tuple(argv), env={ENV_TOKEN: token})


def pipeline_spec(
    cfg: TailgateConfig, opts: UpOptions, index: int, url: str, token: str, metrics_index: int
) -> ChildSpec:
    """Pipeline task server pipe-(index+1) of pool "pipeline" (slots: the CLI's default)."""
    sid = f"pipe-{index + 1}"
    argv = _taskserver_argv(cfg.source, opts, sid, PIPELINE_POOL, url, metrics_index)
    if "--slots" in argv:  # emulated servers' slots; a pipeline needs many tasks at once
        at = argv.index("--slots")
        del argv[at : at + 2]
    argv += ["--pipeline", opts.pipeline]
    return ChildSpec(sid, PIPELINE_POOL, tuple(argv), env={ENV_TOKEN: token})


PIPELINE_POOL = "pipeline"
"""The pool `up --pipeline-servers` adds (when the config has none of that name)."""


def with_pipeline_pool(gw_cfg: GatewayConfig) -> GatewayConfig:
    """The gateway config with a pool "pipeline" (server queueing, a CDF per server)."""
    if gw_cfg.pool_named(PIPELINE_POOL) is not None:
        return gw_cfg
    return dataclasses.replace(gw_cfg, pools=(*gw_cfg.pools, PoolConfig(name=PIPELINE_POOL)))


def edge_cluster(index: int, count: int) -> str:
    """Cluster of the index-th of count edge servers: equal blocks, server-room first."""
    block = max(1, math.ceil(count / len(EDGE_CLUSTERS)))
    return EDGE_CLUSTERS[min(index // block, len(EDGE_CLUSTERS) - 1)]


def edge_groups(count: int, per_process: int) -> list[range]:
    """The edge agents' indexes per process: each cluster's block cut into per_process chunks.

    A process never mixes clusters, so its agents share one cluster label and profile.
    """
    if count < 0 or per_process < 1:
        raise ValueError(
            f"edge_groups: need count >= 0 and per_process >= 1, got {count}, {per_process}"
        )
    groups: list[range] = []
    start = 0
    while start < count:
        cluster = edge_cluster(start, count)
        end = start + 1
        while end < count and end - start < per_process and edge_cluster(end, count) == cluster:
            end += 1
        groups.append(range(start, end))
        start = end
    return groups


def edge_seed(opts: UpOptions, index: int) -> int:
    """Seed of edge-(index+1)'s profile draws (index + 1 with the default --edge-seed 1)."""
    return index + 1 + 1000 * (opts.edge_seed - 1)


def edge_store(opts: UpOptions, index: int) -> Path:
    """Sensor store of edge-(index+1) (of a dense process, when it is the process's first)."""
    return Path(opts.edge_data) / f"edge-{index + 1}.db"


def _edge_argv(cfg: TailgateConfig, opts: UpOptions, index: int, url: str) -> list[str]:
    """``edge-agent run`` for edge-(index+1), less its id (the options every agent shares)."""
    cluster = edge_cluster(index, opts.edge_agents)
    argv = [
        *_cli(cfg.source),
        "edge-agent",
        "run",
        "--exit-with-parent",
        "--cluster",
        cluster,
        "--host",
        opts.host,
        "--port",
        "0",
        "--gateway",
        url,
        "--db",
        str(edge_store(opts, index)),
        "--seed",
        str(edge_seed(opts, index)),
        "--profile",
        cluster if opts.edge_profiles else "none",
    ]
    if opts.edge_read_sample < 1.0:
        argv += ["--read-sample", repr(opts.edge_read_sample)]
    if opts.edge_time_scale != 1.0:
        argv += ["--time-scale", repr(opts.edge_time_scale)]
    if opts.policy:
        argv += ["--policy", opts.policy]
    # Agents take no config file: [tls] reaches them as options.
    return argv + tls_argv(cfg.gateway.tls)


def edge_agent_spec(
    cfg: TailgateConfig,
    opts: UpOptions,
    index: int,
    url: str,
    token: str,
    metrics_index: int,
) -> ChildSpec:
    """Edge agent edge-(index+1) of pool "edge", in its cluster, on its own store."""
    sid = f"edge-{index + 1}"
    argv = [*_edge_argv(cfg, opts, index, url), "--id", sid]
    if opts.metrics:
        argv += ["--metrics-port", str(opts.port + 100 + metrics_index)]
    cluster = edge_cluster(index, opts.edge_agents)
    return ChildSpec(sid, "edge", tuple(argv), cluster=cluster, env={ENV_TOKEN: token})


def edge_group_spec(
    cfg: TailgateConfig,
    opts: UpOptions,
    group: range,
    url: str,
    token: str,
    metrics_index: int,
) -> ChildSpec:
    """One process of dense edge agents edge-(first+1)..edge-(last+1), on the first's store.

    Each agent is what ``edge_agent_spec`` would start (id, cluster, seed, metrics port
    metrics_index + i), only hosted together (``edge-agent run --count``).
    """
    if len(group) == 1:
        return edge_agent_spec(cfg, opts, group.start, url, token, metrics_index)
    argv = [*_edge_argv(cfg, opts, group.start, url), "--id", "edge"]
    argv += ["--count", str(len(group)), "--first", str(group.start + 1)]
    if opts.metrics:
        argv += ["--metrics-port", str(opts.port + 100 + metrics_index)]
    sid = f"edge-{group.start + 1}..edge-{group[-1] + 1}"
    cluster = edge_cluster(group.start, opts.edge_agents)
    return ChildSpec(
        sid, "edge", tuple(argv), cluster=cluster, env={ENV_TOKEN: token}, servers=len(group)
    )


def edge_specs(
    cfg: TailgateConfig, opts: UpOptions, url: str, token: str, metrics_base: int
) -> list[ChildSpec]:
    """The edge agents' processes: one per agent, or dense ones (--agents-per-process)."""
    return [
        edge_group_spec(cfg, opts, group, url, token, metrics_base + group.start)
        for group in edge_groups(opts.edge_agents, opts.agents_per_process)
    ]


def time_scaled(gw_cfg: GatewayConfig, scale: float) -> GatewayConfig:
    """The gateway config of a testbed run `scale` times slower than the one it emulates.

    Every class's SLO latency, the grace, and pool "edge"'s prior (its service times and
    overhead) are multiplied by `scale`, as the edge agents' draws are (--edge-time-scale):
    a query's deadline and its tasks' CDFs then stand to each other as unscaled.
    """
    classes = tuple(dataclasses.replace(c, latency_ms=c.latency_ms * scale) for c in gw_cfg.classes)
    pools = tuple(
        dataclasses.replace(
            p,
            prior=dataclasses.replace(p.prior, scale=p.prior.scale * scale),
            prior_overhead_ms=p.prior_overhead_ms * scale,
        )
        if p.name == "edge"
        else p
        for p in gw_cfg.pools
    )
    return dataclasses.replace(
        gw_cfg, classes=classes, pools=pools, grace_ms=gw_cfg.grace_ms * scale
    )


def _missing_stores(opts: UpOptions) -> list[int]:
    """Indexes of the agents whose store is used and missing (creating the folder)."""
    Path(opts.edge_data).mkdir(parents=True, exist_ok=True)
    owners = [g.start for g in edge_groups(opts.edge_agents, opts.agents_per_process)]
    return [i for i in owners if not edge_store(opts, i).exists()]


async def seed_edge_stores(cfg: TailgateConfig, opts: UpOptions) -> None:
    """Seed each missing store with edge_months of readings, a few at a time.

    A store is written under a temporary name and renamed when complete, so an
    interrupted seed never leaves a half-filled store that looks ready.
    """
    missing = _missing_stores(opts)
    if not missing:
        return
    print(
        f"tailgate: seeding {len(missing)} edge store(s) in {opts.edge_data} with "
        f"{opts.edge_months} months of readings (first run only)",
        file=sys.stderr,
        flush=True,
    )
    limit = asyncio.Semaphore(max(1, os.cpu_count() or 1))

    async def seed(i: int) -> None:
        final = edge_store(opts, i)
        partial = final.with_name(final.name + ".seeding")
        for leftover in final.parent.glob(partial.name + "*"):
            leftover.unlink()
        async with limit:
            proc = await asyncio.create_subprocess_exec(
                *_cli(cfg.source),
                "edge-agent",
                "seed",
                "--db",
                str(partial),
                "--months",
                str(opts.edge_months),
                "--interval",
                "5m",
                "--seed",
                str(i + 1),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(
                f"tailgate up: seeding {final} failed: {err.decode(errors='replace').strip()}"
            )
        partial.rename(final)

    await asyncio.gather(*(seed(i) for i in missing))


async def _spawn(spec: ChildSpec) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
    # Their stdout only announces the bound address, which we learn on registration.
    # A session of their own: Ctrl-C in a terminal reaches `up` alone, which drains the
    # gateway first and then stops them (--exit-with-parent still ends them if `up` dies).
    return await asyncio.create_subprocess_exec(
        *spec.argv, env=env, stdout=asyncio.subprocess.DEVNULL, start_new_session=True
    )


@dataclass(slots=True)
class _Child:
    spec: ChildSpec
    proc: asyncio.subprocess.Process
    backoff: RestartBackoff
    exited: asyncio.Task[int] | None = None
    """Waits for the current process's exit; None while it waits for its restart."""
    restart_at: float | None = None
    """Loop time of the pending restart."""


class ChildSupervisor:
    """Starts ``up``'s children, restarts those that fail, stops them all in the end."""

    def __init__(
        self, policy: RestartPolicy | None = None, rng: random.Random | None = None
    ) -> None:
        self.policy = policy or RestartPolicy()
        self._rng = rng or random.Random()
        self.phase = Phase.STARTING
        self._children: list[_Child] = []

    @property
    def procs(self) -> list[asyncio.subprocess.Process]:
        """The current process of every child."""
        return [c.proc for c in self._children]

    async def start(self, specs: list[ChildSpec]) -> None:
        """Start every child once."""
        loop = asyncio.get_running_loop()
        for spec in specs:
            child = _Child(spec, await _spawn(spec), RestartBackoff(self.policy, self._rng))
            child.backoff.started(loop.time())
            child.exited = asyncio.ensure_future(child.proc.wait())
            self._children.append(child)

    def check_started(self) -> None:
        """During start-up: raise SystemExit when a child exited (it could not start)."""
        now = asyncio.get_running_loop().time()
        dead = [c for c in self._children if c.proc.returncode is not None]
        if not dead:
            return
        first = dead[0]
        decision = first.backoff.decide(first.proc.returncode, now, self.phase)
        assert decision.action is Action.FATAL, decision
        others = f" (and {len(dead) - 1} more)" if len(dead) > 1 else ""
        raise SystemExit(
            f"tailgate up: server {first.spec.server_id}{others} exited during start-up "
            f"({decision.status}); see its error above"
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set, restart each child that fails after its backoff."""
        self.phase = Phase.RUNNING
        loop = asyncio.get_running_loop()
        stop_wait = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                waits = {c.exited: c for c in self._children if c.exited is not None}
                due = [c.restart_at for c in self._children if c.restart_at is not None]
                timeout = max(0.0, min(due) - loop.time()) if due else None
                done, _ = await asyncio.wait(
                    {stop_wait, *waits}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if stop.is_set():
                    break
                for task in done:
                    if task in waits:
                        self._exited(waits[task], task.result(), loop.time())
                for child in self._children:
                    if stop.is_set():
                        break  # a child still waiting out its backoff is never started
                    if child.restart_at is not None and child.restart_at <= loop.time():
                        await self._restart(child)
        finally:
            stop_wait.cancel()

    def _exited(self, child: _Child, returncode: int | None, now: float) -> None:
        child.exited = None
        decision = child.backoff.decide(returncode, now, self.phase)
        sid = child.spec.server_id
        if decision.action is Action.RESTART:
            child.restart_at = now + decision.delay_s
            print(_restart_line(sid, decision, self.policy), file=sys.stderr, flush=True)
        elif decision.action is Action.STAY_DOWN:
            print(
                f"tailgate: server {sid} exited ({decision.status}); not restarting it "
                "(a clean exit: stopped on purpose or retired when idle)",
                file=sys.stderr,
                flush=True,
            )

    async def _restart(self, child: _Child) -> None:
        loop = asyncio.get_running_loop()
        child.restart_at = None
        try:
            proc = await _spawn(child.spec)
        except OSError as exc:  # fork or exec failed: a failure like any other
            log.error("server %s could not be started: %s", child.spec.server_id, exc)
            self._exited(child, None, loop.time())
            return
        child.proc = proc
        child.backoff.started(loop.time())
        child.exited = asyncio.ensure_future(proc.wait())
        log.info("server %s started again as pid %d", child.spec.server_id, proc.pid)

    async def stop(self) -> None:
        """Stop every child (SIGTERM, then SIGKILL after 5 s); none is restarted any more."""
        self.phase = Phase.STOPPING
        for child in self._children:
            child.restart_at = None
            if child.exited is not None:
                child.exited.cancel()
                child.exited = None
        await _stop(self.procs)


def _restart_line(server_id: str, d: RestartDecision, policy: RestartPolicy) -> str:
    line = (
        f"tailgate: server {server_id} exited ({d.status}); "
        f"restarting in {d.delay_s:.1f} s (restart {d.restart})"
    )
    if d.limited:
        line += (
            f"; CRASH LOOP: {d.recent_failures} failures within "
            f"{policy.start_limit_interval_s:g} s, retrying every ~{policy.max_delay_s:g} s "
            "until it stays up (see its errors above)"
        )
    return line


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


async def up(cfg: TailgateConfig, opts: UpOptions, stop: asyncio.Event | None = None) -> None:
    """Run everything until `stop` is set (Ctrl-C) or cancelled, then stop the children.

    On `stop` the gateway drains first (new queries get 503 draining, those in flight are
    answered while the servers still run); then the children get SIGTERM and drain too.
    """
    stop = asyncio.Event() if stop is None else stop
    from aiohttp import web

    from gateway.access_log import access_log_options
    from gateway.app import create_app
    from gateway.connections import app_runner
    from gateway.service import GatewayService

    gw_cfg = dataclasses.replace(cfg.gateway, host=opts.host, port=opts.port)
    if opts.autoscale:
        scaling = gw_cfg.autoscaling
        top = max(opts.max_servers or scaling.max_replicas, opts.servers)
        scaling = dataclasses.replace(
            scaling,
            enabled=True,
            pool="default",
            min_replicas=min(scaling.min_replicas, opts.servers),
            max_replicas=top,
        )
        gw_cfg = dataclasses.replace(gw_cfg, autoscaling=scaling)
    if opts.pipeline_servers:
        gw_cfg = with_pipeline_pool(gw_cfg)
    if opts.edge_agents and gw_cfg.pool_named("edge") is None:
        raise SystemExit("tailgate up: --edge-agents needs a pool named 'edge' in the config")
    if opts.policy:
        # The policy also orders the queues the gateway holds for central pools (edge agents).
        pools = tuple(dataclasses.replace(p, policy=opts.policy) for p in gw_cfg.pools)
        gw_cfg = dataclasses.replace(gw_cfg, pools=pools)
    if opts.edge_time_scale != 1.0:
        gw_cfg = time_scaled(gw_cfg, opts.edge_time_scale)
    if opts.edge_agents:
        await seed_edge_stores(cfg, opts)
    # Registration is never open here: a configured token, else one for this run only.
    token = gw_cfg.token or secrets.token_urlsafe(32)
    gw_cfg = dataclasses.replace(gw_cfg, token=token)
    service = GatewayService(gw_cfg, registry=CollectorRegistry())
    tls = http_server_tls(gw_cfg.tls)
    runner = app_runner(
        create_app(service), gw_cfg, service.registry, **access_log_options(gw_cfg.access_log)
    )
    await runner.setup()
    children = ChildSupervisor()
    try:
        try:
            ssl_context = None if tls is None else tls.listening()
            await web.TCPSite(runner, opts.host, opts.port, ssl_context=ssl_context).start()
        except OSError as exc:
            print(
                f"tailgate up: cannot listen on {opts.host}:{opts.port}: {exc.strerror}",
                file=sys.stderr,
            )
            raise SystemExit(2) from exc
        url = f"{'http' if tls is None else 'https'}://{opts.host}:{opts.port}"
        # With --autoscale the autoscaler's local actuator owns pool "default".
        n_default = 0 if opts.autoscale else opts.servers
        specs = [taskserver_spec(cfg, opts, i, url, token) for i in range(n_default)]
        specs += edge_specs(cfg, opts, url, token, n_default)
        specs += [
            pipeline_spec(cfg, opts, i, url, token, n_default + opts.edge_agents + i)
            for i in range(opts.pipeline_servers)
        ]
        await children.start(specs)
        if opts.autoscale:
            extra = ["--policy", opts.policy] if opts.policy else []
            # with --metrics-ports, autoscaled server n serves /metrics after the edge agents'
            # and pipeline servers' ports: gateway port + 100 + those + n - 1
            after = opts.edge_agents + opts.pipeline_servers
            metrics_base = opts.port + 100 + after if opts.metrics else None
            await service.enable_autoscaler(
                url,
                extra,
                initial=opts.servers,
                slots=opts.slots or 1,
                metrics_port_base=metrics_base,
            )
        await _wait_ready(
            service,
            sum(spec.servers for spec in specs) + (opts.servers if opts.autoscale else 0),
            children,
            START_TIMEOUT_S + AGENT_START_S * opts.edge_agents,
            stop,
        )
        if not stop.is_set():
            _banner(
                url,
                opts,
                token_given=cfg.gateway.token is not None,
                history=service.history.where,
                ca_file=None if tls is None else gw_cfg.tls.ca_file,
            )
        # One child's death stops nothing else: it is restarted; only `stop` ends this.
        await children.run(stop)
        report = await service.drain()
        print(
            f"tailgate: gateway drained {report.queries} queries in {report.seconds:.2f} s",
            file=sys.stderr,
        )
    finally:
        await children.stop()
        await runner.cleanup()
        print("tailgate: stopped", file=sys.stderr)


async def _wait_ready(
    service: object,
    expected: int,
    children: ChildSupervisor,
    timeout_s: float,
    stop: asyncio.Event,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    links = service.links  # type: ignore[attr-defined]
    while loop.time() < deadline:
        if stop.is_set():  # Ctrl-C during start-up: stop what started, no verdict on it
            return
        up = sum(1 for lk in links.values() if lk.is_up)
        if up >= expected:
            return
        children.check_started()
        await asyncio.sleep(0.1)
    raise SystemExit(
        f"tailgate up: only {sum(1 for lk in links.values() if lk.is_up)} of "
        f"{expected} task servers came up within {timeout_s:g} s"
    )


def _banner(
    url: str, opts: UpOptions, *, token_given: bool, history: str = "", ca_file: str | None = None
) -> None:
    pool, n = ("default", opts.servers) if opts.servers else ("edge", opts.edge_agents)
    if not n:
        pool, n = PIPELINE_POOL, opts.pipeline_servers
    get = "curl -s" if ca_file is None else f"curl -s --cacert {ca_file}"

    def curl(targets: dict[str, Any], cls: str = "A") -> str:
        # Edge agents answer sensing tasks; emulated task servers take any payload.
        task: dict[str, Any] = {}
        if targets.get("pool") == "edge":
            task = {"op": "latest", "sensor": "temperature"}
        elif targets.get("pool") == PIPELINE_POOL:
            task = {"image_seed": 7}
        query: dict[str, Any] = {"class": cls, "targets": targets, "task": task}
        if targets.get("pool") == PIPELINE_POOL:  # the pipeline's own SLO, not a class's
            del query["class"]
            query = {"slo": {"percentile": 99, "latency_ms": 400}, **query}
        body = json.dumps(query)
        return f"{get} -X POST {url}/v1/queries -H 'Content-Type: application/json' -d '{body}'"

    clusters = sorted(
        {edge_cluster(i, opts.edge_agents) for i in range(opts.edge_agents)},
        key=EDGE_CLUSTERS.index,
    )
    token = (
        "the configured one"
        if token_given
        else f"generated for this run (set {ENV_TOKEN} to choose it)"
    )
    lines = [
        f"tailgate: gateway on {url} with {opts.servers} task server(s)"
        + (
            f" and {opts.edge_agents} edge agent(s) in clusters {', '.join(clusters)}"
            + (
                f" ({len(edge_groups(opts.edge_agents, opts.agents_per_process))} processes)"
                if opts.agents_per_process > 1
                else ""
            )
            if opts.edge_agents
            else ""
        )
        + (
            f" and {opts.pipeline_servers} {opts.pipeline} pipeline server(s)"
            if opts.pipeline_servers
            else ""
        ),
        f"  servers:  {get} {url}/v1/servers",
        f"  query:    {curl({'pool': pool, 'fanout': min(4, n)})}",
        *(
            [f"  per cluster: {curl({'pool': 'edge', 'per_cluster': 1}, 'C')}"]
            if opts.edge_agents
            else []
        ),
        *(
            [f"  pipeline: {curl({'pool': PIPELINE_POOL, 'fanout': 1})}"]
            if opts.pipeline_servers and pool != PIPELINE_POOL
            else []
        ),
        f"  metrics:  {url}/metrics    API: {url}/openapi.json",
        # The history store (storage_url, tailgate-gateway.db in this folder by default)
        # keeps the dashboard's last hours across restarts.
        f"  dashboard: {url}/dashboard   (history in {history or 'memory'})",
        *([f"  autoscaler: {url}/v1/autoscaler"] if opts.autoscale else []),
        f"  registration token: {token}",
        "  Ctrl-C drains the gateway, then stops everything.",
    ]
    print("\n".join(lines), flush=True)
