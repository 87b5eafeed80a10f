"""loadtests.ports: a port to hand to a child process, outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from loadtests import ports


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_start()
    seen = {ports.free_port() for _ in range(20)}
    assert all(ports._LOW <= p < low for p in seen)
    assert len(seen) > 1  # drawn at random, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", seen.pop()))  # free a moment later


def test_a_taken_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    other = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, taken, other])
        monkeypatch.setattr(ports.random.SystemRandom, "randint", lambda self, a, b: next(picks))
        assert ports.free_port() == other
