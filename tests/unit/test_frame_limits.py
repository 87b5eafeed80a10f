"""The largest Thrift frame a port takes: configurable on every port, a few MiB by default,
refused at the length prefix without allocating what it claims, and never exceeded by our
own senders (a burst of tasks or results goes in ~1 MiB frames)."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from deploy.cli import main
from edge_agent.agent import task_server_config
from edge_agent.config import AgentConfig, AgentConfigError, load_agent_config
from taskserver.config import TaskServerConfig
from taskserver.framecheck import DEFAULT_MAX_FRAME_BYTES, WireLimits
from taskserver.server import build_service
from taskserver.wire import (
    MAX_BATCH_BYTES,
    Batcher,
    ProtocolViolation,
    ThriftConnection,
    decode_message,
    server_body_types,
    thrift,
)

MIB = 1024 * 1024


def test_task_servers_and_edge_agents_take_frames_of_8_mib_by_default() -> None:
    assert DEFAULT_MAX_FRAME_BYTES == 8 * MIB
    assert TaskServerConfig().max_frame_bytes == 8 * MIB
    agent = AgentConfig()
    assert agent.max_frame_bytes == 8 * MIB
    assert task_server_config(agent).max_frame_bytes == 8 * MIB
    narrow = AgentConfig(max_frame_bytes=64 * 1024)
    assert task_server_config(narrow).max_frame_bytes == 64 * 1024
    svc = build_service(task_server_config(narrow))
    assert svc.limits.max_frame_bytes == 64 * 1024


def test_an_edge_agents_frame_limit_is_an_option_checked_like_the_task_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"id": "pi-1", "cluster": "lab", "max_frame_bytes": 2 * MIB}
    assert load_agent_config(args, {}).max_frame_bytes == 2 * MIB
    for bad in (0, 1023, 2**30 + 1):
        with pytest.raises(AgentConfigError) as err:
            load_agent_config({**args, "max_frame_bytes": bad}, {})
        assert err.value.option == "--max-frame-bytes"
        assert str(err.value) == f"--max-frame-bytes: must be 1024..2**30, got {bad}"
    with pytest.raises(ValueError, match=r"max_frame_bytes: must be 1024\.\.2\*\*30, got 10"):
        TaskServerConfig(max_frame_bytes=10)
    monkeypatch.chdir(tmp_path)
    argv = ["edge-agent", "run", "--id", "pi-1", "--cluster", "lab", "--max-frame-bytes", "12"]
    assert main(argv) == 2
    assert "--max-frame-bytes: must be 1024..2**30, got 12" in capsys.readouterr().err


def _task(i: int, payload_bytes: int) -> Any:
    return thrift().Task(f"q{i}", i, 50.0, 500.0, 0, "A", b"x" * payload_bytes)


def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from("!i", data, pos)
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def test_a_burst_of_tasks_goes_in_frames_a_server_takes() -> None:
    """A pipeline stage handing on 40 images of 600 KB at once once built one 24 MB frame,
    which a server with a few MiB of max_frame_bytes refuses, losing every task on the
    connection."""
    limits = WireLimits.for_frames_of(DEFAULT_MAX_FRAME_BYTES)
    for count, size, per_frame in ((40, 600_000, 1), (100, 100_000, 10)):
        tasks = [_task(i, size) for i in range(count)]
        frames = _frames(Batcher.submit().encode(tasks))
        assert len(frames) == count // per_frame
        got = []
        for frame in frames:
            assert len(frame) <= MAX_BATCH_BYTES
            name, _, _, body = decode_message(frame, server_body_types(), limits)
            got += [body.task] if name == "submit" else body.tasks
        assert [t.query_id for t in got] == [t.query_id for t in tasks]  # all, in order
    # A small burst is still one frame, and one task alone is a plain submit.
    assert len(_frames(Batcher.submit().encode([_task(i, 100) for i in range(500)]))) == 1
    (one,) = _frames(Batcher.submit().encode([_task(0, 2 * MAX_BATCH_BYTES)]))
    assert decode_message(one, server_body_types())[0] == "submit"


def _connection(max_frame_bytes: int) -> tuple[ThriftConnection, list[ProtocolViolation]]:
    refused: list[ProtocolViolation] = []
    conn = ThriftConnection(
        server_body_types(),
        lambda *a: None,
        limits=WireLimits.for_frames_of(max_frame_bytes),
        on_violation=lambda v, peer: refused.append(v),
    )
    return conn, refused


def test_a_frame_over_the_limit_is_refused_at_its_length_prefix() -> None:
    for claimed in (8 * MIB + 1, 2**31 - 1, 0, -1, -(2**31)):
        conn, refused = _connection(8 * MIB)
        conn.data_received(struct.pack("!i", claimed))
        assert [v.reason for v in refused] == ["frame_length"], claimed
        assert refused[0].detail == f"{claimed} bytes (1..{8 * MIB} allowed)"


def test_a_frame_within_the_limit_holds_what_arrived_not_what_it_claims() -> None:
    """500 connections each claiming an 8 MiB frame (4 GiB in all) and sending 100 bytes of
    it: the memory held is what arrived."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        conns = []
        for _ in range(500):
            conn, refused = _connection(8 * MIB)
            conn.data_received(struct.pack("!i", 8 * MIB) + b"\x80" * 100)
            assert refused == []
            conns.append(conn)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 4 * MIB, f"{grown} bytes held for 500 truncated frames"
