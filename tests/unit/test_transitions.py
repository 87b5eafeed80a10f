"""State changes are logged once per change, not once per query, tick or retry: admission
entering and leaving overload, a server going down and coming back, autoscaling actions."""

from __future__ import annotations

import logging
import random

import pytest

from admission import AdmissionConfig, AdmissionGate, QueryInfo, Rule
from gateway.autoscaling import log_scaling
from gateway.config import GatewayConfig
from gateway.errors import Unavailable
from gateway.links import ServerLink
from gateway.overload import admit


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _no_sleep(_: float) -> None:
    return None


def _gate(rule: Rule, clock: _Clock) -> AdmissionGate:
    config = AdmissionConfig(rule=rule, threshold=0.05, window_tasks=100, max_defer_ms=1.0)
    return AdmissionGate(config, GatewayConfig().classes, clock)


def _query(cls: str = "B") -> QueryInfo:
    return QueryInfo(cls, 1, 4, 300.0, 20.0)


async def _ask(gate: AdmissionGate) -> bool:
    """One query through the gateway's admission shell: admitted or not."""
    try:
        await admit(gate, _query(), lambda: 0.0, _no_sleep)
    except Unavailable:
        return False
    return True


def _overload_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gateway.overload"]


async def test_admission_logs_entering_and_leaving_overload_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.overload")
    clock = _Clock()
    gate = _gate(Rule.REJECT_ALL, clock)
    for _ in range(20):  # a healthy window: nothing to say
        gate.note_task(False, "B")
    assert [await _ask(gate) for _ in range(5)] == [True] * 5
    assert _overload_records(caplog) == []
    for _ in range(30):
        gate.note_task(True, "B")  # misses: the ratio climbs past 5%
    clock.now = 10.0
    answers = [await _ask(gate) for _ in range(50)]
    assert not any(answers)  # fifty rejections...
    (began,) = _overload_records(caplog)  # ...and one line
    assert began.levelno == logging.WARNING
    assert began.getMessage().startswith("admission: overload began (rule reject-all, ")
    assert "threshold 5.00%" in began.getMessage()
    assert (began.__dict__["class"], began.__dict__["outcome"]) == ("B", "overload")
    for _ in range(100):
        gate.note_task(False, "B")  # the window fills with met deadlines again
    clock.now = 25.5
    assert [await _ask(gate) for _ in range(50)] == [True] * 50
    (_, ended) = _overload_records(caplog)
    assert ended.levelno == logging.INFO
    assert ended.getMessage().startswith("admission: overload ended after 15.5 s (rule reject-all)")
    assert ended.__dict__["outcome"] == "admitting"


async def test_a_deferring_rule_logs_its_overload_once_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.overload")
    clock = _Clock()
    gate = _gate(Rule.COST_LADDER, clock)
    for _ in range(60):
        gate.note_task(True, "B")
    for _ in range(30):
        await _ask(gate)
    records = _overload_records(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "cost-ladder" in records[0].getMessage()


def _link(clock: _Clock) -> ServerLink:
    class _Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    return ServerLink(
        "ts-1",
        "127.0.0.1",
        9,
        pool="default",
        on_result=lambda *a: None,
        on_failure=lambda *a: None,
        clock=clock,
        rng=_Top(0),
    )


def test_a_server_going_down_and_coming_back_is_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.links")
    clock = _Clock()
    link = _link(clock)
    link._came_up(0.0)  # the first time up: registration already said so
    assert caplog.records == []
    clock.now = 10.0
    link._on_lost(ConnectionResetError("reset by peer"))
    link._on_lost(None)  # the heartbeat notices too: still one outage
    delays = []
    t = 10.0
    while t < 69.0:  # a reconnect every half second for a minute, all refused
        link.last_error = "connect failed: [Errno 111] Connection refused"
        delays.append(link._attempt_failed(t))
        t += 0.5
    link._came_up(75.0)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "server ts-1 is down: connection lost: reset by peer"),
        (
            logging.WARNING,
            "server ts-1: connect to 127.0.0.1:9 failed: connect failed: [Errno 111] "
            "Connection refused (next try in 0.1 s)",
        ),
        (logging.INFO, "server ts-1 is back up after 65.0 s"),
    ]
    assert delays[:7] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]  # backoff, capped
    assert [r.__dict__["server_id"] for r in caplog.records] == ["ts-1"] * 3
    assert caplog.records[0].__dict__["outcome"] == "down"
    # the next outage starts its backoff over
    link._on_lost(None)
    link.last_error = "connect failed: refused"
    assert link._attempt_failed(80.0) == 0.05


def test_an_autoscaling_action_is_one_line_with_from_to_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.autoscaling")
    log_scaling("default", 2, 4, 4, "miss ratio 3.1% above 2.0%")
    log_scaling("default", 4, 1, 2, "idle servers retire")
    up, down = caplog.records
    assert up.getMessage() == (
        "autoscaler: scale up pool default from 2 to 4 servers: miss ratio 3.1% above 2.0%"
    )
    assert down.getMessage() == (
        "autoscaler: scale down pool default from 4 to 2 servers (asked for 1): idle servers retire"
    )
    assert {k: up.__dict__[k] for k in ("pool", "from", "to", "outcome")} == {
        "pool": "default",
        "from": 2,
        "to": 4,
        "outcome": "scale-up",
    }
