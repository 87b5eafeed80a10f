"""The benchmarks' fleet of task server processes (loadtests.procs.ServerProcs): a start
that fails says why and leaves no server running."""

from __future__ import annotations

import os

import pytest

import loadtests.procs as procs
from loadtests.procs import ServerProcs, io_syscalls

pytestmark = pytest.mark.integration


def _all_stopped(sp: ServerProcs) -> bool:
    return bool(sp.procs) and all(p.returncode is not None for p in sp.procs)


async def test_a_server_that_exits_before_it_listens_is_named_and_the_others_are_stopped() -> None:
    sp = ServerProcs(2, ["--no-such-flag"])
    with pytest.raises(RuntimeError, match=r"task server ts-1 exited \(2\) before it listened"):
        async with sp:
            pytest.fail("a fleet whose servers cannot start was entered")
    assert len(sp.procs) == 2
    assert _all_stopped(sp)


async def test_servers_still_starting_at_the_deadline_are_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(procs, "START_S", 0.0)
    monkeypatch.setattr(procs, "START_S_PER_SERVER", 0.001)
    sp = ServerProcs(2)
    with pytest.raises(RuntimeError, match=r"2 of 2 task servers had not announced"):
        async with sp:
            pytest.fail("a fleet was entered before its servers announced themselves")
    assert _all_stopped(sp)
    assert all(p.returncode != 0 for p in sp.procs)  # stopped, not finished


def test_io_syscalls_counts_this_process_reads_and_writes() -> None:
    r0, w0 = io_syscalls(os.getpid())
    fd_r, fd_w = os.pipe()
    try:
        for _ in range(10):
            os.write(fd_w, b"x")
            os.read(fd_r, 1)
    finally:
        os.close(fd_r)
        os.close(fd_w)
    r1, w1 = io_syscalls(os.getpid())
    assert w1 - w0 >= 10
    assert r1 - r0 >= 10
