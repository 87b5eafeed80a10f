"""``tailgate up``: the gateway in this process, task servers as child processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from deploy.config import TailgateConfig

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0


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

    def validate(self) -> None:
        """Raise ValueError naming the bad option."""
        if not 0 <= self.servers <= 512:
            raise ValueError(f"--servers: must be 0..512, got {self.servers}")
        if not 0 <= self.edge_agents <= 512:
            raise ValueError(f"--edge-agents: must be 0..512, got {self.edge_agents}")
        if self.servers + self.edge_agents == 0:
            raise ValueError("--servers and --edge-agents are both 0: nothing would serve queries")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port: must be 1..65535, got {self.port}")
        if self.policy is not None and self.policy not in ("tf-edfq", "t-edfq", "priq", "fifo"):
            raise ValueError(
                f"--policy: must be tf-edfq, t-edfq, priq or fifo, got {self.policy!r}"
            )
        if self.max_servers is not None and self.max_servers < max(self.servers, 1):
            raise ValueError(
                f"--max-servers: must be >= --servers ({self.servers}), got {self.max_servers}"
            )
        if self.autoscale and self.servers < 1:
            raise ValueError("--autoscale needs --servers >= 1 (the starting replica count)")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--slots: must be >= 1, got {self.slots}")


def _taskserver_argv(
    cfg: TailgateConfig, opts: UpOptions, server_id: str, pool: str, url: str, index: int
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "deploy.cli",
        *(["--config", cfg.source] if cfg.source else []),
        "--log-level",
        "WARNING",
        "taskserver",
        "--exit-with-parent",
        "--id",
        server_id,
        "--host",
        opts.host,
        "--port",
        "0",
        "--gateway",
        url,
        "--pool",
        pool,
    ]
    if opts.policy:
        argv += ["--policy", opts.policy]
    if opts.slots:
        argv += ["--slots", str(opts.slots)]
    if opts.metrics:
        argv += ["--metrics-port", str(opts.port + 100 + index)]
    if pool == "edge":
        # Emulated sensing agents: the edge pool's prior, so the gateway's CDFs start right.
        edge = cfg.gateway.pool_named("edge")
        spec = edge.prior if edge is not None else None
        if spec is not None:
            argv += ["--service-kind", spec.kind]
            for name in ("mean_ms", "median_ms", "sigma", "value_ms", "path", "scale"):
                value = getattr(spec, name, None)
                if value is not None:
                    argv += [f"--service-{name.replace('_', '-')}", str(value)]
    return argv


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


async def up(cfg: TailgateConfig, opts: UpOptions) -> None:
    """Run everything until cancelled (Ctrl-C), then stop the children."""
    from aiohttp import web

    from gateway.app import create_app
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
    if opts.edge_agents and gw_cfg.pool_named("edge") is None:
        raise SystemExit("tailgate up: --edge-agents needs a pool named 'edge' in the config")
    service = GatewayService(gw_cfg, registry=CollectorRegistry())
    runner = web.AppRunner(create_app(service), access_log=None)
    await runner.setup()
    procs: list[asyncio.subprocess.Process] = []
    try:
        try:
            await web.TCPSite(runner, opts.host, opts.port).start()
        except OSError as exc:
            print(
                f"tailgate up: cannot listen on {opts.host}:{opts.port}: {exc.strerror}",
                file=sys.stderr,
            )
            raise SystemExit(2) from exc
        url = f"http://{opts.host}:{opts.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # With --autoscale the autoscaler's local actuator owns pool "default".
        specs = [] if opts.autoscale else [(f"ts-{i + 1}", "default") for i in range(opts.servers)]
        specs += [(f"edge-{i + 1}", "edge") for i in range(opts.edge_agents)]
        for i, (sid, pool) in enumerate(specs):
            argv = _taskserver_argv(cfg, opts, sid, pool, url, i)
            # Their stdout only announces the bound address, which we learn on registration.
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=asyncio.subprocess.DEVNULL
                )
            )
        if opts.autoscale:
            extra = ["--policy", opts.policy] if opts.policy else []
            await service.enable_autoscaler(url, extra, initial=opts.servers, slots=opts.slots or 1)
        await _wait_ready(service, len(specs) + (opts.servers if opts.autoscale else 0), procs)
        _banner(url, opts)
        while True:
            await asyncio.sleep(1.0)
            for p, (sid, _) in zip(procs, specs, strict=True):
                if p.returncode is not None:
                    log.error("task server %s exited with code %s", sid, p.returncode)
                    raise SystemExit(1)
    finally:
        await _stop(procs)
        await runner.cleanup()
        print("tailgate: stopped", file=sys.stderr)


async def _wait_ready(
    service: object, expected: int, procs: list[asyncio.subprocess.Process]
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    links = service.links  # type: ignore[attr-defined]
    while loop.time() < deadline:
        up = sum(1 for lk in links.values() if lk.is_up)
        if up >= expected:
            return
        dead = [p for p in procs if p.returncode is not None]
        if dead:
            raise SystemExit(f"tailgate up: a task server exited with code {dead[0].returncode}")
        await asyncio.sleep(0.1)
    raise SystemExit(
        f"tailgate up: only {sum(1 for lk in links.values() if lk.is_up)} of "
        f"{expected} task servers came up within {START_TIMEOUT_S:g} s"
    )


def _banner(url: str, opts: UpOptions) -> None:
    pool, n = ("default", opts.servers) if opts.servers else ("edge", opts.edge_agents)
    body = json.dumps({"class": "A", "targets": {"pool": pool, "fanout": min(4, n)}, "task": {}})
    example = f"curl -s -X POST {url}/v1/queries -H 'Content-Type: application/json' -d '{body}'"
    lines = [
        f"tailgate: gateway on {url} with {opts.servers} task server(s)"
        + (f" and {opts.edge_agents} edge agent(s)" if opts.edge_agents else ""),
        f"  servers:  curl -s {url}/v1/servers",
        f"  query:    {example}",
        f"  metrics:  {url}/metrics    API: {url}/openapi.json",
        *([f"  autoscaler: {url}/v1/autoscaler"] if opts.autoscale else []),
        "  Ctrl-C stops everything.",
    ]
    print("\n".join(lines), flush=True)
