"""The sensor store: schema, writes, range/latest reads, pruning and the integrity check."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from edge_agent.store import SensorStore, StoreError, UnknownSensor, database_url

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def make_store(tmp_path: Path, name: str = "edge.db") -> SensorStore:
    return SensorStore(str(tmp_path / name))


def test_file_store_uses_wal_and_a_compact_schema(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert("temperature", T0, 21.5)
    store.close()
    con = sqlite3.connect(tmp_path / "edge.db")
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        ddl = con.execute("SELECT sql FROM sqlite_master WHERE name = 'readings'").fetchone()[0]
        assert "WITHOUT ROWID" in ddl and "PRIMARY KEY (sensor_id, ts)" in ddl
        assert con.execute("SELECT id, name FROM sensors").fetchall() == [(1, "temperature")]
    finally:
        con.close()


def test_insert_range_latest_round_trip(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for i in range(10):
        store.insert("temperature", T0 + 60 * i, 20.0 + i)
    store.insert("humidity", T0, 55.0)
    got = store.range(["temperature", "humidity"], T0 + 60, T0 + 300)
    # start inclusive, end exclusive
    assert got["temperature"].pairs() == [(T0 + 60 * i, 20.0 + i) for i in range(1, 5)]
    assert got["humidity"].pairs() == []
    assert store.latest("temperature") == (T0 + 540, 29.0)
    assert store.count() == 11 and store.count("humidity") == 1
    assert store.sensor_names() == ["humidity", "temperature"]


def test_a_later_reading_of_the_same_second_wins(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert("temperature", T0, 1.0)
    store.insert("temperature", T0, 2.0)
    assert store.count() == 1 and store.latest("temperature") == (T0, 2.0)


def test_bulk_insert_chunks_and_keeps_existing_rows(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert("temperature", T0, -5.0)
    rows = [("temperature", T0 + 300 * i, float(i)) for i in range(2500)]
    assert store.insert_many(rows, chunk_rows=1000) == 2500
    assert store.count() == 2500
    assert store.latest("temperature") == (T0 + 300 * 2499, 2499.0)
    assert store.range(["temperature"], T0, T0 + 1)["temperature"].pairs() == [(T0, -5.0)]


def test_range_limit_and_unknown_sensor(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert_many([("humidity", T0 + i, 50.0) for i in range(20)])
    assert len(store.range(["humidity"], T0, T0 + 100, limit=7)["humidity"]) == 7
    with pytest.raises(UnknownSensor, match=r"unknown sensor 'pressure'; known: humidity"):
        store.range(["pressure"], T0, T0 + 100)
    with pytest.raises(UnknownSensor):
        store.latest("pressure")


def test_prune_deletes_only_older_rows(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert_many([(s, T0 + 3600 * h, 1.0) for s in ("a", "b") for h in range(48)])
    assert store.prune(T0 + 3600 * 24, window_s=5 * 3600) == 48  # in 5-hour steps
    assert store.count() == 48
    assert store.range(["a"], 0, T0 + 3600 * 25)["a"].pairs() == [(T0 + 3600 * 24, 1.0)]
    assert store.prune(T0) == 0


def test_non_finite_values_are_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(StoreError, match="finite"):
        store.insert("temperature", T0, math.nan)
    with pytest.raises(StoreError, match="finite"):
        store.insert_many([("temperature", T0, math.inf)])


def test_sensors_added_by_another_writer_are_found(tmp_path: Path) -> None:
    agent = make_store(tmp_path)
    other = make_store(tmp_path)
    other.insert("pressure", T0, 1013.2)
    assert agent.latest("pressure") == (T0, 1013.2)


def test_reopening_keeps_data_and_passes_the_check(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert_many([("temperature", T0 + i, float(i)) for i in range(100)])
    store.close()
    again = make_store(tmp_path)
    again.check()
    assert again.count() == 100


def test_garbage_file_fails_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.db").write_bytes(b"this is not sqlite\n" * 500)
    with pytest.raises(StoreError, match="file is not a database") as info:
        make_store(tmp_path, "bad.db")
    assert info.value.__cause__ is not None


def test_corrupted_pages_fail_the_integrity_check(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.insert_many([("temperature", T0 + i, float(i)) for i in range(20_000)])
    store.close()
    path = tmp_path / "edge.db"
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(2 * page, len(data) - page, 3 * page):  # smash interior pages
        data[offset + 8 : offset + 400] = b"\xff" * 392
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"integrity check failed|malformed|not a database"):
        make_store(tmp_path)


def test_foreign_schema_is_not_taken_for_a_store(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE readings (id INTEGER PRIMARY KEY, payload TEXT)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="lacks column"):
        make_store(tmp_path, "other.db")


def test_memory_url_and_path_urls() -> None:
    store = SensorStore("sqlite://")
    store.insert("temperature", T0, 3.0)
    assert store.latest("temperature") == (T0, 3.0)
    assert database_url("data/edge.db").get_backend_name() == "sqlite"
    assert database_url("postgresql+psycopg://u:p@h/db").get_backend_name() == "postgresql"
    with pytest.raises(StoreError, match="not a database URL"):
        database_url("bogus://::")
