"""Target validation and the pick of a query's servers by pool and cluster (no sockets)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, ClassVar

import pytest

from gateway.config import GatewayConfig, PoolConfig
from gateway.errors import BadRequest, Unavailable
from gateway.links import ServerLink
from gateway.requests import parse_query, parse_register
from gateway.targets import TargetPicker

CONFIG = GatewayConfig(
    pools=(
        PoolConfig(name="default"),
        PoolConfig(name="edge", queueing="central", cdf="cluster", clusters=("gta",)),
    ),
    max_fanout=16,
)


def make_picker(
    servers: dict[str, str | None], *, pool: str = "edge", down: tuple[str, ...] = ()
) -> TargetPicker:
    """A picker over servers (id -> cluster) of one pool; all up except `down`."""
    links: dict[str, ServerLink] = {}
    picker = TargetPicker(CONFIG, links, random.Random(7))
    for sid, cluster in servers.items():
        link = ServerLink(
            sid,
            "127.0.0.1",
            1,
            pool=pool,
            cluster=cluster,
            on_result=lambda *a: None,
            on_failure=lambda *a: None,
        )
        link.state = "down" if sid in down else "up"
        links[sid] = link
        picker.join(link)
    return picker


TESTBED = {f"{c}-{i}": c for c in ("server-room", "wet-lab", "faculty") for i in (1, 2, 3)}
TESTBED["loose"] = None  # a server without a cluster label


def pick(picker: TargetPicker, targets: dict[str, Any]) -> list[str]:
    req = parse_query({"class": "A", "targets": targets}, CONFIG)
    return [lk.server_id for lk in picker.pick(req.targets)]


def clusters_of(ids: list[str]) -> Counter[str | None]:
    return Counter(TESTBED[s] for s in ids)


@pytest.mark.parametrize(
    ("targets", "field", "words"),
    [
        ({"pool": "edge", "per_cluster": 1, "fanout": 2}, "targets.per_cluster", "one of"),
        ({"pool": "edge", "per_cluster": 1, "all": True}, "targets.per_cluster", "one of"),
        ({"pool": "edge", "per_cluster": 0}, "targets.per_cluster", ">= 1"),
        ({"pool": "edge", "per_cluster": True}, "targets.per_cluster", ">= 1"),
        ({"pool": "edge", "per_cluster": 17}, "targets.per_cluster", "max_fanout 16"),
        (
            {"pool": "edge", "per_cluster": 1, "cluster": "gta"},
            "targets.per_cluster",
            "give 'cluster' with 'fanout'",
        ),
        ({"pool": "edge", "fanout": 1, "cluster": ""}, "targets.cluster", "1..64"),
        ({"pool": "edge", "fanout": 1, "cluster": "a b"}, "targets.cluster", "'a b'"),
        ({"pool": "edge", "fanout": 1, "cluster": "x" * 65}, "targets.cluster", "1..64"),
        ({"pool": "edge", "fanout": 1, "cluster": 3}, "targets.cluster", "got 3"),
        ({"pool": "edge", "all": True, "exclude_cluster": "a/b"}, "targets.exclude_cluster", "a/b"),
        (
            {"pool": "edge", "fanout": 1, "cluster": "gta", "exclude_cluster": "faculty"},
            "targets.exclude_cluster",
            "not both",
        ),
        ({"servers": ["x"], "cluster": "gta"}, "targets.servers", "not both"),
        ({"pool": "edge", "cluster": "gta"}, "targets.fanout", "'per_cluster'"),
    ],
)
def test_bad_cluster_targets_name_the_field(targets: dict, field: str, words: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_query({"class": "A", "targets": targets}, CONFIG)
    assert err.value.field == field
    assert words in err.value.message, err.value.message


def test_registration_takes_an_optional_valid_cluster() -> None:
    body = {"id": "e1", "pool": "edge", "address": "127.0.0.1:9000"}
    assert parse_register(body, CONFIG).cluster is None
    assert parse_register({**body, "cluster": "wet-lab"}, CONFIG).cluster == "wet-lab"
    for bad in ("", "wet lab", "x" * 65, 7):
        with pytest.raises(BadRequest) as err:
            parse_register({**body, "cluster": bad}, CONFIG)
        assert err.value.field == "cluster"


def test_per_cluster_takes_k_from_each_cluster_and_skips_unlabelled_servers() -> None:
    picker = make_picker(TESTBED)
    # "gta" is declared but has no server yet: per_cluster waits for it (503, not a short pick).
    with pytest.raises(Unavailable) as err:
        pick(picker, {"pool": "edge", "per_cluster": 1})
    assert err.value.code == "cluster_unavailable"
    assert err.value.extra == {"clusters_down": ["gta"]}
    assert err.value.status == 503  # gateway.app adds Retry-After to every 503
    got = pick(picker, {"pool": "edge", "per_cluster": 2, "exclude_cluster": "gta"})
    assert clusters_of(got) == {"faculty": 2, "server-room": 2, "wet-lab": 2}
    assert len(set(got)) == 6
    picker = make_picker({**TESTBED, "gta-1": "gta"})
    got = pick(picker, {"pool": "edge", "per_cluster": 1, "exclude_cluster": "wet-lab"})
    assert [picker.links[s].cluster for s in got] == ["faculty", "gta", "server-room"]


def test_cluster_narrows_fanout_and_all_and_exclude_cluster_leaves_one_out() -> None:
    picker = make_picker(TESTBED)
    for _ in range(20):
        got = pick(picker, {"pool": "edge", "fanout": 2, "cluster": "wet-lab"})
        assert clusters_of(got) == {"wet-lab": 2}
    got = pick(picker, {"pool": "edge", "all": True, "cluster": "faculty"})
    assert got == ["faculty-1", "faculty-2", "faculty-3"]
    got = pick(picker, {"pool": "edge", "all": True, "exclude_cluster": "server-room"})
    assert clusters_of(got) == {"wet-lab": 3, "faculty": 3, None: 1}
    for _ in range(20):
        (one,) = pick(picker, {"pool": "edge", "fanout": 1, "exclude_cluster": "server-room"})
        assert TESTBED[one] != "server-room"


def test_unknown_cluster_is_400_listing_the_known_ones() -> None:
    picker = make_picker(TESTBED)
    for key in ("cluster", "exclude_cluster"):
        with pytest.raises(BadRequest) as err:
            pick(picker, {"pool": "edge", "all": True, key: "basement"})
        assert err.value.field == f"targets.{key}"
        assert "known: faculty, gta, server-room, wet-lab" in err.value.message


def test_too_few_servers_in_a_cluster_is_400_naming_the_field() -> None:
    picker = make_picker(TESTBED)
    with pytest.raises(BadRequest) as err:
        pick(picker, {"pool": "edge", "fanout": 4, "cluster": "wet-lab"})
    assert err.value.field == "targets.fanout"
    assert "exceeds the 3 servers of cluster 'wet-lab'" in err.value.message
    with pytest.raises(BadRequest) as err:
        pick(picker, {"pool": "edge", "per_cluster": 4, "exclude_cluster": "gta"})
    assert err.value.field == "targets.per_cluster"
    assert "exceeds the 3 servers of cluster 'faculty'" in err.value.message
    with pytest.raises(BadRequest) as err:
        pick(picker, {"pool": "edge", "per_cluster": 6, "exclude_cluster": "gta"})
    assert "exceeds max_fanout 16" in err.value.message


def test_random_picks_prefer_live_servers_and_a_dead_cluster_is_503() -> None:
    down = ("wet-lab-1", "wet-lab-2", "faculty-1", "faculty-2", "faculty-3")
    picker = make_picker(TESTBED, down=down)
    for _ in range(20):
        got = pick(picker, {"pool": "edge", "fanout": 1, "cluster": "wet-lab"})
        assert got == ["wet-lab-3"]
    with pytest.raises(Unavailable) as err:
        pick(picker, {"pool": "edge", "fanout": 1, "cluster": "faculty"})
    assert err.value.status == 503 and err.value.code == "cluster_unavailable"
    assert "'faculty'" in err.value.message
    with pytest.raises(Unavailable) as err:
        pick(picker, {"pool": "edge", "per_cluster": 1, "exclude_cluster": "wet-lab"})
    assert err.value.extra == {"clusters_down": ["faculty", "gta"]}


def test_leaving_forgets_an_emptied_cluster_unless_declared() -> None:
    picker = make_picker({"a-1": "a", "g-1": "gta"})
    for sid in ("a-1", "g-1"):
        picker.leave(picker.links[sid])
        picker.leave(picker.links[sid])  # a second leave is a no-op
    assert picker.cluster_members["edge"] == {"gta": []}
    assert picker.pool_members["edge"] == []
    with pytest.raises(Unavailable) as err:
        pick(picker, {"pool": "edge", "per_cluster": 1})
    assert err.value.extra == {"clusters_down": ["gta"]}


def test_per_cluster_on_a_pool_without_clusters_is_503() -> None:
    picker = make_picker({"ts-1": None, "ts-2": None}, pool="default")
    with pytest.raises(Unavailable) as err:
        pick(picker, {"pool": "default", "per_cluster": 1})
    assert err.value.code == "no_servers" and "no clusters" in err.value.message


def test_a_least_wait_pool_picks_the_servers_with_the_smallest_estimated_wait() -> None:
    config = GatewayConfig(pools=(PoolConfig(name="lw", pick="least-wait"),), max_fanout=16)
    waits = {"a": (3.0, 1.0), "b": (0.0, 2.0), "c": (0.0, 1.0), "d": (1.0, 1.0), "e": (9.0, 1.0)}
    links: dict[str, ServerLink] = {}
    picker = TargetPicker(config, links, random.Random(7), lambda lk: waits[lk.server_id])
    for sid in waits:
        link = ServerLink(
            sid, "127.0.0.1", 1, pool="lw", on_result=lambda *a: None,
            on_failure=lambda *a: None,
        )  # fmt: skip
        link.state = "down" if sid == "c" else "up"
        links[sid] = link
        picker.join(link)
    q = parse_query(
        {"targets": {"pool": "lw", "fanout": 3}, "slo": {"latency_ms": 10, "percentile": 99}},
        config,
    )
    # Idle first (the faster of two idle ones first), then the shortest backlog; a server
    # that is down is left out while enough are up.
    assert [lk.server_id for lk in picker.pick(q.targets)] == ["b", "d", "a"]
    links["c"].state = "up"
    assert [lk.server_id for lk in picker.pick(q.targets)] == ["c", "b", "d"]
    with pytest.raises(ValueError, match="pick"):
        PoolConfig(name="x", pick="fastest")


def test_a_swayam_pool_routes_only_to_its_ordered_prefix() -> None:
    ids = {f"ts-{i}": None for i in (10, 2, 1, 3, 11, 4)}  # registered out of order
    picker = make_picker(ids, pool="default", down=("ts-2",))
    in_use = [3]
    picker.prefix["default"] = lambda: in_use[0]
    seen: Counter[str] = Counter()
    for _ in range(300):
        seen.update(pick(picker, {"pool": "default", "fanout": 2}))
    # Backend order is the natural order of the live ids: ts-1, ts-3, ts-4, ts-10, ts-11;
    # the prefix of 3 takes every task, and the rest go idle (passive scale-in).
    assert set(seen) == {"ts-1", "ts-3", "ts-4"}
    assert picker.prefix_view("default") == ["ts-1", "ts-3", "ts-4"]
    in_use[0] = 1  # fewer in use than the fanout: the prefix widens to k
    assert set(pick(picker, {"pool": "default", "fanout": 2})) == {"ts-1", "ts-3"}
    in_use[0] = 5
    seen.clear()
    for _ in range(300):
        seen.update(pick(picker, {"pool": "default", "fanout": 1}))
    assert set(seen) == {"ts-1", "ts-3", "ts-4", "ts-10", "ts-11"}
    # `all` still means every server of the pool.
    assert len(pick(picker, {"pool": "default", "all": True})) == 6
    assert make_picker(ids, pool="default").prefix_view("default") is None


def test_too_few_servers_taking_queries_is_503_and_too_small_a_pool_is_400() -> None:
    picker = make_picker({"a": None, "b": None, "c": None}, pool="default")
    for sid in ("b", "c"):  # draining (a rolling restart): out of the selection
        picker.leave(picker.links[sid])
    with pytest.raises(Unavailable) as unavailable:
        pick(picker, {"pool": "default", "fanout": 2})
    assert unavailable.value.code == "servers_unavailable"
    assert unavailable.value.extra == {"servers_available": 1, "servers_registered": 3}
    with pytest.raises(BadRequest, match="exceeds the 3 servers") as bad:
        pick(picker, {"pool": "default", "fanout": 4})
    assert bad.value.field == "targets.fanout"
    # No server left at all, as during a restart: still 503, not a client error.
    picker.leave(picker.links["a"])
    with pytest.raises(Unavailable, match="0 of its 3"):
        pick(picker, {"pool": "default", "fanout": 1})


def test_a_random_pick_is_uniform_over_the_live_ones_and_asks_only_the_drawn() -> None:
    servers = {f"s{i}": None for i in range(8)}
    picker = make_picker(servers, down=("s0", "s1"))
    seen: Counter[str] = Counter()
    for _ in range(3000):
        ids = pick(picker, {"pool": "edge", "fanout": 3})
        assert len(set(ids)) == 3 and not {"s0", "s1"} & set(ids)
        seen.update(ids)
    assert set(seen) == {f"s{i}" for i in range(2, 8)}
    assert max(seen.values()) / min(seen.values()) < 1.2  # 1,500 picks each, give or take

    big = make_picker({f"b{i}": None for i in range(2000)})
    _CountingLink.asked.clear()
    for lk in big.links.values():
        lk.__class__ = _CountingLink
    pick(big, {"pool": "edge", "fanout": 5})
    assert len(_CountingLink.asked) == 5  # the 5 drawn, not the 2,000 of the pool


class _CountingLink(ServerLink):
    """A ServerLink that notes each time it is asked whether it is up (in the class: a
    link's slots leave no room for more, and its class may change only to one of the
    same layout)."""

    __slots__ = ()
    asked: ClassVar[list[str]] = []

    @property
    def is_up(self) -> bool:
        _CountingLink.asked.append(self.server_id)
        return True
