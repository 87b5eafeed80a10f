"""Start task servers as real processes for benchmarks (loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence

from taskserver.spawn import taskserver_argv


class ServerProcs:
    """N task server processes on free loopback ports; an async context manager."""

    def __init__(self, n: int, extra_args: Sequence[str] = (), prefix: str = "ts") -> None:
        self.n = n
        self.extra_args = list(extra_args)
        self.prefix = prefix
        self.procs: list[asyncio.subprocess.Process] = []
        self.addresses: dict[str, str] = {}

    async def __aenter__(self) -> ServerProcs:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for i in range(self.n):
            sid = f"{self.prefix}-{i + 1}"
            p = await asyncio.create_subprocess_exec(
                *taskserver_argv(sid, extra_args=self.extra_args),
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            self.procs.append(p)
        for p in self.procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), 20)
            info = json.loads(line)
            self.addresses[info["server_id"]] = info["address"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), 5)
            except TimeoutError:
                p.kill()
                await p.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
