"""A packet delayer on the kernel's NFQUEUE, spoken over raw netlink (no C library).

An iptables rule ``-j NFQUEUE --queue-num Q`` hands each matching packet to the process
bound to queue Q; the packet waits in the kernel until the process gives its verdict,
in any order it likes. This process holds every packet for a drawn time and then accepts
it, which makes a real delay on the wire: TCP sees the round trip grow, jitter reorders
segments, and a share of packets held `gap` longer arrives after later ones (what
``netem delay ... reorder ...`` does on kernels that have netem; loadtests.netfaults uses
netem where the kernel has it and this where it does not).

Run it inside the network namespace whose rules queue to it (netlink sockets belong to
the namespace that opened them)::

    ip netns exec NS python -m loadtests.nfqueue --queue 0 --delay-ms 20 --jitter-ms 5

It prints one JSON line once bound (``{"ready": true, ...}``), and on SIGTERM accepts
every packet it still holds, prints its counts as a second JSON line and exits 0. It asks
the kernel to fail open: a packet the queue cannot take (full, or this process gone) is
accepted, never silently lost, so a delay never turns into a partition by accident.

The message layout is the kernel's ``include/uapi/linux/netfilter/nfnetlink_queue.h``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["Delayer", "HoldPolicy", "QueueSocket", "main"]

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NF_ACCEPT = 1
NLA_TYPE_MASK = 0x3FFF
QUEUE_MAXLEN = 16384
"""Packets the kernel holds for this queue at most (beyond: accepted, fail-open)."""
RCVBUF_BYTES = 8 * 1024 * 1024
PR_SET_PDEATHSIG = 1


class NetlinkError(OSError):
    """The kernel refused a netlink request (its errno and what was asked)."""


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (_align(length) - length)


class QueueSocket:
    """A netlink socket bound to one NFQUEUE number: packet ids in, verdicts out."""

    def __init__(self, queue: int) -> None:
        if not 0 <= queue <= 65535:
            raise ValueError(f"queue: must be in 0..65535, got {queue}")
        self.queue = queue
        self._seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.bind((0, 0))
            try:  # root may exceed rmem_max; a burst must not overflow the socket
                self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF_BYTES)  # SO_RCVBUFFORCE
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            self._config(_attr(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
            self._config(
                _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
                + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN))
                + _attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN))
                + _attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN))
            )
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def _message(self, msg: int, flags: int, attrs: bytes) -> bytes:
        self._seq += 1
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.queue)) + attrs
        kind = (NFNL_SUBSYS_QUEUE << 8) | msg
        return struct.pack("=IHHII", 16 + len(body), kind, flags, self._seq, 0) + body

    def _config(self, attrs: bytes) -> None:
        """Send a config message and wait for the kernel's acknowledgement."""
        self.sock.send(self._message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, attrs))
        seq = self._seq
        while True:
            data = self.sock.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, kind, _, got_seq, _ = struct.unpack_from("=IHHII", data, off)
                if kind == NLMSG_ERROR and got_seq == seq:
                    (err,) = struct.unpack_from("=i", data, off + 16)
                    if err:
                        raise NetlinkError(
                            -err, f"NFQUEUE {self.queue}: config refused: {os.strerror(-err)}"
                        )
                    return
                off += _align(length) if length else len(data)

    def packet_ids(self) -> Iterator[int]:
        """Ids of the packets the kernel queued since the last call (never blocks)."""
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            off = 0
            while off + 16 <= len(data):
                length, kind, _, _, _ = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    pid = _packet_id(data, off + 20, off + length)
                    if pid is not None:
                        yield pid
                off += _align(length)

    def accept(self, ids: Sequence[int]) -> None:
        """Accept these packets (one datagram of verdict messages)."""
        if not ids:
            return
        msgs = b"".join(
            self._message(
                NFQNL_MSG_VERDICT,
                NLM_F_REQUEST,
                _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, i)),
            )
            for i in ids
        )
        view = memoryview(msgs)
        step = 36 * 1024  # whole messages (36 bytes each), well under the socket's limit
        for start in range(0, len(msgs), step):
            while True:
                try:
                    self.sock.send(view[start : start + step])
                    break
                except BlockingIOError:
                    select.select([], [self.sock], [], 0.05)

    def close(self) -> None:
        """Closing the socket unbinds the queue (the kernel drops what it still holds)."""
        self.sock.close()


def _packet_id(data: bytes, off: int, end: int) -> int | None:
    """The packet id in a NFQNL_MSG_PACKET's attributes (NFQA_PACKET_HDR)."""
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            return None
        if kind & NLA_TYPE_MASK == NFQA_PACKET_HDR:
            return int(struct.unpack_from(">I", data, off + 4)[0])
        off += _align(length)
    return None


@dataclass(frozen=True, slots=True)
class HoldPolicy:
    """How long each packet is held: delay ± uniform jitter, plus `gap_ms` for a share
    `reorder` of packets (those arrive after packets sent up to `gap_ms` later)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    reorder: float = 0.0
    gap_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "gap_ms"):
            v = getattr(self, name)
            if not 0.0 <= v < 60_000.0:
                raise ValueError(f"{name}: must be in [0, 60000), got {v!r}")
        if not 0.0 <= self.reorder <= 1.0:
            raise ValueError(f"reorder: must be a share in [0, 1], got {self.reorder!r}")

    def draw_s(self, rng: random.Random) -> tuple[float, bool]:
        """One packet's hold in seconds, and whether it is one of the reordered share."""
        hold = self.delay_ms
        if self.jitter_ms:
            hold += rng.uniform(-self.jitter_ms, self.jitter_ms)
        late = self.reorder > 0.0 and rng.random() < self.reorder
        if late:
            hold += self.gap_ms
        return max(hold, 0.0) / 1000.0, late


class Delayer:
    """Holds each queued packet for its drawn time, then accepts it."""

    def __init__(self, sock: QueueSocket, policy: HoldPolicy, rng: random.Random) -> None:
        self.sock = sock
        self.policy = policy
        self.rng = rng
        self.held: list[tuple[float, int, int]] = []
        """(release time, arrival order, packet id): a heap."""
        self.packets = 0
        self.reordered = 0
        self.max_held = 0
        self._order = 0
        self.stopping = False

    def run(self) -> None:
        """Serve until `stopping` is set; then accept everything still held."""
        fd = self.sock.sock
        while not self.stopping:
            now = time.monotonic()
            wait = min(self.held[0][0] - now, 0.1) if self.held else 0.1
            readable, _, _ = select.select([fd], [], [], max(wait, 0.0))
            now = time.monotonic()
            if readable:
                self._take(now)
            self._release(now)
        self.sock.accept([pid for _, _, pid in self.held])
        self.held.clear()

    def _take(self, now: float) -> None:
        ready: list[int] = []
        for pid in self.sock.packet_ids():
            self.packets += 1
            hold_s, late = self.policy.draw_s(self.rng)
            self.reordered += late
            if hold_s <= 0.0:
                ready.append(pid)
            else:
                self._order += 1
                heapq.heappush(self.held, (now + hold_s, self._order, pid))
        self.max_held = max(self.max_held, len(self.held))
        self.sock.accept(ready)

    def _release(self, now: float) -> None:
        due: list[int] = []
        while self.held and self.held[0][0] <= now:
            due.append(heapq.heappop(self.held)[2])
        self.sock.accept(due)

    def stats(self) -> dict[str, int]:
        return {"packets": self.packets, "reordered": self.reordered, "max_held": self.max_held}


def _die_with_parent() -> None:
    """SIGTERM this process when the one that started it dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: bind the queue, print readiness, hold packets until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m loadtests.nfqueue", description=__doc__)
    ap.add_argument("--queue", type=int, default=0, help="NFQUEUE number (0)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="hold per packet (0)")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="± uniform on the hold (0)")
    ap.add_argument("--reorder", type=float, default=0.0, help="share of packets held longer")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="extra hold of that share (0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (0)")
    ap.add_argument("--check", action="store_true", help="bind the queue, then exit 0")
    args = ap.parse_args(argv)
    try:
        policy = HoldPolicy(args.delay_ms, args.jitter_ms, args.reorder, args.gap_ms)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        sock = QueueSocket(args.queue)
    except (OSError, ValueError) as exc:
        print(f"nfqueue: cannot bind queue {args.queue}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        sock.close()
        print(json.dumps({"ready": True, "queue": args.queue}), flush=True)
        return 0
    delayer = Delayer(sock, policy, random.Random(args.seed))

    def stop(signum: int, frame: object) -> None:
        delayer.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _die_with_parent()
    print(json.dumps({"ready": True, "queue": args.queue}), flush=True)
    try:
        delayer.run()
    finally:
        sock.close()
    line = (json.dumps(delayer.stats()) + "\n").encode()
    with contextlib.suppress(OSError):  # whoever started it may be gone (its pipe with it)
        os.write(sys.stdout.fileno(), line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
