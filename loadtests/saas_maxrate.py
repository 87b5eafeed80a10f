"""Highest query rate at which every SaaS class meets its SLO, per queue policy.

For each policy: start `tailgate up --config deploy/saas.toml --edge-agents N --policy P` on
a free loopback port (its own process group, stopped afterwards whatever happens), wait for
the agents, then drive rising rates (`loadtests.saas.drive`) until a class misses its SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtests.saas import RunReport, drive, format_report

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "deploy" / "saas.toml"
START_TIMEOUT_S = 600.0
"""Seeding 32 agents' 18 months of readings takes a while on a small machine."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _live_agents(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/v1/servers", timeout=5) as r:
            servers = json.loads(r.read())
    except OSError:
        return 0
    items = servers.get("servers", servers) if isinstance(servers, dict) else servers
    return sum(1 for s in items if s.get("pool") == "edge" and s.get("state") == "up")


def start_up(policy: str, agents: int) -> tuple[subprocess.Popen[bytes], str]:
    """`tailgate up` for the SaaS testbed under one queue policy; returns it and its URL."""
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "deploy.cli",
        "--log-level",
        "WARNING",
        "--config",
        str(CONFIG),
        "up",
        "--servers",
        "0",
        "--edge-agents",
        str(agents),
        "--policy",
        policy,
        "--port",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGATE_")}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tailgate up exited with code {proc.returncode}")
        if _live_agents(url) >= agents:
            return proc, url
        time.sleep(1.0)
    stop_up(proc)
    raise RuntimeError(f"tailgate up: {agents} agents not up within {START_TIMEOUT_S:g} s")


def stop_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def find_max_rates(policies: list[str], rates: list[float], args: argparse.Namespace) -> int:
    """Run the search and print a table; every run's figures go to --json if given."""
    results: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    for policy in policies:
        proc, url = start_up(policy, args.agents)
        best = 0.0
        try:
            for rate in rates:
                r: RunReport = asyncio.run(
                    drive(url, rate, args.duration, seed=args.seed, warmup_s=args.warmup)
                )
                print(f"[{policy}] {format_report(r, args.agents)}", flush=True)
                runs.append({"policy": policy, **r.to_json(args.agents)})
                if not r.all_met:
                    break
                best = rate
        finally:
            stop_up(proc)
        results[policy] = best
    print("\npolicy    highest rate with every class within its SLO (q/s)")
    for policy, best in results.items():
        print(f"{policy:9} {best:g}" if best else f"{policy:9} < {rates[0]:g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"max_rate": results, "runs": runs}, indent=1))
    return 0
