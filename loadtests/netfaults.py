"""Network faults on links into network namespaces this process creates.

A `Netns` is a network namespace of its own; a `Link` is a veth pair from the root
namespace into it, a /30 of 10.231.0.0/16 (`host_addr` on the root side, `ns_addr`
inside). A process started with `Netns.exec_argv` and bound to `ns_addr` is reached from
the root namespace only over that link, so a fault on the link is a fault between it and
everything outside::

    with Netns() as ns, Link(ns) as link:
        server = subprocess.Popen(ns.exec_argv([...]))   # binds link.ns_addr
        with link.delay(20, jitter_ms=5):                # each way: RTT + 40 ms ± 10
            ...
        with link.partition():                           # every packet dropped, both ways
            ...
        link.heal()                                      # every fault off

Every fault acts on the packets crossing the link, in both directions, and is set up
inside the namespace (its own netfilter tables, its end of the pair) or on the pair's
root end; the root namespace's firewall and routes are never touched. How each is built
(`probe()` says what this kernel and userland have; ``python -m loadtests.netfaults``
prints it):

========== ========================================== =====================================
fault      with netem (kernel sch_netem)               without netem
========== ========================================== =====================================
delay      netem ``delay D J`` on both ends            NFQUEUE + loadtests.nfqueue holds
                                                       each packet D ± J (uniform)
reorder    netem ``delay G reorder 1-p`` (the on-time  NFQUEUE: a share p held G longer
           share goes without delay: netem's rule)
loss       netem ``loss p`` on both ends               iptables ``-m statistic --mode random
                                                       --probability p -j DROP`` on INPUT and
                                                       OUTPUT of the namespace's end
partition  iptables DROP of everything on the namespace's end (a blackhole: connections
           stall, nothing is reset); without iptables, ``pfifo limit 0`` on both ends
link down  ``ip link set down`` on the namespace's end (the root end loses its carrier)
========== ========================================== =====================================

Loss on the namespace's OUTPUT hook drops a packet before it reaches the wire: its sender
is told (the segment is not counted as sent) and TCP sends it again on its retransmission
timer, as it would after a loss on the wire; loss on INPUT is loss on the wire.

Names are unique per process (``tgf-<pid>-<n>``; interfaces ``tg<pid>-<n>-<i>h|n``), each
namespace holds a lock file while it lives, and every new `Netns` first removes the
namespaces of processes that died without cleaning up (their lock is free): their
processes are killed and the namespace deleted, which deletes its veth pairs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from loadtests.nfqueue import HoldPolicy

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "Link",
    "NetfaultError",
    "Netns",
    "Support",
    "cleanup_stale",
    "main",
    "probe",
]

PREFIX = "tgf"
"""Every namespace this module creates is named tgf-<pid base 36>-<n>."""
SUBNET = ipaddress.IPv4Network("10.231.0.0/16")
"""Links take /30s of this private range (4096 links at once)."""
FAULT_KINDS = ("delay", "reorder", "loss", "partition", "link-down")
REPO_ROOT = Path(__file__).resolve().parents[1]
_TIMEOUT_S = 20.0
"""Bound on each ip / tc / iptables command."""


class NetfaultError(RuntimeError):
    """A command that sets up a namespace, a link or a fault failed (its stderr says why)."""


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetfaultError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetfaultError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def _state_dir() -> Path:
    """Where lock files live: /run (beside /run/netns) when writable, else the temp dir."""
    for base in (Path("/run"), Path(tempfile.gettempdir())):
        d = base / "tailgate-netfaults"
        try:
            d.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise NetfaultError("no writable directory for the namespaces' lock files")


@contextlib.contextmanager
def _global_lock() -> Iterator[None]:
    """Serialises name and address choice between processes (concurrent test runs)."""
    with open(_state_dir() / "alloc.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _netns_names() -> list[str]:
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _remove_netns(name: str) -> None:
    """Kill what runs in the namespace, delete its veth pairs, then the namespace."""
    pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    # The kernel deletes a namespace's pairs only once nothing holds it (a killed process
    # may take a moment to go): deleted here, each pair's root end is gone on return.
    veths = _run(["ip", "-n", name, "-o", "link", "show", "type", "veth"], check=False).stdout
    for line in veths.splitlines():
        dev = line.split(":")[1].strip().split("@")[0]
        _run(["ip", "-n", name, "link", "del", dev], check=False)
    _run(["ip", "netns", "del", name], check=False)


def cleanup_stale() -> list[str]:
    """Delete the namespaces of processes that died without cleaning up; their names."""
    if not shutil.which("ip"):
        return []
    with _global_lock():
        return _cleanup_stale(_state_dir())


def _cleanup_stale(state: Path) -> list[str]:
    removed: list[str] = []
    names = set(_netns_names())
    for lock in state.glob(f"{PREFIX}-*.lock"):
        name = lock.stem
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its process is alive
        try:
            if name in names:
                _remove_netns(name)
                removed.append(name)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return removed


class Netns:
    """A network namespace of this process's own, deleted (with what runs in it) on close."""

    def __init__(self) -> None:
        if not shutil.which("ip"):
            raise NetfaultError("no `ip` command (iproute2): cannot create network namespaces")
        cleanup_stale()
        self._lock_fd: int | None = None
        self._links = 0
        self.closed = False
        pid36 = _b36(os.getpid())
        with _global_lock():
            taken = set(_netns_names())
            state = _state_dir()
            n = 0
            while (
                f"{PREFIX}-{pid36}-{_b36(n)}" in taken
                or (state / f"{PREFIX}-{pid36}-{_b36(n)}.lock").exists()
            ):
                n += 1
            self.name = f"{PREFIX}-{pid36}-{_b36(n)}"
            self._tag = f"tg{pid36}-{_b36(n)}"
            """Interface name stem: at most 15 characters with `-<i>h`."""
            # The lock comes first: a run killed between the two leaves a lock to find.
            fd = os.open(state / f"{self.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_fd = fd
            try:
                _run(["ip", "netns", "add", self.name])
                self.run(["ip", "link", "set", "lo", "up"])
            except BaseException:
                self.close()
                raise

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace and wait for it."""
        return _run(self.exec_argv(argv), check=check)

    def next_link_index(self) -> int:
        i = self._links
        self._links += 1
        return i

    @property
    def tag(self) -> str:
        return self._tag

    def pids(self) -> list[int]:
        """Processes running inside the namespace."""
        out = _run(["ip", "netns", "pids", self.name], check=False).stdout
        return [int(p) for p in out.split()]

    def tcp_counters(self) -> dict[str, int]:
        """The namespace's TCP counters (/proc/net/snmp Tcp and /proc/net/netstat TcpExt):
        RetransSegs, TCPSACKReorder, TCPOFOQueue, ..."""
        out: dict[str, int] = {}
        for path in ("/proc/net/snmp", "/proc/net/netstat"):
            rows = [line.split() for line in self.run(["cat", path]).stdout.splitlines()]
            for head, values in zip(rows[::2], rows[1::2], strict=False):
                if head and head[0] in ("Tcp:", "TcpExt:"):
                    out.update({k: int(v) for k, v in zip(head[1:], values[1:], strict=True)})
        return out

    def close(self) -> None:
        """Kill what still runs inside, delete the namespace and its links."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(NetfaultError):
            _remove_netns(self.name)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                (_state_dir() / f"{self.name}.lock").unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Netns:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class _Faults:
    """What is on a link now."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reorder: float = 0.0
    gap_ms: float = 0.0
    loss: float = 0.0
    blackhole: bool = False
    down: bool = False

    @property
    def hold(self) -> HoldPolicy | None:
        """The per-packet hold when any of delay, jitter or reorder is on."""
        if not (self.delay_ms or self.jitter_ms or self.reorder):
            return None
        return HoldPolicy(self.delay_ms, self.jitter_ms, self.reorder, self.gap_ms)


class Fault:
    """One fault switched on; a context manager that switches it off again on exit."""

    def __init__(self, link: Link, cleared: dict[str, Any]) -> None:
        self.link = link
        self._cleared = cleared

    def clear(self) -> None:
        """Switch this fault off (the link's other faults stay)."""
        if not self.link.closed:
            self.link._set(**self._cleared)

    def __enter__(self) -> Fault:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.clear()


@dataclass(slots=True)
class _Delayer:
    proc: subprocess.Popen[bytes]
    policy: HoldPolicy


class Link:
    """A veth pair from the root namespace into `ns`, and the faults on it."""

    def __init__(self, ns: Netns, *, support: Support | None = None, seed: int = 0) -> None:
        self.ns = ns
        self.support = support or probe()
        self.seed = seed
        self.closed = False
        self.index = ns.next_link_index()
        self.host_if = f"{ns.tag}-{_b36(self.index)}h"
        self.ns_if = f"{ns.tag}-{_b36(self.index)}n"
        self._faults = _Faults()
        self._delayer: _Delayer | None = None
        self._chains = (f"TGF{self.index}IN", f"TGF{self.index}OUT")
        self._chains_made = False
        self._qdiscs = False
        """Whether this module put root qdiscs on the ends."""
        self.counts: dict[str, int] = {}
        """Packets each fault acted on, summed over this link's life (iptables counters,
        and the delayer's counts: `held`, `reordered`)."""
        try:
            with _global_lock():
                net = self._free_subnet()
                hosts = list(net.hosts())
                self.host_addr, self.ns_addr = str(hosts[0]), str(hosts[1])
                _run(
                    ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name",
                     self.ns_if, "netns", ns.name]
                )  # fmt: skip
                _run(["ip", "addr", "add", f"{self.host_addr}/30", "dev", self.host_if])
            _run(["ip", "link", "set", self.host_if, "up"])
            ns.run(["ip", "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if])
            ns.run(["ip", "link", "set", self.ns_if, "up"])
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        """The first /30 of SUBNET with no address of it in the root namespace."""
        out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
        used = set()
        for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
            a = ipaddress.IPv4Address(m.group(1))
            if a in SUBNET:
                used.add((int(a) - int(SUBNET.network_address)) // 4)
        for k in range(SUBNET.num_addresses // 4):
            if k not in used:
                return ipaddress.IPv4Network((int(SUBNET.network_address) + 4 * k, 30))
        raise NetfaultError(f"every /30 of {SUBNET} is in use")

    # ----- faults ---------------------------------------------------------------------

    def delay(self, ms: float, jitter_ms: float = 0.0) -> Fault:
        """Hold every packet `ms` ± `jitter_ms` (uniform) each way; jitter reorders."""
        self._need("delay")
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay: ms and jitter_ms must be >= 0, got {ms}, {jitter_ms}")
        return self._switch(dict(delay_ms=ms, jitter_ms=jitter_ms))

    def reorder(self, share: float, gap_ms: float = 10.0) -> Fault:
        """Hold a `share` of packets `gap_ms` longer: they arrive after later ones."""
        self._need("reorder")
        if not 0.0 <= share <= 1.0 or gap_ms <= 0:
            raise ValueError(f"reorder: share in [0, 1] and gap_ms > 0, got {share}, {gap_ms}")
        return self._switch(dict(reorder=share, gap_ms=gap_ms))

    def loss(self, p: float) -> Fault:
        """Drop each packet with probability `p`, each way."""
        self._need("loss")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"loss: p must be in [0, 1], got {p}")
        return self._switch(dict(loss=p))

    def partition(self, mode: str = "blackhole") -> Fault:
        """Cut the link: `blackhole` drops every packet (connections stall, no reset),
        `down` takes the namespace's end down (the root end loses its carrier)."""
        if mode == "blackhole":
            self._need("partition")
            return self._switch(dict(blackhole=True))
        if mode == "down":
            self._need("link-down")
            return self._switch(dict(down=True))
        raise ValueError(f"partition: mode must be 'blackhole' or 'down', got {mode!r}")

    def heal(self) -> None:
        """Every fault off."""
        self._set(**{f: getattr(_Faults(), f) for f in _Faults.__dataclass_fields__})

    @property
    def faults(self) -> dict[str, Any]:
        """What is on the link now (zeros and False: nothing)."""
        f = self._faults
        return {k: getattr(f, k) for k in _Faults.__dataclass_fields__}

    def _need(self, kind: str) -> None:
        problem = self.support.missing(kind)
        if problem is not None:
            raise NetfaultError(f"{kind} is not available here: {problem}")

    def _switch(self, on: dict[str, Any]) -> Fault:
        off = {k: getattr(_Faults(), k) for k in on}
        self._set(**on)
        return Fault(self, off)

    def _set(self, **changes: Any) -> None:
        if self.closed:
            raise NetfaultError(f"link {self.host_if} is closed")
        new = replace(self._faults, **changes)
        _ = new.hold  # a hold the delayer would refuse fails here, before anything changes
        old, self._faults = self._faults, new
        if new.down != old.down:
            self.ns.run(["ip", "link", "set", self.ns_if, "down" if new.down else "up"])
        self._apply_qdiscs(new)
        if self.support.iptables is not None:
            self._apply_filters(self.support.iptables, new)

    def _apply_qdiscs(self, f: _Faults) -> None:
        """Both ends' root qdiscs from `f`: netem when the kernel has it; without iptables a
        blackhole is a FIFO that takes nothing."""
        args: list[str] = []
        if f.blackhole and self.support.iptables is None:
            args = ["pfifo", "limit", "0"]
        elif self.support.netem:
            if f.reorder:
                # netem's reorder: the share 1-p goes at once, the rest after `delay`.
                args += ["delay", f"{f.delay_ms + f.gap_ms}ms", "reorder",
                         f"{100 * (1 - f.reorder)}%"]  # fmt: skip
            elif f.delay_ms or f.jitter_ms:
                args += ["delay", f"{f.delay_ms}ms", f"{f.jitter_ms}ms"]
            if f.loss:
                args += ["loss", f"{100 * f.loss}%"]
            if args:
                args = ["netem", *args]
        if not args and not self._qdiscs:
            return
        # Deleted and added anew, not changed in place: the old one's drops are counted
        # first, and a new one starts its count at zero.
        self._add_counts({"qdisc_dropped": self._qdisc_drops()})
        for run, dev in self._ends():
            if self._qdiscs:
                run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if args:
                run(["tc", "qdisc", "add", "dev", dev, "root", *args])
        self._qdiscs = bool(args)

    def _ends(self) -> tuple[tuple[Callable[..., subprocess.CompletedProcess[str]], str], ...]:
        """How to run a command for each end of the pair, and its interface name."""
        return ((_run, self.host_if), (self.ns.run, self.ns_if))

    def _qdisc_drops(self) -> int:
        """Packets the ends' root qdiscs (netem, or a blackhole FIFO) dropped so far."""
        if not self._qdiscs:
            return 0
        total = 0
        for run, dev in self._ends():
            out = run(["tc", "-s", "qdisc", "show", "dev", dev], check=False).stdout
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
        return total

    def _apply_filters(self, ipt: str, f: _Faults) -> None:
        """The namespace's iptables chains for this link, rebuilt from `f`; the delayer
        started, restarted or stopped to match."""
        hold = None if self.support.netem else f.hold
        self._ensure_chains(ipt)
        self._add_counts(self._filter_counts(ipt))  # the chains are flushed next
        for chain in self._chains:
            self.ns.run([ipt, "-w", "5", "-F", chain])
        if self._delayer is not None and (hold is None or hold != self._delayer.policy):
            self._stop_delayer()
        rules: list[list[str]] = []
        if f.blackhole:
            rules.append(["-m", "comment", "--comment", "tgf:partition", "-j", "DROP"])
        if f.loss and not self.support.netem:
            rules.append(
                ["-m", "statistic", "--mode", "random", "--probability", f"{f.loss:.6f}",
                 "-m", "comment", "--comment", "tgf:loss", "-j", "DROP"]
            )  # fmt: skip
        if hold is not None:
            rules.append(
                ["-m", "comment", "--comment", "tgf:queued", "-j", "NFQUEUE",
                 "--queue-num", str(self.index), "--queue-bypass"]
            )  # fmt: skip
        for chain in self._chains:
            for rule in rules:
                self.ns.run([ipt, "-w", "5", "-A", chain, *rule])
        if hold is not None and self._delayer is None:
            self._start_delayer(hold)

    def _ensure_chains(self, ipt: str) -> None:
        if self._chains_made:
            return
        cin, cout = self._chains
        for chain in self._chains:
            self.ns.run([ipt, "-w", "5", "-N", chain])
        self.ns.run([ipt, "-w", "5", "-A", "INPUT", "-i", self.ns_if, "-j", cin])
        self.ns.run([ipt, "-w", "5", "-A", "OUTPUT", "-o", self.ns_if, "-j", cout])
        self._chains_made = True

    def _filter_counts(self, ipt: str) -> dict[str, int]:
        """Packets each rule of the link's chains acted on, by fault (tgf:<fault>)."""
        out: dict[str, int] = {}
        for chain in self._chains:
            listing = self.ns.run([ipt, "-w", "5", "-L", chain, "-v", "-x", "-n"], check=False)
            for line in listing.stdout.splitlines():
                m = re.search(r"tgf:(\w+)", line)
                if m and line.split()[0].isdigit():
                    out[m.group(1)] = out.get(m.group(1), 0) + int(line.split()[0])
        return out

    def _add_counts(self, more: dict[str, int]) -> None:
        for k, v in more.items():
            if v:
                self.counts[k] = self.counts.get(k, 0) + v

    def _start_delayer(self, hold: HoldPolicy) -> None:
        argv = [
            sys.executable, "-m", "loadtests.nfqueue", "--queue", str(self.index),
            "--delay-ms", str(hold.delay_ms), "--jitter-ms", str(hold.jitter_ms),
            "--reorder", str(hold.reorder), "--gap-ms", str(hold.gap_ms),
            "--seed", str(self.seed),
        ]  # fmt: skip
        proc = subprocess.Popen(self.ns.exec_argv(argv), cwd=REPO_ROOT, stdout=subprocess.PIPE)
        line = _read_line(proc, 15.0)
        if line is None or not line.get("ready"):
            proc.kill()
            proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
            raise NetfaultError(f"the NFQUEUE delayer did not start (exit {proc.returncode})")
        self._delayer = _Delayer(proc, hold)

    def _stop_delayer(self) -> None:
        d, self._delayer = self._delayer, None
        if d is None:
            return
        proc = d.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stats = _read_line(proc, 5.0)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        if stats:
            self._add_counts(
                {"held": int(stats.get("packets", 0)), "reordered": int(stats.get("reordered", 0))}
            )

    def counters(self) -> dict[str, int]:
        """`counts` with the live iptables and qdisc counters added (the delayer's come when
        it stops: at heal, or when its fault changes)."""
        out = dict(self.counts)
        if self.closed:
            return out
        live = {"qdisc_dropped": self._qdisc_drops()}
        ipt = self.support.iptables
        if ipt is not None and self._chains_made:
            live.update(self._filter_counts(ipt))
        for k, v in live.items():
            if v:
                out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        """Stop the delayer and delete the pair (the namespace stays)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(NetfaultError, OSError):
            self._stop_delayer()
        _run(["ip", "link", "del", self.host_if], check=False)

    def __enter__(self) -> Link:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any] | None:
    """The next JSON line a child prints, or None (timeout, exit, not JSON)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while time.monotonic() < deadline and b"\n" not in buf:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    finally:
        sel.close()
    try:
        got = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


# ----- what this machine supports --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Support:
    """What this kernel and userland can build; each `*_problem` is None when it works."""

    netns_problem: str | None
    """Namespaces and veth pairs (root, iproute2, the kernel's veth)."""
    iptables: str | None = None
    """The iptables command that works inside a namespace (None: none does)."""
    iptables_problem: str | None = "not probed"
    netem: bool = False
    netem_problem: str | None = "not probed"
    nfqueue_problem: str | None = "not probed"
    """NFQUEUE target plus this process's netlink delayer (loadtests.nfqueue)."""
    details: dict[str, str] = field(default_factory=dict)

    def missing(self, kind: str) -> str | None:
        """Why fault `kind` cannot be made here, or None when it can."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        if self.netns_problem is not None:
            return self.netns_problem
        if kind in ("delay", "reorder"):
            if self.netem:
                return None
            if self.nfqueue_problem is None:
                return None
            return f"no netem ({self.netem_problem}) and no NFQUEUE ({self.nfqueue_problem})"
        if kind == "loss":
            if self.netem or self.iptables is not None:
                return None
            return f"no netem ({self.netem_problem}) and no iptables ({self.iptables_problem})"
        return None  # partition: iptables or pfifo limit 0; link-down: ip link

    def mechanism(self, kind: str) -> str | None:
        """How fault `kind` is made here (None: it cannot be)."""
        if self.missing(kind) is not None:
            return None
        if kind in ("delay", "reorder"):
            return "netem" if self.netem else "NFQUEUE + loadtests.nfqueue"
        if kind == "loss":
            return "netem loss" if self.netem else f"{self.iptables} -m statistic DROP"
        if kind == "partition":
            return f"{self.iptables} DROP" if self.iptables else "tc pfifo limit 0"
        return "ip link set down"

    def to_json(self) -> dict[str, Any]:
        return {
            "faults": {k: self.mechanism(k) or f"missing: {self.missing(k)}" for k in FAULT_KINDS},
            "netns": self.netns_problem or "ok",
            "iptables": self.iptables or f"missing: {self.iptables_problem}",
            "netem": "ok" if self.netem else f"missing: {self.netem_problem}",
            "nfqueue": self.nfqueue_problem or "ok",
        }


@functools.cache
def probe() -> Support:
    """What this machine supports, tried for real in a scratch namespace (once a process)."""
    return _probe()


def _probe() -> Support:
    if os.geteuid() != 0:
        return Support("not root: network namespaces and veth pairs need CAP_NET_ADMIN")
    if not shutil.which("ip"):
        return Support("no `ip` command (Debian package iproute2)")
    try:
        ns = Netns()
    except NetfaultError as exc:
        return Support(f"cannot create a network namespace: {exc}")
    try:
        try:
            link = Link(ns, support=Support(None, iptables_problem=None))
        except NetfaultError as exc:
            return Support(f"cannot create a veth pair: {exc}")
        dev = link.ns_if
        netem_problem: str | None = None
        if not shutil.which("tc"):
            netem_problem = "no `tc` command (iproute2)"
        else:
            done = ns.run(["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms"],
                          check=False)  # fmt: skip
            if done.returncode != 0:
                netem_problem = f"kernel: {done.stderr.strip()}"
            ns.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)
        iptables, ipt_problem = None, "no iptables command (Debian package iptables)"
        for cand in ("iptables", "iptables-legacy"):
            if not shutil.which(cand):
                continue
            rule = ["-o", dev, "-m", "statistic", "--mode", "random", "--probability", "0.5",
                    "-m", "comment", "--comment", "tgf:probe", "-j", "DROP"]  # fmt: skip
            done = ns.run([cand, "-w", "5", "-A", "OUTPUT", *rule], check=False)
            if done.returncode == 0:
                iptables, ipt_problem = cand, None
                break
            ipt_problem = f"{cand}: {done.stderr.strip()}"
        nfq_problem: str | None = None
        if iptables is None:
            nfq_problem = f"needs iptables ({ipt_problem})"
        else:
            queue = ["-o", dev, "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"]
            done = ns.run([iptables, "-w", "5", "-A", "OUTPUT", *queue], check=False)
            if done.returncode != 0:
                nfq_problem = f"NFQUEUE target: {done.stderr.strip()}"
            else:
                check = [sys.executable, "-m", "loadtests.nfqueue", "--check"]
                done = _run(ns.exec_argv(check), check=False)
                if done.returncode != 0:
                    nfq_problem = f"nfnetlink_queue: {done.stderr.strip()}"
        link.close()
        return Support(
            None,
            iptables=iptables,
            iptables_problem=ipt_problem,
            netem=netem_problem is None,
            netem_problem=netem_problem,
            nfqueue_problem=nfq_problem,
        )
    finally:
        ns.close()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: which fault kinds this machine supports, and how each is made."""
    ap = argparse.ArgumentParser(
        prog="python -m loadtests.netfaults",
        description="Print which network fault kinds this kernel and userland support.",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ap.add_argument(
        "--cleanup", action="store_true", help="only delete namespaces left by dead processes"
    )
    args = ap.parse_args(argv)
    if args.cleanup:
        removed = cleanup_stale()
        print(f"removed {len(removed)} stale namespace(s){': ' if removed else ''}"
              f"{', '.join(removed)}")  # fmt: skip
        return 0
    s = probe()
    if args.json:
        print(json.dumps(s.to_json(), indent=2))
    else:
        for kind in FAULT_KINDS:
            how = s.mechanism(kind)
            print(f"{kind:<10} {'yes' if how else 'no ':<4} {how or s.missing(kind)}")
        for name, value in list(s.to_json().items())[1:]:
            print(f"{name:<10} {value}")
    return 0 if s.netns_problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
