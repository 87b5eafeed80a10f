"""The sensor store's file faults: an emptied file, a corrupt one, a full database."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import event

from deploy.cli import build_parser, main
from edge_agent.config import AgentConfig, load_agent_config
from edge_agent.salvage import salvage_store
from edge_agent.store import SensorStore, StoreError, StoreFull
from edge_agent.store_faults import empty_store_problem, recovery_hint

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def test_an_empty_store_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    db.touch()
    with pytest.raises(StoreError) as info:
        SensorStore(str(db))
    message = str(info.value)
    assert "empty (0 bytes)" in message and "--init-store" in message
    assert "\n" not in message
    assert db.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge.db"]  # no -wal, no -shm


def test_an_empty_store_file_beside_its_log_says_to_keep_the_log(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    db.touch()
    (tmp_path / "edge.db-wal").write_bytes(b"\x37\x7f\x06\x82" + b"\0" * 4092)
    with pytest.raises(StoreError, match=r"keep .*edge\.db-wal \(4096 bytes\)"):
        SensorStore(str(db))
    assert (tmp_path / "edge.db-wal").stat().st_size == 4096


def test_init_starts_a_new_store_in_an_empty_file(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    db.touch()
    store = SensorStore(str(db), init=True)
    assert store.created
    store.insert("temperature", T0, 3.5)
    store.close()
    again = SensorStore(str(db))  # not empty any more: no init needed, nothing new
    try:
        assert not again.created
        assert again.latest("temperature") == (T0, 3.5)
    finally:
        again.close()


def test_a_missing_file_is_a_new_store_and_a_full_one_is_never_reset_by_init(
    tmp_path: Path,
) -> None:
    db = tmp_path / "edge.db"
    store = SensorStore(str(db))
    assert store.created
    store.insert("temperature", T0, 1.0)
    store.close()
    kept = SensorStore(str(db), init=True)
    try:
        assert not kept.created and kept.count() == 1
    finally:
        kept.close()
    assert empty_store_problem(tmp_path / "nothing-here.db", init=False) is None


def test_init_store_is_an_agent_option_off_by_default() -> None:
    assert AgentConfig().init_store is False
    args = build_parser().parse_args(
        ["edge-agent", "run", "--id", "pi-1", "--cluster", "lab", "--init-store"]
    )
    assert load_agent_config(vars(args), {}).init_store is True
    args = build_parser().parse_args(["edge-agent", "run", "--id", "pi-1", "--cluster", "lab"])
    assert load_agent_config(vars(args), {}).init_store is False


def _smash(path: Path, rows: int) -> None:
    """A store with `rows` readings, then some interior pages overwritten."""
    store = SensorStore(str(path))
    store.insert_many([("temperature", T0 + i, float(i)) for i in range(rows)])
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(4 * page, len(data) - page, 5 * page):
        data[offset + 8 : offset + 400] = b"\xff" * 392
    path.write_bytes(bytes(data))


def test_a_corrupt_store_names_the_way_to_recover_on_one_line(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    _smash(db, 20_000)
    with pytest.raises(StoreError) as info:
        SensorStore(str(db))
    message = str(info.value)
    assert "\n" not in message
    assert recovery_hint(db) in message
    assert "tailgate edge-agent salvage" in message and f"{db}.corrupt" in message


def test_not_a_database_names_the_way_to_recover(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    db.write_bytes(b"not a database at all\n" * 300)
    with pytest.raises(StoreError, match=r"file is not a database; to recover: stop the agent"):
        SensorStore(str(db))


def test_the_recovery_hint_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "edge.db"
    _smash(db, 20_000)
    with pytest.raises(StoreError) as info:
        SensorStore(str(db))
    hint = str(info.value).split("to recover: ", 1)[1]
    # What the hint says, as an operator types it (no -wal file here: the store was closed).
    corrupt = tmp_path / "edge.db.corrupt"
    assert f"mv {db} {corrupt}" in hint
    db.rename(corrupt)
    salvage = hint.split("`")[1]
    assert salvage == f"tailgate edge-agent salvage --from {corrupt} --db {db}"
    assert main(shlex.split(salvage)[1:]) == 0
    assert "unreadable stretches skipped" in capsys.readouterr().out
    store = SensorStore(str(db))
    try:
        store.check()
        salvaged = store.count("temperature")
        assert 15_000 < salvaged < 20_000  # what the smashed pages held is gone, the rest kept
        assert store.latest("temperature") == (T0 + 19_999, 19_999.0)
    finally:
        store.close()


def test_salvage_reads_the_log_beside_the_store_and_skips_only_damaged_pages(
    tmp_path: Path,
) -> None:
    db = tmp_path / "edge.db"
    store = SensorStore(str(db))
    store.insert_many([("temperature", T0 + i, float(i)) for i in range(20_000)])
    store.insert_many([("humidity", T0 + i, 50.0) for i in range(100)])
    # Committed in the log only: a reader holds the checkpoint back, a copy keeps both.
    held = sqlite3.connect(db)
    held.execute("BEGIN")
    held.execute("SELECT count(*) FROM readings").fetchone()
    store.insert("temperature", T0 + 50_000, 7.0)
    shutil.copy(db, tmp_path / "copy.db")
    shutil.copy(tmp_path / "edge.db-wal", tmp_path / "copy.db-wal")
    held.close()
    store.close()
    result = salvage_store(tmp_path / "copy.db", str(tmp_path / "new.db"))
    assert result.readings == 20_101 and result.skipped == []
    assert sorted(result.sensors) == ["humidity", "temperature"]
    salvaged = SensorStore(str(tmp_path / "new.db"))
    try:
        assert salvaged.latest("temperature") == (T0 + 50_000, 7.0)
    finally:
        salvaged.close()
    _smash(tmp_path / "smashed.db", 20_000)
    result = salvage_store(tmp_path / "smashed.db", str(tmp_path / "from-smashed.db"))
    assert result.skipped and all(name == "temperature" for name, _, _ in result.skipped)
    lost = 20_000 - result.readings
    assert 0 < lost <= 250 * len(result.skipped)  # about a page (~250 readings) per damage
    with pytest.raises(StoreError, match="no store file"):
        salvage_store(tmp_path / "missing.db", str(tmp_path / "x.db"))


def _limit_pages(store: SensorStore, pages: int | None) -> None:
    """Cap the database's size (SQLITE_FULL beyond it, as a full disk), or lift the cap."""
    store.engine.dispose()
    cap = 1 << 30 if pages is None else pages
    event.listen(
        store.engine, "connect", lambda conn, _rec: conn.execute(f"PRAGMA max_page_count={cap}")
    )


def test_a_full_database_refuses_writes_keeps_every_row_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "edge.db"
    store = SensorStore(str(db))
    try:
        store.insert_many([("temperature", T0 + i, float(i)) for i in range(3000)])
        with store.engine.connect() as conn:
            pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
        _limit_pages(store, pages)
        with pytest.raises(StoreFull) as info:
            store.insert_many([("temperature", T0 + 10_000 + i, 1.0) for i in range(3000)])
        message = str(info.value)
        assert "disk is full" in message and "every committed reading is kept" in message
        assert isinstance(info.value, StoreError)
        assert store.count() == 3000  # the refused chunk was rolled back whole
        assert len(store.range(["temperature"], T0, T0 + 3000)["temperature"]) == 3000
        store.check()
        _limit_pages(store, None)  # space comes back
        store.insert_many([("temperature", T0 + 10_000 + i, 1.0) for i in range(3000)])
        assert store.count() == 6000
    finally:
        store.close()
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        con.close()


def test_a_refused_first_reading_leaves_no_stale_sensor_id(tmp_path: Path) -> None:
    """Regression: a sensor id was cached before its transaction committed, so after a
    refused first reading the next new sensor got the same id and the two mixed."""
    db = tmp_path / "edge.db"
    store = SensorStore(str(db))
    try:
        store.insert("temperature", T0, 1.0)
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON readings WHEN NEW.value < 0 "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        with pytest.raises(StoreError, match="refused"):
            store.insert("pressure", T0, -1.0)  # the sensor row goes back with the reading
        assert store.sensor_names() == ["temperature"]
        store.insert("wind", T0, 7.0)
        store.insert("pressure", T0, 2.0)
        assert store.latest("wind") == (T0, 7.0)
        assert store.latest("pressure") == (T0, 2.0)
    finally:
        store.close()
    reopened = SensorStore(str(db))
    try:
        assert reopened.sensor_names() == ["pressure", "temperature", "wind"]
        assert reopened.latest("wind") == (T0, 7.0)
    finally:
        reopened.close()
