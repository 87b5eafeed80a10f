"""The gateway's history: samples from figures, the store, retention and the recorder."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from admission import nearest_rank
from gateway.config import GatewayConfig
from gateway.history import (
    Figures,
    HistoryError,
    HistorySampler,
    HistoryStore,
    read_figures,
    thin,
)
from gateway.links import ServerLink
from gateway.service import GatewayService

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def make_figures(**changes: Any) -> Figures:
    base: dict[str, Any] = {
        "miss": {"all": 0.0, "A": 0.0},
        "pool_miss": {},
        "latencies_ms": {},
        "percentiles": {"A": 99.0, "C": 95.0},
        "queries": {},
        "deferred": {},
        "queue": {},
        "servers": {},
        "replicas": {},
    }
    base.update(changes)
    return Figures(**base)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_sampler_turns_counters_into_rates_over_each_interval() -> None:
    sampler = HistorySampler(now=100.0)
    first = sampler.sample(
        make_figures(
            queries={("A", "met"): 40.0, ("A", "missed_slo"): 10.0, ("A", "rejected"): 5.0},
            deferred={("C", "cost_ladder_defer"): 4},
        ),
        now=105.0,
        wall=T0,
    )
    assert first["t"] == T0
    assert first["qps"] == {"A": 10.0, "C": 0.0}  # 50 answered in 5 s
    assert first["rejected_per_s"] == {"A": 1.0, "C": 0.0}
    assert first["deferred_per_s"] == {"A": 0.0, "C": 0.8}
    second = sampler.sample(
        make_figures(
            queries={("A", "met"): 60.0, ("A", "missed_slo"): 10.0, ("A", "rejected"): 5.0},
            deferred={("C", "cost_ladder_defer"): 4},
        ),
        now=107.0,
        wall=T0 + 2,
    )
    assert second["qps"]["A"] == 10.0  # 20 more in 2 s
    assert second["rejected_per_s"]["A"] == 0.0
    assert second["deferred_per_s"]["C"] == 0.0


def test_sampler_reports_the_tail_at_each_class_percentile() -> None:
    sampler = HistorySampler(now=0.0)
    latencies = [float(i) for i in range(1, 101)]  # 1..100 ms
    s = sampler.sample(
        make_figures(latencies_ms={"A": latencies, "C": latencies, "custom": [7.0]}),
        now=5.0,
        wall=T0,
    )
    assert s["tail_ms"] == {"A": 99.0, "C": 95.0, "custom": 7.0}  # custom: p99
    assert s["p99_ms"] == {"A": 99.0, "C": 99.0, "custom": 7.0}
    # A class with no answered query in the interval has no tail (a gap, not a zero).
    assert "A" not in sampler.sample(make_figures(), now=10.0, wall=T0 + 5)["tail_ms"]


def test_sampler_keeps_pool_totals_and_only_the_deepest_servers() -> None:
    sampler = HistorySampler(now=0.0, top_servers=2)
    queue = {"s1": ("default", 3), "s2": ("default", 9), "s3": ("edge", 5), "s4": ("edge", 0)}
    s = sampler.sample(
        make_figures(queue=queue, servers={"up": 3, "down": 1}, replicas={"default": 2}),
        now=1.0,
        wall=T0,
    )
    assert s["queue"] == {"default": 12, "edge": 5}
    assert s["server_queue"] == {"s2": 9, "s3": 5}
    assert s["servers"] == {"down": 1, "up": 3}
    assert s["replicas"] == {"default": 2}


def test_percentile_is_nearest_rank_and_thin_keeps_the_newest() -> None:
    assert nearest_rank([1.0, 3.0, 5.0], 50) == 3.0
    assert nearest_rank([1.0, 3.0, 5.0], 100) == 5.0
    assert nearest_rank([1.0, 3.0, 5.0], 0.1) == 1.0
    assert nearest_rank([], 99) == 0.0
    samples = [{"t": float(i)} for i in range(10)]
    assert thin(samples, 20) == samples
    thinned = thin(samples, 4)
    assert [s["t"] for s in thinned] == [0.0, 2.0, 5.0, 9.0]


def test_store_round_trip_order_and_retention(tmp_path: Path) -> None:
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        for i in range(5):
            store.append({"t": T0 + i, "miss": {"all": i / 100}}, keep_after=T0 - 100)
        got = store.since(T0 + 2)
        assert [s["t"] for s in got] == [T0 + 2, T0 + 3, T0 + 4]
        assert got[0] == {"t": T0 + 2, "miss": {"all": 0.02}}
        # Retention: writing at T0 + 10 with a 7 s retention deletes what is older than T0 + 3.
        store.append({"t": T0 + 10, "miss": {}}, keep_after=T0 + 3)
        assert [s["t"] for s in store.since(0.0)] == [T0 + 3, T0 + 4, T0 + 10]
        assert len(store.since(0.0, limit=2)) == 2
    finally:
        store.close()
    con = sqlite3.connect(tmp_path / "h.db")
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT count(*) FROM gateway_history").fetchone()[0] == 3
    finally:
        con.close()


def test_store_survives_reopening_and_memory_store_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    store = HistoryStore(url)
    store.append({"t": T0, "qps": {"A": 1.5}}, keep_after=0.0)
    store.close()
    again = HistoryStore(url)
    try:
        assert again.since(0.0) == [{"t": T0, "qps": {"A": 1.5}}]
    finally:
        again.close()
    memory = HistoryStore("")
    try:
        memory.append({"t": T0}, keep_after=0.0)
        assert memory.since(0.0) == [{"t": T0}]
        assert memory.where == "sqlite://"
    finally:
        memory.close()


@pytest.mark.parametrize("also_index", [True, False], ids=["table-and-index", "table-only"])
def test_a_replica_that_loses_the_race_to_create_the_table_opens_it(
    tmp_path: Path, also_index: bool
) -> None:
    """Two replicas sharing one database start together: the other one creates the table
    between this one's check and its CREATE (here: from the DDL hook that runs just before
    it), and this one's CREATE fails. It opens the table the other made, index and all."""
    from sqlalchemy import event
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.schema import CreateIndex, CreateTable

    from gateway.history import history_table

    path = tmp_path / "h.db"
    dialect = sqlite.dialect()
    ddl = [str(CreateTable(history_table).compile(dialect=dialect))]
    if also_index:
        ddl += [str(CreateIndex(i).compile(dialect=dialect)) for i in history_table.indexes]
    raced = []

    def other_replica(*_: Any, **__: Any) -> None:
        con = sqlite3.connect(path, timeout=10.0)
        for statement in ddl:
            con.execute(statement)
        con.commit()
        con.close()
        raced.append(True)

    event.listen(history_table, "before_create", other_replica)
    try:
        store = HistoryStore(f"sqlite:///{path}", replica="gw-a")
    finally:
        event.remove(history_table, "before_create", other_replica)
    try:
        assert raced == [True]
        store.append({"t": T0, "qps": {"A": 1.0}}, keep_after=0.0)
        assert store.since(0.0) == [{"t": T0, "qps": {"A": 1.0}}]
    finally:
        store.close()
    con = sqlite3.connect(path)
    indexes = [r[1] for r in con.execute("PRAGMA index_list(gateway_history)")]
    con.close()
    assert [i.name for i in history_table.indexes] == indexes  # made by one or the other


def test_store_errors_are_translated(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="storage_url"):
        HistoryStore("nosuchdialect://x/y")
    with pytest.raises(HistoryError, match="cannot open"):
        HistoryStore(f"sqlite:///{tmp_path / 'missing-dir' / 'h.db'}")
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        con = sqlite3.connect(tmp_path / "h.db")
        con.execute("DROP TABLE gateway_history")
        con.commit()
        con.close()
        with pytest.raises(HistoryError, match="write failed"):
            store.append({"t": T0}, keep_after=0.0)
        with pytest.raises(HistoryError, match="read failed"):
            store.since(0.0)
    finally:
        store.close()


def test_config_checks_the_history_fields() -> None:
    with pytest.raises(ValueError, match=r"^storage_url: "):
        GatewayConfig(storage_url="tailgate.db")
    with pytest.raises(ValueError, match=r"^history_interval_s: "):
        GatewayConfig(history_interval_s=0.0)
    with pytest.raises(ValueError, match=r"^history_retention_s: "):
        GatewayConfig(history_interval_s=10.0, history_retention_s=5.0)
    assert GatewayConfig(storage_url="").storage_url == ""


async def test_recorder_samples_the_service_into_the_store(tmp_path: Path) -> None:
    clock, wall = FakeClock(50.0), FakeClock(T0)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    config = GatewayConfig(storage_url=url, history_interval_s=3600.0, history_retention_s=3600.0)
    service = GatewayService(config, clock=clock)
    recorder = service.history
    recorder.wall_clock = wall
    await service.start()
    try:
        assert recorder.where == url
        m = service.metrics
        for latency_ms in (10.0, 20.0, 30.0):
            m.queries.labels("A", "met").inc()
            m.query_answered("A", 4, latency_ms)
        m.queries.labels("B", "rejected").inc(2)
        m.server_windows.task("ts-1", "default", missed=True)
        m.server_windows.task("ts-1", "default", missed=False)
        clock.t, wall.t = 52.0, T0 + 2
        first = await recorder.record()
        assert first["t"] == T0 + 2
        assert first["qps"]["A"] == 1.5 and first["rejected_per_s"]["B"] == 1.0
        assert first["tail_ms"] == {"A": 30.0}
        assert first["pool_miss"] == {"default": 0.5}
        clock.t, wall.t = 54.0, T0 + 4
        second = await recorder.record()
        assert second["qps"]["A"] == 0.0 and second["tail_ms"] == {}  # latencies drained
        # Retention is one hour: a sample two hours on deletes both.
        clock.t, wall.t = 7254.0, T0 + 7204
        await recorder.record()
        wall.t = T0 + 7205
        assert [s["t"] for s in await recorder.since(10_000.0)] == [T0 + 7204]
    finally:
        await service.stop()
    assert recorder.store is None and await recorder.since(60.0) == []


async def test_recorder_falls_back_to_memory_when_the_store_cannot_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'missing-dir' / 'h.db'}"
    service = GatewayService(GatewayConfig(storage_url=url, history_interval_s=3600.0))
    await service.start()
    try:
        assert service.history.where == "sqlite://"
        assert "cannot open" in service.history.last_error
        assert "keeping the history in memory only" in caplog.text
        await service.history.record()
        assert len(await service.history.since(60.0)) == 1
    finally:
        await service.stop()


def test_replicas_sharing_a_store_read_back_their_own_samples(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = HistoryStore(url, replica="gw-0"), HistoryStore(url, replica="gw-1")
    try:
        for i in range(3):
            a.append({"t": T0 + i, "qps": {"A": 1.0}}, keep_after=0.0)
            b.append({"t": T0 + i + 0.5, "qps": {"A": 2.0}}, keep_after=0.0)
        assert [s["qps"]["A"] for s in a.since(0.0)] == [1.0, 1.0, 1.0]
        assert [s["t"] for s in b.since(0.0)] == [T0 + 0.5, T0 + 1.5, T0 + 2.5]
    finally:
        a.close()
        b.close()


def test_a_table_from_before_replicas_gets_the_column_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute(
        "CREATE TABLE gateway_history "
        "(id INTEGER PRIMARY KEY, t FLOAT NOT NULL, data TEXT NOT NULL)"
    )
    con.execute("INSERT INTO gateway_history (t, data) VALUES (?, ?)", (T0, '{"qps": {"A": 3}}'))
    con.commit()
    con.close()
    store = HistoryStore(f"sqlite:///{db}", replica="gw-0")
    try:
        store.append({"t": T0 + 1, "qps": {"A": 4}}, keep_after=0.0)
        assert [s["qps"]["A"] for s in store.since(0.0)] == [3, 4]  # the old row, then ours
    finally:
        store.close()
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT replica FROM gateway_history ORDER BY t").fetchall()
        assert rows == [("",), ("gw-0",)]
    finally:
        con.close()


def test_history_metrics_and_the_server_list_show_one_state_per_server() -> None:
    service = GatewayService(GatewayConfig())

    def add(server_id: str, **state: Any) -> None:
        link = ServerLink(
            server_id,
            "127.0.0.1",
            9,
            pool="default",
            on_result=lambda *a: None,
            on_failure=lambda *a: None,
            gateway_id=service.instance_id,
        )
        for k, v in state.items():
            setattr(link, k, v)
        service.links[server_id] = link

    add("up", state="up")
    add("mine", state="up", owner=service.instance_id)
    add("other", state="up", owner="gw-2")
    add("server-drains", state="up", server_draining=True)
    add("leaving", state="up", draining=True)
    add("down", state="down")
    expected = {"up": 2, "owned_elsewhere": 1, "draining": 2, "down": 1}
    assert read_figures(service).servers == expected
    views = [service.server_view(lk)["state"] for lk in service.links.values()]
    assert Counter(views) == expected
    for state, n in expected.items():
        labels = {"pool": "default", "state": state}
        assert service.registry.get_sample_value("tailgate_servers", labels) == n


async def test_a_failing_sample_is_logged_and_sampling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = GatewayService(GatewayConfig(history_interval_s=0.001))
    recorder = service.history
    calls = 0
    second = asyncio.Event()

    async def record() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in read_figures")
        second.set()
        return {}

    recorder.record = record  # type: ignore[method-assign]
    await service.start()
    try:
        await asyncio.wait_for(second.wait(), 5.0)
        assert "history sample failed: RuntimeError('a bug in read_figures')" in caplog.text
        assert recorder.last_error == ""  # the next sample went through
    finally:
        await service.stop()


async def test_stop_survives_a_sampler_that_died() -> None:
    service = GatewayService(GatewayConfig(history_interval_s=3600.0))
    await service.start()
    recorder = service.history
    assert recorder._task is not None
    recorder._task.cancel()

    async def died() -> None:
        raise RuntimeError("sampler bug")

    recorder._task = asyncio.get_running_loop().create_task(died())
    await asyncio.sleep(0)
    await service.stop()  # no RuntimeError: the links and the store still close
    assert recorder.store is None and recorder._task is None


def test_idle_servers_cost_the_sample_nothing_but_their_pool_still_shows() -> None:
    # read_figures lists only the servers holding tasks; pools come apart, so an idle pool
    # still reports 0 and no idle server fills the "deepest" list.
    sampler = HistorySampler(now=0.0, top_servers=3)
    s = sampler.sample(
        make_figures(queue={"s7": ("default", 2)}, pools=("default", "edge")),
        now=1.0,
        wall=T0,
    )
    assert s["queue"] == {"default": 2, "edge": 0}
    assert s["server_queue"] == {"s7": 2}
