"""How often the gateway asks its servers for word (`gateway.pacing`): the periods, and
the registration answer that spaces refreshes out (tests/integration/test_heartbeat_pacing
runs links against a real server)."""

from __future__ import annotations

import json

import pytest

from gateway.config import GatewayConfig
from gateway.links import ServerLink
from gateway.pacing import (
    HEARTBEATS_PER_S,
    REFRESHES_PER_S,
    heartbeat_period_s,
    refresh_period_s,
)
from gateway.requests import RegisterRequest
from gateway.service import GatewayService
from taskserver.lifecycle import MAX_REFRESH_S, asked_refresh_s


def test_periods_are_the_configured_ones_until_many_servers_share_the_budget() -> None:
    assert heartbeat_period_s(1.0, 10) == 1.0
    assert heartbeat_period_s(1.0, int(HEARTBEATS_PER_S)) == 1.0
    assert heartbeat_period_s(1.0, 10_000) == 10_000 / HEARTBEATS_PER_S
    assert refresh_period_s(50) == 50 / REFRESHES_PER_S  # 5 s: the servers' own interval
    assert refresh_period_s(10_000) == 1000.0
    assert heartbeat_period_s(1.0, 10_000) == 200.0


@pytest.mark.parametrize(
    ("answer", "asked"),
    [
        ('{"id": "s1", "refresh_s": 25.5}', 25.5),
        ('{"id": "s1"}', 0.0),
        ('{"refresh_s": -3}', 0.0),
        ('{"refresh_s": 1e9}', MAX_REFRESH_S),
        ('{"refresh_s": 1' + "0" * 400 + "}", MAX_REFRESH_S),
        ('{"refresh_s": "soon"}', 0.0),
        ('{"refresh_s": true}', 0.0),
        ('{"refresh_s": NaN}', 0.0),
        ("[1, 2]", 0.0),
        ("not json", 0.0),
    ],
)
def test_a_registration_answer_asks_for_a_bounded_refresh_wait(answer: str, asked: float) -> None:
    assert asked_refresh_s(answer) == asked


class _Link(ServerLink):
    """A real ServerLink that connects nowhere: up at once (nothing is sent on it)."""

    def start(self) -> None:
        self._up.set()


async def test_the_registration_answer_asks_for_rarer_refreshes_with_more_servers() -> None:
    svc = GatewayService(GatewayConfig(storage_url=""), link_factory=_Link)
    views = []
    for i in range(150):
        _, view = await svc.register(RegisterRequest(f"s{i}", "default", f"127.0.0.1:{i + 1}", 1))
        views.append(view)
    assert views[0]["refresh_s"] == 1 / REFRESHES_PER_S
    assert views[-1]["refresh_s"] == 150 / REFRESHES_PER_S
    _, again = await svc.register(RegisterRequest("s0", "default", "127.0.0.1:1", 1))
    assert again["refresh_s"] == 150 / REFRESHES_PER_S
    json.dumps(again)  # the answer is JSON as it is
