"""Gateway replicas agree on the global request rate (Swayam §4.2): the table each side keeps,
what a task server lists in its status reply, the wire's bounds, and the autoscaler's sum."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import thriftpy2

from gateway.autoscaling import FRONTEND_HORIZON_TIMEOUTS, AutoscalerLoop
from gateway.config import AutoscalingConfig, GatewayConfig
from gateway.links import ServerLink
from taskserver.executors import EmulatedExecutor
from taskserver.framecheck import WireLimits, check_frame, check_frame_py
from taskserver.frontends import (
    MAX_FRONTENDS,
    FrontendRates,
    load_problem,
    reported_loads,
)
from taskserver.queues import create_task_queue
from taskserver.server import TaskService
from taskserver.service_time import ServiceSpec, make_distribution
from taskserver.wire import (
    CALL,
    IDL_PATH,
    REPLY,
    ProtocolViolation,
    decode_message,
    encode_message,
    gateway_body_types,
    server_body_types,
    thrift,
)

# -- the table -----------------------------------------------------------------------


def test_the_global_rate_is_the_own_rate_plus_the_others_latest() -> None:
    rates = FrontendRates(horizon_s=10.0)
    rates.heard("gw-b", 30.0, now=1.0)
    rates.heard("gw-c", 5.0, now=2.0)
    rates.heard("gw-b", 40.0, now=3.0)  # the latest of a gateway replaces its earlier rate
    assert rates.global_rate("gw-a", 20.0, now=4.0) == 65.0
    assert rates.frontends(4.0, "gw-a") == 3
    assert rates.ids(4.0, "gw-a") == ["gw-a", "gw-b", "gw-c"]


def test_the_own_entry_echoed_back_is_not_counted_twice() -> None:
    rates = FrontendRates(horizon_s=10.0)
    rates.merge([("gw-a", 18.0), ("gw-b", 30.0)], heard_s=1.0)  # a server lists us too
    assert rates.global_rate("gw-a", 20.0, now=1.5) == 50.0  # our own rate now, not 18
    assert rates.frontends(1.5, "gw-a") == 2
    # Alone: n_F = 1 and λ = λ_i, whether or not the servers have echoed us yet.
    alone = FrontendRates(horizon_s=10.0)
    assert (alone.global_rate("gw-a", 7.0, 0.0), alone.frontends(0.0, "gw-a")) == (7.0, 1)
    alone.heard("gw-a", 6.0, now=0.0)
    assert (alone.global_rate("gw-a", 7.0, 0.5), alone.frontends(0.5, "gw-a")) == (7.0, 1)


def test_a_gateway_unheard_for_the_horizon_is_forgotten() -> None:
    rates = FrontendRates(horizon_s=3.0)
    rates.heard("gw-b", 30.0, now=10.0)
    assert rates.rates(12.999) == {"gw-b": 30.0}
    assert rates.rates(13.0) == {}  # heard at t, it counts while now < t + horizon
    assert rates.global_rate("gw-a", 20.0, now=13.0) == 20.0
    assert rates.frontends(13.0, "gw-a") == 1


def test_an_older_report_does_not_replace_a_newer_one() -> None:
    rates = FrontendRates(horizon_s=10.0)
    rates.heard("gw-b", 30.0, now=5.0)
    rates.heard("gw-b", 99.0, now=4.0)  # another server's reply, from before
    assert rates.rates(5.0) == {"gw-b": 30.0}
    rates.forget("gw-b")
    assert rates.rates(5.0) == {}


def test_the_table_is_bounded_and_a_new_gateway_waits_for_a_stale_one_to_go() -> None:
    rates = FrontendRates(horizon_s=10.0, max_frontends=3)
    for i in range(3):
        assert rates.heard(f"gw-{i}", 1.0, now=float(i))
    assert not rates.heard("gw-new", 1.0, now=5.0)  # full of live gateways: refused
    assert rates.heard("gw-1", 2.0, now=5.0)  # a known one still refreshes
    assert len(rates) == 3 and rates.refused == 1
    assert rates.heard("gw-new", 1.0, now=10.0)  # gw-0 (heard at 0) has expired
    assert sorted(rates.rates(10.0)) == ["gw-1", "gw-2", "gw-new"]
    assert FrontendRates(horizon_s=1.0).max_frontends == MAX_FRONTENDS == 64


@pytest.mark.parametrize(
    ("gateway_id", "rate"),
    [("", 1.0), ("g" * 257, 1.0), (b"gw", 1.0), (None, 1.0), ("gw", -1.0), ("gw", math.nan),
     ("gw", math.inf), ("gw", None), ("gw", 2e9)],
)  # fmt: skip
def test_a_bad_report_is_refused_by_name(gateway_id: Any, rate: Any) -> None:
    assert load_problem(gateway_id, rate) is not None
    with pytest.raises(ValueError, match=r"gateway_id|rate_per_s"):
        FrontendRates(horizon_s=1.0).heard(gateway_id, rate, now=0.0)


@pytest.mark.parametrize("kwargs", [{"horizon_s": 0.0}, {"horizon_s": math.inf},
                                    {"horizon_s": 1.0, "max_frontends": 0},
                                    {"horizon_s": 1.0, "max_frontends": True}])  # fmt: skip
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"horizon_s|max_frontends"):
        FrontendRates(**kwargs)


def test_a_reply_is_read_up_to_the_bound_and_bad_entries_are_skipped() -> None:
    t = thrift()
    many = [t.FrontendLoad(f"gw-{i}", float(i)) for i in range(1000)]
    got = reported_loads(many)
    assert len(got) == MAX_FRONTENDS and got[:2] == [("gw-0", 0.0), ("gw-1", 1.0)]
    mixed = [t.FrontendLoad("gw-a", 1.0), t.FrontendLoad(None, 2.0), t.FrontendLoad("gw-b")]
    assert reported_loads(mixed) == [("gw-a", 1.0)]
    assert reported_loads(None) == [] and reported_loads("gw") == []


# -- the task server -----------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Transport:
    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 4242) if name == "peername" else None

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


def _service(clock: _Clock, horizon_s: float = 9.0) -> TaskService:
    dist = make_distribution(ServiceSpec(kind="constant", value_ms=1.0))
    return TaskService(
        "ts-1",
        create_task_queue("fifo"),
        EmulatedExecutor(dist),
        clock=clock,
        frontend_horizon_s=horizon_s,
    )


def _load(gateway_id: str, rate: float) -> Any:
    return thrift().FrontendLoad(gateway_id, rate)


def _listed(st: Any) -> dict[str, float] | None:
    return None if st.frontends is None else {f.gateway_id: f.rate_per_s for f in st.frontends}


def test_a_status_reply_lists_every_gateway_heard_within_the_horizon() -> None:
    clock = _Clock()
    svc = _service(clock, horizon_s=9.0)
    a, b, probe = (svc.protocol_factory() for _ in range(3))
    assert svc.status(probe).frontends is None  # nobody reported: the field stays absent
    svc.status(a, None, _load("gw-a", 20.0))
    clock.t = 1.0
    st = svc.status(b, None, _load("gw-b", 40.0))
    assert _listed(st) == {"gw-a": 20.0, "gw-b": 40.0}  # the caller's own included
    clock.t = 9.5  # gw-a last reported at 0: past the horizon
    assert _listed(svc.status(probe)) == {"gw-b": 40.0}
    svc.status(a, None, _load("gw-a", 25.0))
    assert _listed(svc.status(probe)) == {"gw-a": 25.0, "gw-b": 40.0}


def test_a_bad_report_is_ignored_and_a_connection_reports_one_gateway() -> None:
    clock = _Clock()
    svc = _service(clock)
    a = svc.protocol_factory()
    st = svc.status(a, None, _load("gw-a", math.nan))
    assert st.frontends is None and st.server_id == "ts-1"  # answered all the same
    svc.status(a, None, _load("gw-a", 1.0))
    st = svc.status(a, None, _load("gw-x", 2.0))  # the same socket, another id
    assert _listed(st) == {"gw-x": 2.0}


def test_a_gateway_whose_last_connection_closes_is_forgotten() -> None:
    svc = _service(_Clock())
    a1, a2, b = (svc.protocol_factory() for _ in range(3))
    for conn in (a1, a2, b):
        conn.connection_made(_Transport())  # type: ignore[arg-type]
    svc.status(a1, None, _load("gw-a", 10.0))
    svc.status(a2, None, _load("gw-a", 10.0))
    svc.status(b, None, _load("gw-b", 5.0))
    a1.connection_lost(None)
    assert _listed(svc.status(b)) == {"gw-a": 10.0, "gw-b": 5.0}  # a2 still reports it
    a2.connection_lost(None)
    assert _listed(svc.status(b)) == {"gw-b": 5.0}


def test_the_server_keeps_at_most_64_gateways() -> None:
    svc = _service(_Clock())
    conns = [svc.protocol_factory() for _ in range(MAX_FRONTENDS + 5)]
    for i, conn in enumerate(conns):
        st = svc.status(conn, None, _load(f"gw-{i:03d}", 1.0))
    assert len(st.frontends) == MAX_FRONTENDS and svc.frontends.refused == 5


# -- the wire ------------------------------------------------------------------------


def _i32(v: int) -> bytes:
    return struct.pack("!i", v)


def _head(name: bytes, mtype: int) -> bytes:
    return struct.pack("!I", 0x80010000 | mtype) + _i32(len(name)) + name + _i32(7)


def _field(ttype: int, fid: int) -> bytes:
    return bytes([ttype]) + struct.pack("!h", fid)


LIMITS = WireLimits()


def _both(frame: bytes, limits: WireLimits = LIMITS) -> tuple[str, str] | None:
    verdict = check_frame_py(frame, limits)
    assert check_frame(frame, limits) == verdict
    return verdict


# A status reply (success: field 0, a ServerStatus) whose `frontends` (field 14) declares a
# list<FrontendLoad> of 2**31 - 1 entries in a frame that holds none of them.
HUGE_FRONTENDS = (
    _head(b"status", REPLY) + _field(12, 0) + _field(15, 14) + bytes([12]) + _i32(2**31 - 1)
)
# The same within the item limit, but still far beyond what the frame holds.
LONG_FRONTENDS = _head(b"status", REPLY) + _field(12, 0) + _field(15, 14) + bytes([12]) + _i32(1000)
# A status call whose `load` (field 2) names a gateway id of 10**9 bytes.
HUGE_GATEWAY_ID = _head(b"status", CALL) + _field(12, 2) + _field(11, 1) + _i32(10**9) + b"g"


@pytest.mark.parametrize(
    ("frame", "reason", "types"),
    [
        (HUGE_FRONTENDS, "container_length", gateway_body_types),
        (LONG_FRONTENDS, "container_length", gateway_body_types),
        (HUGE_GATEWAY_ID, "string_length", server_body_types),
    ],
)
def test_a_hostile_frontends_list_or_load_is_refused_before_decoding(
    frame: bytes, reason: str, types: Any
) -> None:
    verdict = _both(frame)
    assert verdict is not None and verdict[0] == reason, verdict
    with pytest.raises(ProtocolViolation) as exc:
        decode_message(frame, types())
    assert exc.value.reason == reason


def test_the_status_call_and_a_full_reply_pass_and_round_trip() -> None:
    t = thrift()
    svc = t.TaskServer
    call = encode_message("status", CALL, 3, svc.status_args(load=_load("gw-a", 12.5)))[4:]
    assert _both(call) is None
    _, _, _, args = decode_message(call, server_body_types())
    assert (args.load.gateway_id, args.load.rate_per_s, args.claim) == ("gw-a", 12.5, None)
    st = t.ServerStatus(
        "ts", "tf_edfq", 1, 0, 0, 0, 0, False,
        frontends=[_load(f"gw-{i}", float(i)) for i in range(MAX_FRONTENDS)],
    )  # fmt: skip
    reply = encode_message("status", REPLY, 3, svc.status_result(success=st))[4:]
    assert _both(reply) is None
    _, _, _, body = decode_message(reply, gateway_body_types())
    assert len(reported_loads(body.success.frontends)) == MAX_FRONTENDS


def _old_idl(tmp_path: Path) -> Any:
    """The IDL as it was before FrontendLoad: no `load` argument, no `frontends` field."""
    text = IDL_PATH.read_text()
    text = text.replace(", 2: optional FrontendLoad load", "")
    text = re.sub(r"\n\s*14: optional list<FrontendLoad> frontends,", "", text)
    assert "FrontendLoad load" not in text and "frontends," not in text
    path = tmp_path / "tailgate_old.thrift"
    path.write_text(text)
    return thriftpy2.load(str(path), module_name="tailgate_old_thrift")


def test_old_peers_keep_working(tmp_path: Path) -> None:
    old = _old_idl(tmp_path)
    new = thrift()
    # A new gateway's heartbeat reaches an old server: the load is skipped, the call stands.
    call = encode_message("status", CALL, 1, new.TaskServer.status_args(load=_load("gw", 1.0)))
    _, _, _, args = decode_message(call[4:], {("status", CALL): old.TaskServer.status_args})
    assert args.claim is None and not hasattr(args, "load")
    # An old server's reply reaches a new gateway: no frontends, so none are read.
    st = old.ServerStatus("ts", "fifo", 1, 0, 0, 0, 0, False)
    reply = encode_message("status", REPLY, 1, old.TaskServer.status_result(success=st))
    _, _, _, body = decode_message(reply[4:], gateway_body_types())
    assert body.success.frontends is None and reported_loads(body.success.frontends) == []
    # A new server's reply reaches an old gateway: the list is skipped.
    st = new.ServerStatus("ts", "fifo", 1, 0, 0, 0, 0, False, frontends=[_load("gw", 1.0)])
    reply = encode_message("status", REPLY, 1, new.TaskServer.status_result(success=st))
    _, _, _, body = decode_message(reply[4:], {("status", REPLY): old.TaskServer.status_result})
    assert body.success.server_id == "ts"


# -- the gateway ---------------------------------------------------------------------


def test_the_heartbeat_carries_the_local_rate_once_the_autoscaler_sets_it() -> None:
    link = ServerLink(
        "ts-1", "127.0.0.1", 1, pool="default", on_result=print, on_failure=print,
        gateway_id="gw-a",
    )  # fmt: skip
    assert link._status_args(None).load is None
    link.load_per_s = 12.0
    args = link._status_args(None)
    assert (args.load.gateway_id, args.load.rate_per_s, args.claim) == ("gw-a", 12.0, None)


class _Actuator:
    name = "fake"
    self_retiring = True

    async def replicas(self) -> int:
        return 1

    async def scale_to(self, replicas: int) -> int:
        return replicas


def _loop(links: dict[str, Any], clock: _Clock) -> AutoscalerLoop:
    scaling = AutoscalingConfig(policy="swayam", max_replicas=8)
    config = GatewayConfig(autoscaling=scaling)
    cdf = SimpleNamespace(quantile=lambda q: 10.0)
    service = SimpleNamespace(
        config=config,
        links=links,
        pool_members={"default": list(links)},
        book=SimpleNamespace(cdf_of=lambda server_id: cdf),
    )
    return AutoscalerLoop(service, scaling, _Actuator(), clock)  # type: ignore[arg-type]


def _link(
    pool: str = "default",
    frontends: Any = (),
    heard_s: float | None = None,
    rtt_ms: float | None = None,
) -> Any:
    return SimpleNamespace(
        pool=pool,
        gateway_id="gw-a",
        load_per_s=None,
        frontends=list(frontends),
        frontends_s=heard_s,
        rtt_ms=rtt_ms,
        one_way_ms=0.0 if rtt_ms is None else rtt_ms / 2.0,
    )


async def test_swayam_takes_d1_and_d2_from_the_pool_links_round_trips() -> None:
    clock = _Clock()
    links = {
        "ts-1": _link(rtt_ms=0.2),
        "ts-2": _link(rtt_ms=0.6),
        "ts-3": _link(rtt_ms=3.0),
        "ts-4": _link(),  # no round trip yet: not counted
        "e-1": _link(pool="edge", rtt_ms=80.0),  # another pool's link: not counted
    }
    loop = _loop(links, clock)
    policy = loop.policy
    assert (policy.send_ms, policy.reply_ms) == (0.5, 0.5)  # type: ignore[union-attr]
    assert loop.snapshot()["policy_state"]["link_delays"] == {"source": "default", "servers": 0}
    loop.tasks_offered = 10
    clock.t = 1.0
    await loop.tick()
    # The median one-way delay of the pool's three measured links: 0.6 / 2.
    assert (policy.send_ms, policy.reply_ms) == (0.3, 0.3)  # type: ignore[union-attr]
    state = loop.snapshot()["policy_state"]
    assert state["link_delays"] == {"source": "measured", "servers": 3}
    assert (state["send_ms"], state["reply_ms"]) == (0.3, 0.3)


async def test_a_configured_link_delay_is_not_replaced_by_measurement() -> None:
    clock = _Clock()
    scaling = AutoscalingConfig(policy="swayam", max_replicas=8, link_delay_ms=2.0)
    links = {"ts-1": _link(rtt_ms=0.2)}
    cdf = SimpleNamespace(quantile=lambda q: 10.0)
    service = SimpleNamespace(
        config=GatewayConfig(autoscaling=scaling),
        links=links,
        pool_members={"default": list(links)},
        book=SimpleNamespace(cdf_of=lambda server_id: cdf),
    )
    loop = AutoscalerLoop(service, scaling, _Actuator(), clock)  # type: ignore[arg-type]
    loop.tasks_offered = 10
    clock.t = 1.0
    await loop.tick()
    state = loop.snapshot()["policy_state"]
    assert (state["send_ms"], state["reply_ms"]) == (2.0, 2.0)
    assert state["link_delays"] == {"source": "configured", "servers": 0}
    with pytest.raises(ValueError, match="link_delay_ms"):
        AutoscalingConfig(policy="swayam", link_delay_ms=-1.0)


async def test_the_autoscaler_publishes_its_rate_and_feeds_the_policy_the_sum() -> None:
    clock = _Clock()
    ts1 = _link(frontends=[("gw-a", 9.0), ("gw-b", 30.0)], heard_s=0.5)
    ts2 = _link(frontends=[("gw-b", 32.0), ("gw-c", 8.0)], heard_s=0.8)
    other = _link(pool="edge", frontends=[("gw-z", 1000.0)], heard_s=0.8)
    loop = _loop({"ts-1": ts1, "ts-2": ts2, "e-1": other}, clock)
    loop.tasks_offered = 20
    clock.t = 1.0
    await loop.tick()
    assert ts1.load_per_s == ts2.load_per_s == 20.0 and other.load_per_s is None
    state = loop.snapshot()["policy_state"]
    assert state["local_rate_per_s"] == 20.0
    assert state["global_rate_per_s"] == 20.0 + 32.0 + 8.0  # gw-b's latest, ours not twice
    assert state["frontends"] == {
        "count": 3,
        "ids": ["gw-a", "gw-b", "gw-c"],
        "rates_per_s": {"gw-a": 20.0, "gw-b": 32.0, "gw-c": 8.0},
    }
    assert loop.policy.predictor.predict(1.0, 0.0) == 60.0  # type: ignore[union-attr]
    # Nobody lists gw-b and gw-c any more: after the horizon only our own rate is left.
    ts1.frontends, ts2.frontends = [("gw-a", 20.0)], [("gw-a", 20.0)]
    clock.t = 0.8 + FRONTEND_HORIZON_TIMEOUTS * loop.service.config.heartbeat_timeout_s
    ts1.frontends_s = ts2.frontends_s = clock.t
    loop.tasks_offered += 88  # 10 tasks/s over the 8.8 s since the last tick
    await loop.tick()
    state = loop.snapshot()["policy_state"]
    assert state["frontends"]["count"] == 1
    assert state["global_rate_per_s"] == pytest.approx(state["local_rate_per_s"]) == 10.0
