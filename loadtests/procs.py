"""Start task servers as real processes for benchmarks (loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Iterator, Sequence

from taskserver.spawn import taskserver_argv

# A task server's start is mostly its imports, about a second of CPU; N of them started
# together share the cores, so on a 2-core host 100 servers announce after 40-55 s.
START_S = 30.0
START_S_PER_SERVER = 1.0


class ServerProcs:
    """N task server processes on free loopback ports; an async context manager.

    The servers exit with this process (PR_SET_PDEATHSIG), and a start that fails (a server
    that exits, or the start deadline passing) stops the ones already started."""

    def __init__(self, n: int, extra_args: Sequence[str] = (), prefix: str = "ts") -> None:
        self.n = n
        self.extra_args = list(extra_args)
        self.prefix = prefix
        self.procs: list[asyncio.subprocess.Process] = []
        self.addresses: dict[str, str] = {}

    async def __aenter__(self) -> ServerProcs:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        ids = [f"{self.prefix}-{i + 1}" for i in range(self.n)]
        for sid in ids:
            p = await asyncio.create_subprocess_exec(
                *taskserver_argv(sid, exit_with_parent=True, extra_args=self.extra_args),
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            self.procs.append(p)
        limit_s = START_S + START_S_PER_SERVER * self.n
        try:
            async with asyncio.timeout(limit_s):
                for sid, p in zip(ids, self.procs, strict=True):
                    assert p.stdout is not None
                    line = await p.stdout.readline()
                    if not line:
                        code = await p.wait()
                        raise RuntimeError(f"task server {sid} exited ({code}) before it listened")
                    info = json.loads(line)
                    self.addresses[info["server_id"]] = info["address"]
        except TimeoutError:
            raise RuntimeError(
                f"{self.n - len(self.addresses)} of {self.n} task servers had not announced "
                f"their address after {limit_s:g} s"
            ) from None

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


def io_syscalls(pid: int) -> tuple[int, int]:
    """Read and write system calls a process has made so far (Linux /proc/PID/io: syscr,
    syscw). uvloop reads and writes sockets with read(2), write(2) and writev(2), which are
    counted; send/recv and sendmsg/recvmsg (asyncio's own loop, Python's socket methods)
    are not."""
    fields = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = int(value)
    return fields["syscr"], fields["syscw"]


class CpuSplit:
    """The last CPU this process may use for one child (a gateway), the others for this
    process and the children it starts after it (Linux CPU affinity; at least 2 CPUs).

    A child inherits the CPUs of the thread that starts it, so the child started inside
    `own()` runs on the last CPU alone; on leaving it, this (calling) thread keeps the
    others. `restore()` gives this thread back the CPUs it had."""

    def __init__(self) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise RuntimeError(f"a CPU of its own needs at least 2 CPUs, this process has {cpus}")
        self.before = set(cpus)
        self.own_cpus = {cpus[-1]}
        """The child's CPU."""
        self.rest = set(cpus[:-1])
        """This process's and its later children's."""

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        """Start the child inside: it runs on `own_cpus`; this thread on `rest` after."""
        os.sched_setaffinity(0, self.own_cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.rest)

    def restore(self) -> None:
        """This thread's CPUs as before."""
        os.sched_setaffinity(0, self.before)
