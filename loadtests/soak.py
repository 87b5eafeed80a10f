"""Chaos soak: open-loop load on two gateway replicas while a seeded schedule breaks things.

    python -m loadtests.soak --minutes N [--seed S] [--rate R] [--servers K] [--agents A]
        [--out DIR] [--mean-gap-s G]

Starts, on loopback, two gateway replicas (``gw-a``, ``gw-b``) that share one history store
(a SQLite file in DIR, each writing under its own ``replica`` name: SQLite in WAL mode with a
busy timeout takes two writer processes on one host), K task servers and A edge agents, one
process each, every one registering with both replicas (``--gateway A,B``) through a
`loadtests.tcp_relay.TcpRelay` that fronts its Thrift port (it advertises the relay's
address), and runs for N minutes:

- an open-loop driver: queries at seeded Poisson arrival times (`loadtests.soak_plan`),
  whatever the answers, spread over both replicas. Like a client behind a load balancer it
  tries the other replica when a connection is refused or dropped before the answer, or
  the answer is 503 ``draining``; edge queries go to the replica that owns the edge pool
  and follow a 503 ``pool_owned_elsewhere`` to the other. Every try has a client timeout of
  the query's SLO + the gateway's grace (1 s) + 10 s: a try that gets no answer by then is
  counted **hung**;
- a seeded schedule of faults (`loadtests.soak_plan.build_schedule`): kill -9 and start
  again, SIGSTOP/SIGCONT, restart by SIGTERM, and partitions of a server's link (the relay
  blackholes it), on task servers, edge agents and gateway replica ``gw-b`` (``gw-a`` is
  never faulted);
- around every kill and restart of an edge agent, its store is read before the signal,
  checked with ``PRAGMA integrity_check`` once the process is gone, and read again once it
  runs again: every reading committed before must still be there;
- the gateways' resident memory every 5 s.

It prints the report as markdown and writes ``report.json`` and ``report.md`` to DIR (with
each process's log), and exits 1 if a query hung, got no answer from either replica or got
a 5xx that no documented failure mode explains, a committed reading was lost, or an
integrity check failed; 2 when the system could not be started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.ports import free_port
from loadtests.soak_plan import Fault, PlannedQuery, build_schedule, plan_queries
from loadtests.soak_report import (
    EdgeCheck,
    QueryRecord,
    fault_windows,
    lost_readings,
    problems,
    tally,
    timeline,
    to_markdown,
)
from loadtests.tcp_relay import TcpRelay
from taskserver.spawn import tailgate_argv, taskserver_argv

__all__ = ["main", "run_soak"]

START_TIMEOUT_S = 30.0
"""A process must announce itself within this."""
READY_TIMEOUT_S = 60.0
"""Both replicas must see every server within this of the start."""
GRACE_S = 1.0
"""The gateways' grace (`grace_ms`, default): every query is answered by SLO + grace."""
HANG_MARGIN_S = 10.0
"""A try is hung when no answer came within SLO + grace + this (``--hang-margin-s``)."""
MAX_TRIES = 3
"""Tries of one query over the two replicas (the first and two failovers)."""
WARMUP_S = 10.0
QUIET_S = 20.0
RSS_EVERY_S = 5.0
RECOVERY_TIMEOUT_S = 30.0
RESUME_TIMEOUT_S = 15.0
"""A restarted edge agent must store a new reading within this (it samples every 1 s)."""
STOP_WAIT_S = 15.0
"""A process told to stop (SIGTERM) must exit within this (its drain is ~3 s)."""
CLUSTERS = ("server-room", "wet-lab", "faculty", "gta")
GATEWAYS = ("gw-a", "gw-b")
FAULTED_GATEWAY = "gw-b"


def _die_with_parent() -> None:
    """In each child before exec: SIGKILL when the soak dies (Linux's parent-death signal).
    SIGKILL, not SIGTERM: a child the schedule has stopped would never act on SIGTERM."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _rss_mib(pid: int) -> float | None:
    """Resident set size of a process in MiB (Linux /proc); None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _read_keys(db: Path) -> set[tuple[int, int]]:
    """(sensor id, unix second) of every reading an edge agent's store holds now."""
    con = sqlite3.connect(str(db), timeout=10.0)
    try:
        return {(int(a), int(b)) for a, b in con.execute("SELECT sensor_id, ts FROM readings")}
    finally:
        con.close()


def _integrity(db: Path) -> str:
    """PRAGMA integrity_check of a SQLite file: "ok", or its findings on one line."""
    try:
        con = sqlite3.connect(str(db), timeout=10.0)
        try:
            rows = [str(r[0]) for r in con.execute("PRAGMA integrity_check").fetchall()]
        finally:
            con.close()
    except sqlite3.Error as exc:
        return f"error: {exc}"
    return "; ".join(rows)


@dataclass
class Child:
    """One process of the system under test, started again as often as the schedule says."""

    name: str
    tier: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    relay: TcpRelay | None = None
    db: Path | None = None
    port: int = 0
    """The Thrift port a relayed server binds, behind its relay."""
    proc: asyncio.subprocess.Process | None = None
    info: dict[str, Any] = field(default_factory=dict)
    starts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    drain: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start the process and read its announcement (a JSON line on stdout)."""
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1} at {time.strftime('%X')}\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env,
                preexec_fn=_die_with_parent,
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)
            self.info = json.loads(line)
        except (TimeoutError, ValueError) as exc:
            self.proc.kill()
            await self.proc.wait()
            raise RuntimeError(
                f"{self.name} did not start (exit {self.proc.returncode}; see {self.log_path})"
            ) from exc
        self.starts += 1
        if self.relay is not None:
            self.relay.upstream = f"127.0.0.1:{self.port}"
        self.drain = asyncio.create_task(self._drain(self.proc.stdout))

    @staticmethod
    async def _drain(stdout: asyncio.StreamReader) -> None:
        while await stdout.read(65536):
            pass

    def send(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def gone(self) -> None:
        """Wait for the process to exit; its relay then refuses new connections."""
        if self.proc is not None:
            await self.proc.wait()
        if self.relay is not None:
            self.relay.upstream = None

    async def stop(self) -> str:
        """SIGTERM (a stopped process is continued first), SIGKILL if it does not exit."""
        if not self.alive:
            return ""
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_WAIT_S)
            note = ""
        except TimeoutError:
            self.send(signal.SIGKILL)
            await self.proc.wait()
            note = f"did not exit within {STOP_WAIT_S:g} s of SIGTERM: killed"
        await self.gone()
        return note


def _gateway_toml(name: str, port: int, store: Path) -> str:
    return (
        "[gateway]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        f'replica = "{name}"\n'
        f'storage_url = "sqlite:///{store}"\n'
        "history_interval_s = 1.0\n"
        "[admission]\n"
        "# A window in seconds: misses of a fault are forgotten 10 s after it, instead of\n"
        "# holding the ratio for the 100,000 tasks of the default window.\n"
        "window_tasks = 0\n"
        "window_s = 10.0\n"
    )


class Soak:
    """One run: the processes, the driver, the faults and what they saw."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.duration_s = args.minutes * 60.0
        self.children: dict[str, Child] = {}
        self.urls: list[str] = []
        self.records: list[QueryRecord] = []
        self.events: list[dict[str, Any]] = []
        self.edge_checks: list[EdgeCheck] = []
        self.rss: dict[str, list[tuple[float, int, float]]] = {g: [] for g in GATEWAYS}
        self.edge_owner = 0
        self.t0 = 0.0
        self.http: aiohttp.ClientSession | None = None
        self.store = out / "gateway-history.db"
        self.hang_margin_s = float(args.hang_margin_s)

    # -- the system under test -----------------------------------------------------------
    async def start(self) -> None:
        token = secrets.token_hex(16)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TAILGATE_AGENT_TOKEN=token)
        for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN_FILE"):
            env.pop(name, None)
        for name in GATEWAYS:
            port = free_port()
            cfg = self.out / f"{name}.toml"
            cfg.write_text(_gateway_toml(name, port, self.store))
            self.urls.append(f"http://127.0.0.1:{port}")
            argv = [*tailgate_argv(str(cfg)), "gateway"]
            self.children[name] = Child(name, "gateway", argv, env, self.out / f"{name}.log")
        await asyncio.gather(*(self.children[g].start() for g in GATEWAYS))
        gateways = ",".join(self.urls)
        for i in range(1, self.args.servers + 1):
            name = f"ts-{i}"
            relay, port = await self._relay()
            argv = taskserver_argv(
                name,
                port=port,
                gateway_url=gateways,
                extra_args=("--advertise", relay.address, "--seed", str(self.args.seed + i)),
            )
            self.children[name] = Child(
                name, "server", argv, env, self.out / f"{name}.log", relay=relay, port=port
            )
        for i in range(1, self.args.agents + 1):
            name = f"edge-{i}"
            relay, port = await self._relay()
            db = self.out / f"{name}.db"
            argv = [
                *tailgate_argv(),
                "edge-agent",
                "run",
                "--id",
                name,
                "--cluster",
                CLUSTERS[(i - 1) % len(CLUSTERS)],
                "--port",
                str(port),
                "--advertise",
                relay.address,
                "--db",
                str(db),
                "--gateway",
                gateways,
                "--sample-interval-s",
                "1",
                "--seed",
                str(self.args.seed + 100 + i),
            ]
            self.children[name] = Child(
                name, "agent", argv, env, self.out / f"{name}.log", relay=relay, db=db, port=port
            )
        others = [c for c in self.children.values() if c.tier != "gateway"]
        await asyncio.gather(*(c.start() for c in others))
        await self._wait_ready()

    @staticmethod
    async def _relay() -> tuple[TcpRelay, int]:
        """A relay for one server, and the port the server binds behind it (the same port
        at every start: the announcement names only the advertised address)."""
        relay = TcpRelay()
        await relay.start()
        return relay, free_port()

    async def _views(self, url: str) -> dict[str, str]:
        assert self.http is not None
        async with self.http.get(url + "/v1/servers", timeout=aiohttp.ClientTimeout(5)) as r:
            return {s["id"]: s["state"] for s in (await r.json())["servers"]}

    async def _wait_ready(self) -> None:
        want = {c.name for c in self.children.values() if c.tier != "gateway"}
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            ready = 0
            for url in self.urls:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    seen = await self._views(url)
                    if all(seen.get(n) in ("up", "owned_elsewhere") for n in want):
                        ready += 1
            if ready == len(self.urls):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"the replicas did not see every server up in time; last: {seen}")

    async def stop_all(self) -> None:
        notes = await asyncio.gather(*(c.stop() for c in self.children.values()))
        for c, note in zip(self.children.values(), notes, strict=True):
            if note:
                self.events.append({"kind": "shutdown", "target": c.name, "note": note})
        for c in self.children.values():
            if c.relay is not None:
                await c.relay.close()
            if c.drain is not None:
                c.drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await c.drain

    # -- the driver ----------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def drive(self, plan: list[PlannedQuery]) -> None:
        """Send every planned query at its time, whatever happened to the others."""
        pending: set[asyncio.Task[None]] = set()
        for q in plan:
            delay = q.at_s - self._now()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self.send(q))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)

    @staticmethod
    def _edge_task(op: str) -> dict[str, Any]:
        if op == "latest":
            return {"op": "latest", "sensor": "temperature"}
        end = datetime.now(UTC)
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        return {
            "op": "range",
            "sensor": "temperature",
            "start": (end - timedelta(minutes=10)).strftime(fmt),
            "end": (end + timedelta(seconds=1)).strftime(fmt),
        }

    async def send(self, q: PlannedQuery) -> QueryRecord:
        """Send one query now, failing over as a client behind a load balancer would."""
        assert self.http is not None
        now = self._now()
        rec = QueryRecord(sent_s=now, pool=q.pool, late_s=now - q.at_s)
        self.records.append(rec)
        body = q.body
        if q.pool == "edge":
            body = {**body, "task": self._edge_task(str(body["task"]["op"]))}
        replica = self.edge_owner if q.pool == "edge" else q.replica
        timeout = aiohttp.ClientTimeout(total=q.slo_s + GRACE_S + self.hang_margin_s)
        start = self._now()
        for attempt in range(MAX_TRIES):
            cause = ""
            try:
                async with self.http.post(
                    self.urls[replica] + "/v1/queries", json=body, timeout=timeout
                ) as r:
                    status = r.status
                    raw = await r.read()
            except TimeoutError:
                rec.hung = True
                rec.status, rec.code = 0, ""
                return rec
            except aiohttp.ClientConnectorError:
                cause = "refused"
            except aiohttp.ClientError:
                cause = "disconnected"
            else:
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = {"error": {"code": "not_json"}}
                if not isinstance(data, dict):
                    data = {"error": {"code": "not_json"}}
                code = ""
                if status >= 400:
                    error = data.get("error")
                    error = error if isinstance(error, dict) else {}
                    code = str(error.get("code", "")) or "?"
                    rec.message = str(error.get("message", ""))[:300]
                rec.status, rec.code = status, code
                rec.latency_s = self._now() - start
                if status < 300:
                    rec.met_slo = bool(data.get("met_slo"))
                    if q.pool == "edge":
                        self.edge_owner = replica
                    return rec
                if status == 503 and code == "draining":
                    cause = "draining"
                elif status == 503 and code == "pool_owned_elsewhere" and q.pool == "edge":
                    cause = "owner"
                    self.edge_owner = 1 - replica
                else:
                    return rec
            if attempt + 1 < MAX_TRIES:
                rec.failovers.append(cause)
                replica = 1 - replica
        # Out of tries: the last HTTP answer stands; none at all is "no_answer".
        return rec

    # -- the faults ----------------------------------------------------------------------
    async def run_fault(self, f: Fault) -> None:
        delay = f.at_s - self._now()
        if delay > 0:
            await asyncio.sleep(delay)
        child = self.children[f.target]
        async with child.lock:
            ev: dict[str, Any] = {**f.to_json(), "started_s": round(self._now(), 3)}
            note = ""
            integrity = "n/a"
            before: set[tuple[int, int]] | None = None
            if f.kind in ("kill", "restart") and child.db is not None:
                before = await asyncio.to_thread(_read_keys, child.db)
            if f.kind == "kill":
                child.send(signal.SIGKILL)
                await child.gone()
                integrity = await self._after_death(child)
                await asyncio.sleep(f.hold_s)
                note = await self._start_again(child, ev)
            elif f.kind == "restart":
                note = await child.stop()
                integrity = await self._after_death(child)
                note = "; ".join(n for n in (note, await self._start_again(child, ev)) if n)
            elif f.kind == "stop":
                child.send(signal.SIGSTOP)
                await asyncio.sleep(f.hold_s)
                child.send(signal.SIGCONT)
            elif f.kind == "partition":
                assert child.relay is not None
                child.relay.blackhole()
                await asyncio.sleep(f.hold_s)
                child.relay.heal()
            else:
                raise ValueError(f"unknown fault kind {f.kind!r}")
            ev["ended_s"] = round(self._now(), 3)
            recovered = await self._recovered(child)
            if before is not None and child.db is not None:
                after = await self._resumed(child.db, before)
                self.edge_checks.append(
                    EdgeCheck(
                        ev["started_s"],
                        child.name,
                        f.kind,
                        len(before),
                        len(after),
                        lost_readings(before, after),
                        integrity,
                        len(after - before),
                    )
                )
        ev["recovered_s"] = None if recovered is None else round(recovered, 3)
        if recovered is None:
            note = (note + "; " if note else "") + (
                f"not seen back within {RECOVERY_TIMEOUT_S:g} s"
            )
        ev["note"] = note
        self.events.append(ev)

    @staticmethod
    async def _start_again(child: Child, ev: dict[str, Any]) -> str:
        """Start a process the fault ended; a failure is noted in the event (and fails the
        run), not raised: the soak goes on with the rest."""
        try:
            await child.start()
        except (RuntimeError, OSError) as exc:
            ev["start_failed"] = True
            return f"did not start again: {exc}"
        return ""

    async def _resumed(self, db: Path, before: set[tuple[int, int]]) -> set[tuple[int, int]]:
        """The store's readings once the restarted agent wrote a new one (or RESUME_TIMEOUT_S
        passed): the after-restart count then shows that sampling resumed."""
        newest = max((ts for _, ts in before), default=0)
        deadline = self._now() + RESUME_TIMEOUT_S
        while True:
            after = await asyncio.to_thread(_read_keys, db)
            if any(ts > newest for _, ts in after) or self._now() > deadline:
                return after
            await asyncio.sleep(0.5)

    async def _after_death(self, child: Child) -> str:
        """The store of a dead edge agent, checked as the process left it."""
        if child.db is None:
            return "n/a"
        return await asyncio.to_thread(_integrity, child.db)

    async def _recovered(self, child: Child) -> float | None:
        """When the stable replica (or, for a replica, its own /readyz) shows it back."""
        assert self.http is not None
        deadline = self._now() + RECOVERY_TIMEOUT_S
        while self._now() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                if child.tier == "gateway":
                    url = self.urls[GATEWAYS.index(child.name)]
                    async with self.http.get(
                        url + "/readyz", timeout=aiohttp.ClientTimeout(2)
                    ) as r:
                        if r.status == 200:
                            return self._now()
                else:
                    views = await self._views(self.urls[0])
                    if views.get(child.name) in ("up", "owned_elsewhere"):
                        return self._now()
            await asyncio.sleep(0.1)
        return None

    # -- memory --------------------------------------------------------------------------
    def sample_rss(self) -> None:
        for name in GATEWAYS:
            c = self.children[name]
            if c.alive and c.proc is not None:
                rss = _rss_mib(c.proc.pid)
                if rss is not None:
                    self.rss[name].append((round(self._now(), 1), c.proc.pid, round(rss, 2)))

    async def watch_rss(self) -> None:
        while True:
            self.sample_rss()
            await asyncio.sleep(RSS_EVERY_S)

    def rss_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, series in self.rss.items():
            warm = [s for s in series if s[0] >= WARMUP_S] or series
            out[name] = {
                "idle_mib": series[0][2] if series else None,
                "start_mib": warm[0][2] if warm else None,
                "start_at_s": warm[0][0] if warm else None,
                "end_mib": series[-1][2] if series else None,
                "end_at_s": series[-1][0] if series else None,
                "max_mib": max(s[2] for s in series) if series else None,
                "restarts": self.children[name].starts - 1,
                "samples": len(series),
            }
        return out

    # -- the run -------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        a = self.args
        servers = [f"ts-{i}" for i in range(1, a.servers + 1)]
        agents = [f"edge-{i}" for i in range(1, a.agents + 1)]
        schedule = build_schedule(
            a.seed,
            self.duration_s,
            servers,
            agents,
            FAULTED_GATEWAY,
            warmup_s=WARMUP_S,
            quiet_s=QUIET_S,
            mean_gap_s=a.mean_gap_s,
        )
        plan = plan_queries(a.seed, a.rate, self.duration_s, a.servers, a.agents)
        started = time.time()
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as self.http:
            try:
                await self.start()
                print(
                    f"soak: {len(plan)} queries over {a.minutes:g} min, {len(schedule)} "
                    f"faults; logs in {self.out}",
                    flush=True,
                )
                self.t0 = asyncio.get_running_loop().time()
                rss = asyncio.create_task(self.watch_rss())
                faults = [asyncio.create_task(self.run_fault(f)) for f in schedule]
                try:
                    await self.drive(plan)
                    await asyncio.gather(*faults)
                finally:
                    rss.cancel()
                    for t in faults:
                        t.cancel()
                    await asyncio.gather(rss, *faults, return_exceptions=True)
                self.sample_rss()
            finally:
                await self.stop_all()
        return self.report(started)

    def stores(self) -> dict[str, Any]:
        """Integrity and counts of every store, once every process has stopped."""
        out: dict[str, Any] = {}
        if self.store.exists():
            con = sqlite3.connect(str(self.store), timeout=10.0)
            try:
                rows = dict(
                    con.execute(
                        "SELECT replica, count(*) FROM gateway_history GROUP BY replica"
                    ).fetchall()
                )
            except sqlite3.Error as exc:
                rows = {"error": str(exc)}
            finally:
                con.close()
            out["gateway-history.db"] = {
                "integrity_check": _integrity(self.store),
                "samples_per_replica": rows,
            }
        for c in self.children.values():
            if c.db is not None and c.db.exists():
                out[c.db.name] = {
                    "integrity_check": _integrity(c.db),
                    "readings": len(_read_keys(c.db)),
                }
        return out

    def report(self, started: float) -> dict[str, Any]:
        a = self.args
        events = sorted((e for e in self.events if "at_s" in e), key=lambda e: e["at_s"])
        windows = fault_windows(events)
        for e, (lo, hi) in zip(events, windows, strict=True):
            e["errors"] = sum(
                1 for r in self.records if lo <= r.sent_s <= hi and r.label[:1] not in "24"
            )
        tracebacks = {
            c.name: c.log_path.read_text(errors="replace").count("Traceback")
            for c in self.children.values()
            if c.log_path.exists()
        }
        report: dict[str, Any] = {
            "config": {
                "command": "python -m loadtests.soak " + " ".join(sys.argv[1:]),
                "minutes": a.minutes,
                "seed": a.seed,
                "rate_per_s": a.rate,
                "servers": a.servers,
                "agents": a.agents,
                "mean_gap_s": a.mean_gap_s,
                "hang_margin_s": self.hang_margin_s,
                "history_store": "sqlite (WAL), one file for both replicas",
                "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
                "wall_s": round(time.time() - started, 1),
                "out": str(self.out),
            },
            "queries": tally(self.records, windows),
            "timeline": timeline(self.records, max(5.0, round(self.duration_s / 60.0))),
            "events": events,
            "shutdown": [e for e in self.events if "at_s" not in e],
            "gateway_rss": self.rss_report(),
            "rss_series": {k: v for k, v in self.rss.items()},
            "edge_checks": [c.to_json() for c in self.edge_checks],
            "stores": self.stores(),
            "tracebacks_in_logs": tracebacks,
        }
        report["problems"] = problems(report)
        report["ok"] = not report["problems"]
        return report


def run_soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run one soak; its report (also written to `out` as report.json and report.md)."""
    report = asyncio.run(Soak(args, out).run())
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(to_markdown(report))
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.soak",
        description="Chaos soak: open-loop load on two gateway replicas while a seeded "
        "schedule kills, stops, restarts and partitions servers, edge agents and a replica.",
    )
    p.add_argument("--minutes", type=float, required=True, help="length of the run")
    p.add_argument("--seed", type=int, default=1, help="seed of the queries and faults (1)")
    p.add_argument("--rate", type=float, default=20.0, help="queries per second (20)")
    p.add_argument("--servers", type=int, default=3, help="task servers, a process each (3)")
    p.add_argument("--agents", type=int, default=2, help="edge agents, a process each (2)")
    p.add_argument(
        "--mean-gap-s", type=float, default=15.0, help="mean time between two faults (15)"
    )
    p.add_argument(
        "--hang-margin-s",
        type=float,
        default=HANG_MARGIN_S,
        help="a try is hung without an answer within SLO + grace + this (10)",
    )
    p.add_argument("--out", help="directory for the report and logs (default: a new temp dir)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtests.soak``; exit 0 when nothing failed, 1 otherwise, 2 on bad use."""
    p = _parser()
    args = p.parse_args(argv)
    if not args.minutes * 60.0 > WARMUP_S + QUIET_S:
        p.error(f"--minutes: must be over {(WARMUP_S + QUIET_S) / 60:g}, got {args.minutes:g}")
    if not args.rate > 0:
        p.error(f"--rate: must be > 0, got {args.rate:g}")
    if not args.hang_margin_s > 0:
        p.error(f"--hang-margin-s: must be > 0, got {args.hang_margin_s:g}")
    if not args.mean_gap_s > 0:
        p.error(f"--mean-gap-s: must be > 0, got {args.mean_gap_s:g}")
    if args.servers < 1:
        p.error(f"--servers: must be >= 1, got {args.servers}")
    if args.agents < 0:
        p.error(f"--agents: must be >= 0, got {args.agents}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tailgate-soak-"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        p.error(f"--out: cannot create {out}: {exc}")

    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind, so every started process is stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        report = run_soak(args, out)
    except (RuntimeError, OSError) as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    print(to_markdown(report), flush=True)
    print(f"soak: report in {out / 'report.json'} and {out / 'report.md'}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
