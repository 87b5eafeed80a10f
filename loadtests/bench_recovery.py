"""Fault recovery under load: one task server stops answering (SIGSTOP) or dies (SIGKILL).

Starts ``tailgate up`` (N task servers, no edge agents, history in memory) in its own
process group, drives an open-loop Poisson stream of class-A queries (fanout uniform in
1..fanout-max over pool ``default``) for before + fault + after seconds, and at t = before
faults one task server chosen by the seed:

- ``stop``: SIGSTOP, then SIGCONT fault-s later. The stopped process's listening socket
  still completes TCP handshakes (the kernel's accept backlog), so the gateway can only
  tell from the heartbeat that it is gone;
- ``kill``: SIGKILL; a supervisor in ``tailgate up`` should restart it (without one, ``up``
  exits when a child dies and every later query fails to connect).

It polls ``GET /v1/servers`` every 100 ms (every server's state change, with its time) and
``GET /v1/admission`` every 500 ms (the task deadline-miss ratio that admission control
acts on), and keeps the ``up`` process's own log lines. It prints a per-second timeline
(queries by second of their scheduled send: sent, 200, 200 within SLO, each error
``status code``, hung), the faulted server's state changes, and a summary: the error
window, errors and latency per phase (before, during the fault, the same length after
it, the rest), and the driver's own lateness (actual minus scheduled send), which shows
whether the driver kept its schedule. ``--csv`` writes one row per query.

    python -m loadtests.bench_recovery [--fault stop|kill] [--rate 100] [--servers 8]
        [--fanout-max 4] [--before 10] [--fault-s 10] [--after 20] [--seed 1] [--csv FILE]
        [--hang-s 10] [--up-args '--policy fifo']

Where SIGCONT lands in the gateway's reconnect cycle (a heartbeat timeout every 3 s while
the server is stopped) decides the round trip the link first measures after the resume,
so vary --fault-s by fractions of a second to see both sides of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import math
import os
import random
import shlex
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.ports import free_port

SERVERS_POLL_S = 0.1
ADMISSION_POLL_S = 0.5
BANNER_TIMEOUT_S = 90.0
DRAIN_WAIT_S = 15.0
"""After SIGINT, how long `up` may drain and stop its children before the group is killed."""
OK = "200"
HUNG = "hung"
NO_ANSWER = "no_answer"


@dataclass(slots=True)
class QueryRecord:
    """One query, as the driver saw it (times in seconds since the run's start)."""

    scheduled_s: float
    fanout: int
    sent_s: float = 0.0
    answered_s: float | None = None
    status: int = 0
    """HTTP status; 0: no answer (hung past the client timeout, or a connection error)."""
    code: str = ""
    """error.code of the body; "hung" or "no_answer" when status is 0."""
    met_slo: bool | None = None
    latency_ms: float | None = None
    """The gateway's own latency figure (body `latency_ms`)."""
    servers: str = ""
    """Servers its tasks went to (or the servers_down of a 503), space-separated."""
    bad_servers: str = ""
    """Servers of its tasks that ended neither ok nor cancelled."""
    missed_servers: str = ""
    """Servers of its tasks that were dequeued after their deadline t_D (`missed_deadline`)."""
    detail: str = ""
    """The first bad task's status and error, or the error message."""

    @property
    def label(self) -> str:
        """The outcome column: "200", "<status> <code>", "hung" or "no_answer"."""
        if self.status == 200:
            return OK
        if self.status == 0:
            return self.code
        return f"{self.status} {self.code}".strip()

    @property
    def client_ms(self) -> float | None:
        """Send to answer, as the client saw it."""
        return None if self.answered_s is None else (self.answered_s - self.sent_s) * 1000.0

    @property
    def lateness_ms(self) -> float:
        """How late the driver sent it (actual minus scheduled)."""
        return (self.sent_s - self.scheduled_s) * 1000.0


@dataclass(slots=True)
class RunLog:
    """Everything observed in one run besides the queries."""

    events: list[tuple[float, str]] = field(default_factory=list)
    """(t, what): faults, restarts, `up` exiting."""
    changes: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(t, server, state, detail) on every state change seen in /v1/servers."""
    victim: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Second -> the faulted server as /v1/servers showed it last in that second."""
    victim_polls: list[tuple[float, str]] = field(default_factory=list)
    """(t, state) of the faulted server at every poll ("(not listed)" when absent)."""
    miss_ratio: dict[int, float] = field(default_factory=dict)
    """Second -> the highest admission miss ratio polled in that second."""
    up_log: list[tuple[float, str]] = field(default_factory=list)
    """(t, line) of `up`'s stdout and stderr after the banner (children's logs included)."""


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _delta(now: dict[str, Any], before: dict[str, Any], key: str) -> str:
    """How much a /v1/servers counter grew in a second ("-": not listed)."""
    if key not in now:
        return "-"
    # A re-registered server gets a new link whose counters start again from 0.
    grew = now[key] - before.get(key, 0)
    return str(grew if grew >= 0 else now[key])


def _floor_ms(t: float) -> float:
    return math.floor(t * 1000.0) / 1000.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/<pid>/stat field 22); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def server_children(pid: int) -> dict[str, int]:
    """Task-server children of `pid` (walks /proc): server id (``--id``) -> pid."""
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if "--id" in argv[:-1]:
            found[argv[argv.index("--id") + 1]] = int(entry)
    return found


class Tailgate:
    """``tailgate up`` in its own process group; stop() ends it, whatever happened."""

    def __init__(self, servers: int, port: int, log: RunLog, extra: list[str]) -> None:
        self.servers = servers
        self.port = port
        self.extra = extra
        """More `up` options (--policy, --slots, --metrics-ports, ...)."""
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.clock = Clock()
        """Stamps `up`'s output lines; replaced by the run's clock when the run starts."""
        self.proc: asyncio.subprocess.Process | None = None
        self.readers: list[asyncio.Task[None]] = []
        self.stopped = False
        self.seen: dict[int, str] = {}
        """Task-server pids ever seen -> their start time. A supervisor may start them in
        groups of their own, out of reach of a signal to up's group; the start time tells a
        reused pid apart."""

    async def start(self) -> None:
        """Start `up`, wait for its banner and keep reading its output into the log."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "deploy.cli",
            "--log-level",
            "WARNING",
            "up",
            "--servers",
            str(self.servers),
            "--edge-agents",
            "0",
            "--storage-url",
            "",
            "--port",
            str(self.port),
            *self.extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers.append(asyncio.create_task(self._read(self.proc.stderr)))
        deadline = time.monotonic() + BANNER_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            line = await asyncio.wait_for(self.proc.stdout.readline(), max(left, 0.01))
            if not line:
                raise RuntimeError(f"tailgate up exited before its banner: {self.log.up_log[-5:]}")
            if b"Ctrl-C" in line:
                break
        self.readers.append(asyncio.create_task(self._read(self.proc.stdout)))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.up_log.append((self.clock.now(), line.decode(errors="replace").rstrip()))

    async def children(self, timeout_s: float = 10.0) -> dict[str, int]:
        """The task-server children by server id, once all of them are there."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.note_children()
            if len(found) >= self.servers or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)

    def note_children(self) -> dict[str, int]:
        """The task-server children now (server id -> pid), remembered for stop()."""
        found = server_children(self.proc.pid) if self.proc is not None else {}
        for pid in found.values():
            started = _start_time(pid)
            if started is not None:
                self.seen.setdefault(pid, started)
        return found

    def signal_children(self, sig: int) -> int:
        """Send sig to every task server seen that still runs; how many."""
        sent = 0
        for pid, started in self.seen.items():
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                    sent += 1
        return sent

    def signal_group(self, sig: int) -> bool:
        """Send sig to the whole process group; False when nothing is left in it."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the group id is up's pid
        except ProcessLookupError:
            return False
        return True

    async def stop(self) -> int | None:
        """SIGINT the group (a clean drain), SIGKILL it after DRAIN_WAIT_S; up's exit code."""
        if self.proc is None:
            return None
        self.note_children()
        # A stopped child would not act on the SIGTERM `up` sends it.
        self.signal_group(signal.SIGCONT)
        self.signal_children(signal.SIGCONT)
        if self.proc.returncode is None:
            self.signal_group(signal.SIGINT)
            try:
                await asyncio.wait_for(self.proc.wait(), DRAIN_WAIT_S)
            except TimeoutError:
                print(f"tailgate up did not stop within {DRAIN_WAIT_S:g} s: SIGKILL to its group")
                self.signal_group(signal.SIGKILL)
                await self.proc.wait()
        # Children left behind (exit-with-parent is asynchronous): a short grace, then kill.
        for _ in range(30):
            if not self.signal_group(0) and not self.signal_children(0):
                break
            await asyncio.sleep(0.1)
        else:
            left = self.signal_children(signal.SIGKILL)
            self.signal_group(signal.SIGKILL)
            print(f"killed what was left of tailgate up's group and {left} task server(s)")
        for r in self.readers:
            r.cancel()
        self.stopped = True
        return self.proc.returncode

    def kill_now(self) -> None:
        """Last resort after the event loop is gone (a second Ctrl-C): SIGKILL the group."""
        if self.proc is not None and not self.stopped:
            self.signal_group(signal.SIGCONT)
            self.signal_group(signal.SIGKILL)
            self.signal_children(signal.SIGCONT)
            self.signal_children(signal.SIGKILL)


class Clock:
    """Seconds since the run's start (the loop's monotonic clock)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since t0."""
        return time.monotonic() - self.t0


def schedule(
    rate: float, duration_s: float, fanout_max: int, rng: random.Random
) -> list[tuple[float, int]]:
    """Open-loop Poisson arrivals: (send time, fanout) pairs over [0, duration_s)."""
    out: list[tuple[float, int]] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append((t, rng.randint(1, fanout_max)))
        t += rng.expovariate(rate)
    return out


async def one_query(
    http: aiohttp.ClientSession, url: str, rec: QueryRecord, clock: Clock, hang_s: float
) -> None:
    """POST one query and fill in its record."""
    body = {"class": "A", "targets": {"pool": "default", "fanout": rec.fanout}, "task": {}}
    rec.sent_s = clock.now()
    try:
        async with asyncio.timeout(hang_s):
            async with http.post(url + "/v1/queries", json=body) as r:
                rec.status = r.status
                try:
                    ans = await r.json(content_type=None)
                except ValueError:
                    ans = {}
    except TimeoutError:
        rec.code, rec.detail = HUNG, f"no answer within {hang_s:g} s"
        return
    except aiohttp.ClientError as exc:
        rec.answered_s = clock.now()
        rec.code, rec.detail = NO_ANSWER, f"{type(exc).__name__}: {exc}"
        return
    rec.answered_s = clock.now()
    ans = ans if isinstance(ans, dict) else {}
    err = ans.get("error")
    if isinstance(err, dict):
        rec.code = str(err.get("code") or "")
        rec.detail = str(err.get("message") or "")
    rec.met_slo = ans.get("met_slo")
    lat = ans.get("latency_ms")
    rec.latency_ms = float(lat) if isinstance(lat, int | float) else None
    tasks = ans.get("tasks") if isinstance(ans.get("tasks"), list) else []
    rec.servers = " ".join(str(t.get("server")) for t in tasks if isinstance(t, dict))
    if not tasks and isinstance(ans.get("servers_down"), list):
        rec.servers = rec.bad_servers = " ".join(map(str, ans["servers_down"]))
    rec.missed_servers = " ".join(
        str(t.get("server")) for t in tasks if isinstance(t, dict) and t.get("missed_deadline")
    )
    bad = [t for t in tasks if isinstance(t, dict) and t.get("status") not in ("ok", "cancelled")]
    if bad:
        rec.bad_servers = " ".join(str(t.get("server")) for t in bad)
        rec.detail = f"{bad[0].get('server')} {bad[0].get('status')}: {bad[0].get('error')}"


async def drive(
    url: str, plan: list[tuple[float, int]], clock: Clock, hang_s: float
) -> list[QueryRecord]:
    """Send every query of the plan at its time (open loop); wait for all answers."""
    records: list[QueryRecord] = []
    pending: list[asyncio.Task[None]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        try:
            for at_s, fanout in plan:
                delay = at_s - clock.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                rec = QueryRecord(at_s, fanout)
                records.append(rec)
                pending.append(asyncio.create_task(one_query(http, url, rec, clock, hang_s)))
            await asyncio.sleep(0)  # let the last one start before gather's setup loop runs
            await asyncio.gather(*(t for t in pending if not t.done()))
        finally:
            for t in pending:
                t.cancel()
    return records


async def poll_servers(
    http: aiohttp.ClientSession, url: str, victim: str, log: RunLog, clock: Clock
) -> None:
    """Log every server's state change from /v1/servers, and the victim's rtt per second."""
    last: dict[str, str] = {}
    while True:
        try:
            async with http.get(url + "/v1/servers", timeout=aiohttp.ClientTimeout(2)) as r:
                servers = await r.json()
            now = clock.now()
            listed = servers if isinstance(servers, list) else servers.get("servers", [])
            seen = set()
            for s in listed:
                sid = s["id"]
                seen.add(sid)
                if sid == victim:
                    log.victim[int(now)] = s
                    log.victim_polls.append((now, s["state"]))
                if last.get(sid) != s["state"]:
                    last[sid] = s["state"]
                    detail = f"rtt_ms={s.get('rtt_ms')} outstanding={s.get('outstanding')}"
                    if s.get("last_error"):
                        detail += f" last_error={s['last_error']!r}"
                    log.changes.append((now, sid, s["state"], detail))
            if victim not in seen:
                log.victim_polls.append((now, "(not listed)"))
            for sid in set(last) - seen:
                del last[sid]
                log.changes.append((now, sid, "(not listed)", ""))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            if last.get("(gateway)") != type(exc).__name__:
                last["(gateway)"] = type(exc).__name__
                log.changes.append((clock.now(), "(gateway)", "unreachable", repr(exc)))
        await asyncio.sleep(SERVERS_POLL_S)


async def poll_admission(http: aiohttp.ClientSession, url: str, log: RunLog, clock: Clock) -> None:
    """The admission window's miss ratio, highest per second."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with http.get(url + "/v1/admission", timeout=aiohttp.ClientTimeout(2)) as r:
                ratio = float((await r.json())["window"]["ratio"])
            sec = int(clock.now())
            log.miss_ratio[sec] = max(ratio, log.miss_ratio.get(sec, 0.0))
        await asyncio.sleep(ADMISSION_POLL_S)


async def apply_fault(
    tg: Tailgate,
    fault: str,
    victim: str,
    pid: int,
    args: argparse.Namespace,
    log: RunLog,
    clock: Clock,
) -> None:
    """Stop (then continue) or kill the victim at its time; watch for a restarted one."""
    await asyncio.sleep(max(args.before - clock.now(), 0.0))
    if fault == "stop":
        os.kill(pid, signal.SIGSTOP)
        log.events.append((clock.now(), f"SIGSTOP {victim} (pid {pid})"))
        try:
            await asyncio.sleep(max(args.before + args.fault_s - clock.now(), 0.0))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                log.events.append((clock.now(), f"SIGCONT {victim} (pid {pid})"))
        return
    os.kill(pid, signal.SIGKILL)
    log.events.append((clock.now(), f"SIGKILL {victim} (pid {pid})"))
    assert tg.proc is not None
    while tg.proc.returncode is None:
        new = tg.note_children().get(victim)
        if new is not None and new != pid:
            log.events.append((clock.now(), f"{victim} restarted as pid {new}"))
            return
        await asyncio.sleep(0.1)


async def watch_up(tg: Tailgate, log: RunLog, clock: Clock) -> None:
    """Note when `up` exits during the run."""
    assert tg.proc is not None
    code = await tg.proc.wait()
    log.events.append((clock.now(), f"tailgate up exited with code {code}"))


def phases(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """(name, start, end) of the summary's phases."""
    b, f = args.before, args.fault_s
    end = args.before + args.fault_s + args.after
    during = "stopped" if args.fault == "stop" else "after kill"
    after = "after resume" if args.fault == "stop" else "next"
    out = [("before", 0.0, b), (during, b, b + f), (after, b + f, min(b + 2 * f, end))]
    if b + 2 * f < end:
        out.append(("rest", b + 2 * f, end))
    return out


def report(records: list[QueryRecord], log: RunLog, args: argparse.Namespace, victim: str) -> None:
    """Print the timeline, the victim's state changes and the summary."""
    labels = sorted({r.label for r in records} - {OK}, key=lambda s: (s in (HUNG, NO_ANSWER), s))
    by_sec: dict[int, list[QueryRecord]] = {}
    for r in records:
        by_sec.setdefault(int(r.scheduled_s), []).append(r)
    end = int(args.before + args.fault_s + args.after)
    marks: dict[int, str] = {}
    for t, what in log.events:
        marks[int(t)] = f"{marks[int(t)]}; {what}" if int(t) in marks else what
    print(f"\nTimeline (queries by second of scheduled send; faulted server {victim})")
    print(
        "  late99: the driver's p99 lateness (ms); miss%: admission's task deadline-miss ratio;\n"
        f"  {victim}: its /v1/servers view at the end of the second: state, rtt_ms, outstanding "
        "tasks, tasks sent and results received in that second"
    )
    head = ["t", "sent", "200", "met", *labels, "late99", "miss%"]
    head += [f"{victim}:", "state", "rtt", "out", "tasks", "results"]
    widths = [max(len(h), 5) for h in head]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for sec in range(end):
        rs = by_sec.get(sec, [])
        counts = Counter(r.label for r in rs)
        v, before = log.victim.get(sec, {}), log.victim.get(sec - 1, {})
        rtt = v.get("rtt_ms")
        miss = log.miss_ratio.get(sec)
        row = [
            str(sec),
            str(len(rs)),
            str(counts[OK]),
            str(sum(1 for r in rs if r.met_slo)),
            *(str(counts[lb]) if counts[lb] else "." for lb in labels),
            _ms(_pct([r.lateness_ms for r in rs], 99)),
            "-" if miss is None else f"{100 * miss:.1f}",
            "",
            str(v.get("state", "-")),
            "-" if rtt is None else f"{rtt:.0f}",
            str(v.get("outstanding", "-")),
            *(_delta(v, before, k) for k in ("tasks_sent", "results")),
        ]
        line = "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
        print(line + (f"   <- {marks[sec]}" if sec in marks else ""))

    print("\nEvents")
    for t, what in log.events:
        print(f"  t={t:7.3f}  {what}")
    print(f"\nState changes of {victim} in /v1/servers (polled every {SERVERS_POLL_S:g} s)")
    for t, sid, state, detail in log.changes:
        if sid in (victim, "(gateway)"):
            print(f"  t={t:7.3f}  {sid} -> {state}  {detail}")
    others = [c for c in log.changes if c[1] not in (victim, "(gateway)") and c[0] > 0.5]
    if others:
        print("State changes of other servers")
        for t, sid, state, detail in others:
            print(f"  t={t:7.3f}  {sid} -> {state}  {detail}")

    bad = [r for r in records if r.label != OK]
    print("\nSummary")
    if bad:
        first, last = min(r.scheduled_s for r in bad), max(r.scheduled_s for r in bad)
        print(
            f"  error window: t={int(first)}..{int(last)} s ({int(last) - int(first) + 1} s "
            f"with errors from the first to the last; first error scheduled at "
            f"{_floor_ms(first):.3f} s, last at {_floor_ms(last):.3f} s; "
            f"fault at {args.before:g} s)"
        )
    else:
        print("  error window: none (every query answered 200)")
    _print_recovery(log, args, victim)
    print(
        f"  {'phase':<13}{'window':>13}{'queries':>9}{'failed':>8}{'fail%':>7}"
        f"{'p50 ms':>8}{'p99 ms':>8}  {'failed, ' + victim + ' among bad tasks':>26}"
        f"  {'late tasks: ' + victim + '/all':>18}  errors"
    )
    for name, lo, hi in phases(args):
        rs = [r for r in records if lo <= r.scheduled_s < hi]
        failed = [r for r in rs if r.label != OK]
        mine = sum(1 for r in failed if victim in r.bad_servers.split())
        late_v = sum(r.missed_servers.split().count(victim) for r in rs)
        late_all = sum(len(r.missed_servers.split()) for r in rs)
        lat = [ms for r in rs if (ms := r.client_ms) is not None and r.code != NO_ANSWER]
        pct = 100.0 * len(failed) / len(rs) if rs else 0.0
        errs = ", ".join(f"{lb}: {n}" for lb, n in Counter(r.label for r in failed).most_common())
        print(
            f"  {name:<13}{f'[{lo:g}, {hi:g})':>13}{len(rs):>9}{len(failed):>8}{pct:>6.1f}%"
            f"{_ms(_pct(lat, 50)):>8}{_ms(_pct(lat, 99)):>8}  {mine:>26}"
            f"  {f'{late_v}/{late_all}':>18}  {errs or '-'}"
        )
    late = [r.lateness_ms for r in records]
    print(
        f"  driver lateness (actual - scheduled send): p50 {_pct(late, 50) or 0:.2f} ms, "
        f"p99 {_pct(late, 99) or 0:.2f} ms, max {max(late, default=0):.2f} ms "
        f"over {len(records)} queries"
    )
    hung = sum(1 for r in records if r.code == HUNG)
    print(f"  hung (no answer within {args.hang_s:g} s): {hung}")
    lines = [(t, line) for t, line in log.up_log if line.strip()]
    if lines:
        print(f"\ntailgate up's log during the run ({len(lines)} lines; first 40)")
        for t, line in lines[:40]:
            print(f"  t={t:7.3f}  {line}")


def _print_recovery(log: RunLog, args: argparse.Namespace, victim: str) -> None:
    """When the gateway showed the faulted server down, and up again after the fault ended."""
    polls = log.victim_polls
    down = next((t for t, state in polls if t >= args.before and state != "up"), None)
    # stop: back after SIGCONT; kill: back after the restart (so after it was seen down)
    back_from = args.before + args.fault_s if args.fault == "stop" else args.before
    since = max(back_from, down or back_from)
    up = next((t for t, state in polls if t >= since and state == "up"), None)
    shown = "never shown down" if down is None else f"shown down at t={down:.3f} s"
    if down is not None:
        shown += f" ({down - args.before:.3f} s after the fault)"
    ended = "SIGCONT" if args.fault == "stop" else "the kill"
    again = "not shown up again" if up is None else f"up again at t={up:.3f} s"
    if up is not None:
        again += f" ({up - back_from:.3f} s after {ended})"
    print(f"  {victim}: {shown}; {again} (/v1/servers, polled every {SERVERS_POLL_S:g} s)")


def write_csv(path: str, records: list[QueryRecord]) -> None:
    """One row per query."""
    with Path(path).open("w", newline="") as f:
        names = list(asdict(records[0]).keys()) if records else []
        w = csv.DictWriter(f, fieldnames=[*names, "client_ms", "lateness_ms"])
        w.writeheader()
        for r in records:
            w.writerow({**asdict(r), "client_ms": r.client_ms, "lateness_ms": r.lateness_ms})


async def main_async(args: argparse.Namespace, tg: Tailgate) -> None:
    """Start, drive, fault, report, stop."""
    log = tg.log
    background: list[asyncio.Task[Any]] = []
    try:
        await tg.start()
        kids = await tg.children()
        ids = sorted(kids, key=lambda s: (len(s), s))
        if len(ids) < args.servers:
            raise RuntimeError(f"found {len(ids)} of {args.servers} task servers: {kids}")
        rng = random.Random(args.seed)
        victim = rng.choice(ids)
        plan = schedule(args.rate, args.before + args.fault_s + args.after, args.fanout_max, rng)
        print(
            f"tailgate up (pid {tg.proc.pid if tg.proc else '?'}) on {tg.url}; "
            f"{len(ids)} task servers; fault {args.fault} on {victim} (pid {kids[victim]}) "
            f"at {args.before:g} s for {args.fault_s:g} s; {len(plan)} queries at "
            f"{args.rate:g}/s, fanout 1..{args.fanout_max}",
            flush=True,
        )
        clock = tg.clock = Clock()  # from here on, times are since the run's start
        log.up_log.clear()
        async with aiohttp.ClientSession() as poll_http:
            background = [
                asyncio.create_task(poll_servers(poll_http, tg.url, victim, log, clock)),
                asyncio.create_task(poll_admission(poll_http, tg.url, log, clock)),
                asyncio.create_task(
                    apply_fault(tg, args.fault, victim, kids[victim], args, log, clock)
                ),
                asyncio.create_task(watch_up(tg, log, clock)),
            ]
            records = await drive(tg.url, plan, clock, args.hang_s)
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        report(records, log, args, victim)
        if args.csv:
            write_csv(args.csv, records)
            print(f"\nper-query records: {args.csv}")
    finally:
        for t in background:
            t.cancel()
        code = await tg.stop()
        print(f"\ntailgate up exit code: {code}")


def main() -> None:
    """Parse options and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fault", choices=("stop", "kill"), default="stop")
    parser.add_argument("--rate", type=float, default=100.0, help="queries per second (100)")
    parser.add_argument("--servers", type=int, default=8, help="task servers (8)")
    parser.add_argument("--fanout-max", type=int, default=4, help="fanout uniform in 1..this")
    parser.add_argument("--before", type=float, default=10.0, help="seconds before the fault")
    parser.add_argument(
        "--fault-s", type=float, default=10.0, help="seconds stopped; the phase length"
    )
    parser.add_argument("--after", type=float, default=20.0, help="seconds after the fault")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-s", type=float, default=10.0, help="client timeout: 'hung'")
    parser.add_argument("--csv", help="write the per-query records here")
    parser.add_argument(
        "--up-args", default="", help="more options for `tailgate up`, e.g. '--policy fifo'"
    )
    args = parser.parse_args()
    if not 1 <= args.fanout_max <= args.servers:
        parser.error("--fanout-max must be in 1..--servers")
    tg = Tailgate(args.servers, free_port(), RunLog(), shlex.split(args.up_args))
    try:
        asyncio.run(main_async(args, tg))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        tg.kill_now()  # no-op when stop() already ended the group


if __name__ == "__main__":
    main()
