"""A loopback port for a process that binds it a moment later.

`bind(("127.0.0.1", 0))` returns a port from the kernel's ephemeral range, the very range
every other `bind(0)` and every outgoing connection draws from: in the time between
closing the probe socket and the child binding the port, another process (a test's
server announcing port 0, a client's connection) can take it, and the child fails with
"address already in use". So the port is drawn at random from below the ephemeral range,
where the kernel never hands ports out by itself, and checked free by binding it; only
two callers drawing the same port in that moment collide.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOW = 20_000
_EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1", *, tries: int = 50) -> int:
    """A TCP port on `host` that was free a moment ago, outside the ephemeral range."""
    high = _ephemeral_start() - 1
    rng = random.SystemRandom()
    if high > _LOW:
        for _ in range(tries):
            port = rng.randint(_LOW, high)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's pick
        s.bind((host, 0))
        return int(s.getsockname()[1])
