"""Highest query rate at which every SaaS class meets its SLO, per queue policy and seed.

For each seed and policy: start ``tailgate up --config deploy/saas.toml --edge-agents N
--agents-per-process K --edge-read-sample S --edge-seed SEED --policy P`` on a free loopback
port (its own process group, stopped afterwards whatever happens), wait for the agents,
then bisect over rates (`loadtests.saas_search.RateBisection`), each probe a run of
`loadtests.saas.drive` with the seed's query mix and arrivals. The seed also picks the
agents' profile draws (``--edge-seed``), so a seed changes every draw of the workload;
within a seed every policy and every probe sees the same queries (common random numbers).
The policies' order turns with each seed, so a drift of the host over the hours does not
always favour the same one.

With ``--time-scale s`` the testbed runs s times slower (agents' draws, SLOs, grace and
prior; see deploy.launcher): a probe of rate r drives r / s queries per second, and rates
are reported in the emulated testbed's time (r).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests.ports import free_port
from loadtests.saas import RunReport, drive, format_report
from loadtests.saas_search import PolicySummary, RateBisection, SeedResult, ranking_line, summarise

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "deploy" / "saas.toml"
START_TIMEOUT_S = 600.0
"""Seeding new stores with 18 months of readings takes a while on a small machine."""


@dataclass(frozen=True)
class Testbed:
    """How `tailgate up` builds the SaaS testbed."""

    agents: int = 32
    agents_per_process: int = 8
    """Emulated agents per edge-agent process (dense agents)."""
    read_sample: float = 0.05
    """Share of range tasks that read the agent's store; the rest sleep their draw."""
    time_scale: float = 1.0
    """The testbed runs this many times slower than the Pis it emulates."""

    def __post_init__(self) -> None:
        if not 1 <= self.agents <= 512:
            raise ValueError(f"--agents: must be 1..512, got {self.agents}")
        if not 1 <= self.agents_per_process <= 512:
            raise ValueError(f"--agents-per-process: must be 1..512, got {self.agents_per_process}")
        if not 0.0 <= self.read_sample <= 1.0:
            raise ValueError(f"--read-sample: must be in [0, 1], got {self.read_sample}")
        if not 0.01 <= self.time_scale <= 100.0:
            raise ValueError(f"--time-scale: must be in [0.01, 100], got {self.time_scale}")


@dataclass(frozen=True)
class Search:
    """The rates to search and how long each probe runs."""

    low: float = 4.0
    high: float = 64.0
    resolution: float = 1.0
    max_probes: int = 8
    duration_s: float = 60.0
    warmup_s: float = 10.0


def _live_agents(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/v1/servers", timeout=5) as r:
            servers = json.loads(r.read())
    except OSError:
        return 0
    items = servers.get("servers", servers) if isinstance(servers, dict) else servers
    return sum(1 for s in items if s.get("pool") == "edge" and s.get("state") == "up")


def up_argv(policy: str, testbed: Testbed, seed: int, port: int) -> list[str]:
    """The `tailgate up` command line of one policy and seed."""
    return [
        sys.executable,
        "-m",
        "deploy.cli",
        "--log-level",
        "WARNING",
        "--config",
        str(CONFIG),
        "up",
        "--storage-url",
        "",
        "--servers",
        "0",
        "--edge-agents",
        str(testbed.agents),
        "--agents-per-process",
        str(testbed.agents_per_process),
        "--edge-read-sample",
        repr(testbed.read_sample),
        "--edge-time-scale",
        repr(testbed.time_scale),
        "--edge-seed",
        str(seed),
        "--policy",
        policy,
        "--port",
        str(port),
    ]


def start_up(policy: str, testbed: Testbed, seed: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """`tailgate up` for the SaaS testbed under one queue policy; returns it and its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGATE_")}
    proc = subprocess.Popen(
        up_argv(policy, testbed, seed, port),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tailgate up exited with code {proc.returncode}")
        if _live_agents(url) >= testbed.agents:
            return proc, url
        time.sleep(0.5)
    stop_up(proc)
    raise RuntimeError(f"tailgate up: {testbed.agents} agents not up within {START_TIMEOUT_S:g} s")


def stop_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def max_rate(
    url: str, policy: str, seed: int, testbed: Testbed, search: Search, runs: list[dict[str, Any]]
) -> SeedResult:
    """Bisect one running testbed's highest passing rate; each probe's figures go to runs."""
    bisection = RateBisection(search.low, search.high, search.resolution, search.max_probes)
    utilisation: dict[float, float] = {}
    while (rate := bisection.next_rate()) is not None:
        r: RunReport = asyncio.run(
            drive(
                url,
                rate / testbed.time_scale,
                search.duration_s,
                seed=seed,
                warmup_s=search.warmup_s,
            )
        )
        bisection.record(rate, r.all_met)
        utilisation[rate] = r.utilisation(testbed.agents)
        print(
            f"[{policy} seed {seed} rate {rate:g}] {format_report(r, testbed.agents)}", flush=True
        )
        runs.append({"policy": policy, "seed": seed, "rate": rate, **r.to_json(testbed.agents)})
    best = bisection.best
    return SeedResult(seed, best, utilisation.get(best, 0.0), bisection.capped)


def bound_s(policies: int, seeds: int, search: Search) -> float:
    """Most seconds of driving the whole search can take (start-ups and drains aside)."""
    return policies * seeds * search.max_probes * (search.warmup_s + search.duration_s)


def find_max_rates(
    policies: list[str],
    seeds: list[int],
    testbed: Testbed,
    search: Search,
    json_path: str | None = None,
) -> int:
    """Run the search over seeds and policies, print the table and the ranking."""
    print(
        f"saas maxrate: {len(policies)} policies x {len(seeds)} seeds, rates {search.low:g}-"
        f"{search.high:g} q/s to within {search.resolution:g}, at most {search.max_probes} "
        f"probes of {search.warmup_s:g}+{search.duration_s:g} s each: at most "
        f"{bound_s(len(policies), len(seeds), search) / 60:.1f} min of driving; "
        f"{testbed.agents} agents, {testbed.agents_per_process} per process, read sample "
        f"{testbed.read_sample:g}, time scale {testbed.time_scale:g}",
        flush=True,
    )
    results: dict[str, list[SeedResult]] = {p: [] for p in policies}
    runs: list[dict[str, Any]] = []
    for turn, seed in enumerate(seeds):
        order = policies[turn % len(policies) :] + policies[: turn % len(policies)]
        for policy in order:
            proc, url = start_up(policy, testbed, seed)
            try:
                results[policy].append(max_rate(url, policy, seed, testbed, search, runs))
            finally:
                stop_up(proc)
    summaries = [summarise(p, sorted(results[p], key=lambda s: s.seed)) for p in policies]
    print(report_table(summaries, seeds, testbed))
    if json_path:
        Path(json_path).write_text(
            json.dumps(
                {
                    "testbed": asdict(testbed),
                    "search": asdict(search),
                    "seeds": seeds,
                    "max_rate": {s.policy: s.to_json() for s in summaries},
                    "runs": runs,
                },
                indent=1,
            )
        )
    return 0


def report_table(summaries: list[PolicySummary], seeds: list[int], testbed: Testbed) -> str:
    """The per-policy table and the ranking line."""
    unit = "q/s of the emulated testbed" if testbed.time_scale != 1 else "q/s"
    lines = [
        "",
        f"highest rate with every class within its SLO ({unit}), "
        f"over seeds {', '.join(map(str, seeds))}",
        "policy       mean ± 95% CI  min-max       util   [per seed]",
        *(s.line() for s in summaries),
        ranking_line(summaries),
    ]
    return "\n".join(lines)
