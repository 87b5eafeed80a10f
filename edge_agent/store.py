"""The agent's sensor store: months of readings in one database, through SQLAlchemy Core.

Schema (compact on purpose: a Pi's SD card holds 18 months of minute readings)::

    sensors   id INTEGER PRIMARY KEY, name VARCHAR(32) UNIQUE     -- name -> small id
    readings  sensor_id SMALLINT, ts BIGINT (unix s), value FLOAT,
              PRIMARY KEY (sensor_id, ts)                          -- WITHOUT ROWID on SQLite

A range read is one primary-key range scan per sensor. SQLite (the default, a file path)
runs with ``journal_mode=WAL`` and ``synchronous=NORMAL``: every committed reading survives
a crash of the process (``kill -9``), a power cut may lose the last commits but never
corrupts the file, and readers never wait for the sampling writer. Any SQLAlchemy URL is
accepted (PostgreSQL for a larger host).

File faults (`edge_agent.store_faults`): an empty (zero-byte) store file is refused unless
``init`` is given; a store that fails its check says how to recover; a full disk refuses
writes with `StoreFull` while every committed row stays and reads go on.

Errors::

    Exception
     └── StoreError          the database cannot be opened, fails its check, or a query failed
          ├── StoreFull      a write refused by a full disk (nothing of it stored)
          └── UnknownSensor  a sensor name the store holds no readings for
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, create_engine, delete, event, func, insert, inspect, select, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from edge_agent._schema import (
    MAX_SENSOR_NAME,
    RANGE_QUERY,
    Readings,
    driver_statement,
    metadata,
    readings_table,
    sensors_table,
)
from edge_agent.store_faults import (
    describe_full,
    empty_store_problem,
    is_corrupt,
    is_disk_full,
    recovery_hint,
)

__all__ = [
    "CHUNK_ROWS",
    "Readings",
    "SensorStore",
    "StoreError",
    "StoreFull",
    "UnknownSensor",
    "database_url",
]

CHUNK_ROWS = 20_000
"""Rows per transaction of a bulk insert (a crash loses at most the chunk in flight)."""


class StoreError(Exception):
    """The store cannot be opened, fails its integrity check, or a query failed."""


class StoreFull(StoreError):
    """A write refused by a full disk: nothing of it was stored, every committed row stays."""


_T = TypeVar("_T")


class UnknownSensor(StoreError):
    """The store holds no sensor of that name."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        listed = ", ".join(self.known) if self.known else "none yet"
        super().__init__(f"unknown sensor {name!r}; known: {listed}")


def database_url(target: str) -> URL:
    """A SQLAlchemy URL from a URL or a plain file path (a path means SQLite)."""
    if "://" in target:
        try:
            return make_url(target)
        except (ArgumentError, ValueError) as exc:
            raise StoreError(f"db: not a database URL: {target!r}") from exc
    return URL.create("sqlite", database=str(Path(target)))


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn SQLAlchemy's errors into StoreError at this boundary."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise StoreError(f"{what}: {exc.__class__.__name__}: {_first_line(exc)}") from exc


def _first_line(exc: SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    return str(orig if orig is not None else exc).splitlines()[0]


class SensorStore:
    """Readings of named sensors, by (sensor, unix second); thread-safe for the agent's use."""

    def __init__(self, target: str, *, init: bool = False) -> None:
        """Open (creating if needed) the database at a path or URL and check its integrity.

        An existing zero-byte SQLite file is refused (StoreError) unless `init`: then a new
        store is made in it. `created` says whether the file was new or empty.
        """
        self.url = database_url(target)
        self.dialect = self.url.get_backend_name()
        memory = self.dialect == "sqlite" and self.url.database in (None, "", ":memory:")
        self.path: Path | None = None
        self.created = False
        if self.dialect == "sqlite" and not memory:
            self.path = Path(str(self.url.database))
            problem = empty_store_problem(self.path, init=init)
            if problem is not None:
                raise StoreError(problem)
            self.created = not self.path.exists() or self.path.stat().st_size == 0
        kwargs: dict[str, Any] = {}
        if memory:
            # One shared connection, or every thread would see its own empty database.
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        elif self.dialect == "sqlite":
            kwargs = {"pool_size": 2, "max_overflow": 4}
        self._memory = memory
        self._lock: AbstractContextManager[Any] = threading.Lock() if memory else nullcontext()
        where = self.url.render_as_string(hide_password=True)
        try:
            self.engine: Engine = create_engine(self.url, **kwargs)
        except (ArgumentError, ImportError) as exc:
            raise StoreError(f"db: cannot use {where!r}: {exc}") from exc
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._ids: dict[str, int] = {}
        self._range_sql: tuple[str, Any] | None = None
        try:
            self._open()
        except BaseException:
            self.engine.dispose()
            raise

    def _open(self) -> None:
        where = self.url.render_as_string(hide_password=True)
        try:
            with _translated(f"db {where}: cannot open"), self._lock:
                with self.engine.connect() as conn:
                    self._quick_check(conn, where)
                metadata.create_all(self.engine)
                self._sanity_check(where)
        except StoreError as exc:
            # A damaged file, or none of SQLite's: the one line says how to recover.
            damaged = exc.__cause__ is not None and is_corrupt(exc.__cause__)
            if self.path is not None and (damaged or "integrity check failed" in str(exc)):
                raise StoreError(f"{exc}; {recovery_hint(self.path)}") from exc.__cause__
            raise
        self._load_ids()
        if not self._memory:
            # The check read every page through one connection's cache: start afresh.
            self.engine.dispose()

    def _quick_check(self, conn: Connection, where: str) -> None:
        if self.dialect != "sqlite":
            return
        rows = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check").fetchall()]
        if rows != ["ok"]:
            # One line: a row of the check may hold several ("*** in database main ***\n...").
            found = "; ".join(" ".join(str(r).split()) for r in rows[:5])
            raise StoreError(f"db {where}: integrity check failed: {found}")

    def _sanity_check(self, where: str) -> None:
        """The tables have the columns this code reads (a foreign or older schema fails here)."""
        inspector = inspect(self.engine)
        for table in (sensors_table, readings_table):
            have = {c["name"] for c in inspector.get_columns(table.name)}
            missing = [c.name for c in table.columns if c.name not in have]
            if missing:
                raise StoreError(
                    f"db {where}: table {table.name!r} lacks column(s) {', '.join(missing)}: "
                    "not a sensor store"
                )

    def _load_ids(self) -> None:
        with _translated("db: reading sensors"), self._lock, self.engine.connect() as conn:
            rows = conn.execute(select(sensors_table.c.name, sensors_table.c.id)).all()
        self._ids = {name: sid for name, sid in rows}

    # -- sensors ---------------------------------------------------------------
    def sensor_names(self) -> list[str]:
        """Names of the sensors the store knows, sorted."""
        return sorted(self._ids)

    def _sensor_id(self, conn: Connection, name: str) -> int:
        sid = self._ids.get(name)
        if sid is not None:
            return sid
        if not name or len(name) > MAX_SENSOR_NAME:
            raise StoreError(f"sensor name must be 1..{MAX_SENSOR_NAME} characters: {name!r}")
        row = conn.execute(select(sensors_table.c.id).where(sensors_table.c.name == name)).first()
        if row is None:
            row = conn.execute(insert(sensors_table).values(name=name)).inserted_primary_key
        self._ids[name] = sid = int(row[0])
        return sid

    def _known_id(self, name: str) -> int:
        sid = self._ids.get(name)
        if sid is None:
            self._load_ids()  # another process (a backfill) may have added it
            sid = self._ids.get(name)
        if sid is None:
            raise UnknownSensor(name, self.sensor_names())
        return sid

    # -- writes ----------------------------------------------------------------
    def insert(self, sensor: str, ts: int, value: float) -> None:
        """Store one reading in its own transaction; a later reading of that second wins."""
        if not math.isfinite(value):
            raise StoreError(f"reading {sensor}@{ts}: value must be finite, got {value!r}")
        stmt = self._insert_stmt(replace=True)

        def write(conn: Connection) -> None:
            sid = self._sensor_id(conn, sensor)
            conn.execute(stmt, {"sensor_id": sid, "ts": ts, "value": value})

        self._transaction("insert", write)

    def insert_many(
        self, readings: Iterable[tuple[str, int, float]], chunk_rows: int = CHUNK_ROWS
    ) -> int:
        """Store (sensor, ts, value) readings, one transaction per chunk; existing rows win.

        Returns the rows offered (rows already stored are skipped on SQLite and PostgreSQL).
        """
        stmt = self._insert_stmt(replace=False)
        compiled = stmt.compile(dialect=self.engine.dialect)
        # Core's executemany processes every row's parameters in Python, three times the
        # cost of the insert itself on SQLite; a positional driver takes the compiled
        # statement and plain tuples directly.
        positional = compiled.positional and compiled.positiontup == ["sensor_id", "ts", "value"]
        sql = str(compiled) if positional else None
        total = 0
        chunk: list[Any] = []
        ids: dict[str, int] = {}
        for sensor, ts, value in readings:
            sid = ids.get(sensor)
            if sid is None:
                sid = ids[sensor] = self._transaction(
                    "insert", functools.partial(self._sensor_id, name=sensor)
                )
            if not math.isfinite(value):
                raise StoreError(f"reading {sensor}@{ts}: value must be finite, got {value!r}")
            if positional:
                chunk.append((sid, ts, value))
            else:
                chunk.append({"sensor_id": sid, "ts": ts, "value": value})
            if len(chunk) >= chunk_rows:
                total += self._write_chunk(stmt, sql, chunk)
                chunk = []
        if chunk:
            total += self._write_chunk(stmt, sql, chunk)
        return total

    def _write_chunk(self, stmt: Any, sql: str | None, chunk: list[Any]) -> int:
        def write(conn: Connection) -> None:
            if sql is not None:
                conn.exec_driver_sql(sql, chunk)  # executemany
            else:
                conn.execute(stmt, chunk)  # executemany

        self._transaction("bulk insert", write)
        return len(chunk)

    def _transaction(self, what: str, work: Callable[[Connection], _T]) -> _T:
        """Run `work` in one transaction; StoreFull when a full disk refuses it.

        On SQLITE_FULL the store first gives back what its write-ahead log holds (a
        truncating checkpoint) and tries once more. Sensor ids a refused transaction added
        are forgotten: their rows were rolled back with it.
        """
        for attempt in (1, 2):
            known = set(self._ids)
            try:
                with self._lock, self.engine.begin() as conn:
                    return work(conn)
            except SQLAlchemyError as exc:
                for name in set(self._ids) - known:
                    self._ids.pop(name, None)
                if not is_disk_full(exc):
                    detail = f"{exc.__class__.__name__}: {_first_line(exc)}"
                    raise StoreError(f"db: {what}: {detail}") from exc
                if attempt == 1 and self._truncate_wal():
                    continue
                where = str(self.path or self.url.render_as_string(hide_password=True))
                raise StoreFull(describe_full(where, what, _first_line(exc))) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _truncate_wal(self) -> bool:
        """Checkpoint the write-ahead log into the database and truncate it; True if it
        ran to the end (a SQLite file store only; never raises).

        It gives the log's space back where the database has free pages to take the log's
        (after a prune, the steady state of a store at its retention); where the database
        would have to grow on a full disk it fails, and the log stays as it is.
        """
        if self.path is None:
            return False
        try:
            with self._lock, self.engine.connect() as conn:
                # TRUNCATE waits for readers through the busy handler: never here, where a
                # sampler would stall for seconds behind a long read on every refused write.
                waited_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
                conn.exec_driver_sql("PRAGMA busy_timeout=0")
                try:
                    row = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
                finally:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout={int(waited_ms or 0)}")
        except SQLAlchemyError:
            return False
        return row is not None and row[0] == 0  # (busy, log frames, frames checkpointed)

    def _insert_stmt(self, *, replace: bool) -> Any:
        """INSERT that tolerates an existing (sensor_id, ts) where the dialect allows it."""
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        elif self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:
            return insert(readings_table)
        stmt = dialect_insert(readings_table)
        keys = ["sensor_id", "ts"]
        if replace:
            return stmt.on_conflict_do_update(
                index_elements=keys, set_={"value": stmt.excluded.value}
            )
        return stmt.on_conflict_do_nothing(index_elements=keys)

    def prune(self, older_than_s: int, window_s: int = 7 * 86_400) -> int:
        """Delete readings with ts < older_than_s; returns the rows deleted.

        Per sensor and a week at a time: each delete is a short primary-key range, so
        the sampler never waits long for the write lock, even after months offline.
        """
        self._load_ids()
        c = readings_table.c
        deleted = 0
        for sid in self._ids.values():
            with _translated("db: prune"), self._lock, self.engine.connect() as conn:
                oldest = conn.execute(select(func.min(c.ts)).where(c.sensor_id == sid)).scalar()
            bound = oldest
            while bound is not None and bound < older_than_s:
                bound = min(bound + window_s, older_than_s)
                stmt = delete(readings_table).where(c.sensor_id == sid, c.ts < bound)
                deleted += self._transaction(
                    "prune", lambda conn, stmt=stmt: max(0, conn.execute(stmt).rowcount or 0)
                )
        return deleted

    # -- reads -----------------------------------------------------------------
    def range(
        self, sensors: Sequence[str], start_s: int, end_s: int, limit: int | None = None
    ) -> dict[str, Readings]:
        """Readings with start_s <= ts < end_s per sensor, oldest first (at most `limit` each)."""
        ids = {name: self._known_id(name) for name in sensors}
        if self._range_sql is None:
            self._range_sql = driver_statement(RANGE_QUERY, self.engine.dialect)
        sql, params_of = self._range_sql
        out: dict[str, Readings] = {}
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        with _translated("db: range read"), self._lock, self.engine.connect() as conn:
            # A month of readings is ~10k rows per sensor: read them through the DBAPI
            # cursor into flat arrays, without a Row object per reading (half the time and
            # a fraction of the memory; a Pi has little of either).
            cursor = conn.connection.cursor()
            try:
                for name, sid in ids.items():
                    n = limit if limit is not None else 2**62
                    cursor.execute(sql, params_of(sid=sid, lo=start_s, hi=end_s, n=n))
                    out[name] = readings = Readings()
                    while rows := cursor.fetchmany(2048):
                        stamps, values = zip(*rows, strict=True)
                        readings.ts.extend(stamps)
                        readings.values.extend(values)
            except dbapi_error as exc:
                raise StoreError(f"db: range read: {exc}") from exc
            finally:
                cursor.close()
        return out

    def latest(self, sensor: str) -> tuple[int, float] | None:
        """The newest (ts, value) of a sensor, or None if it has no readings."""
        sid = self._known_id(sensor)
        c = readings_table.c
        stmt = select(c.ts, c.value).where(c.sensor_id == sid).order_by(c.ts.desc()).limit(1)
        with _translated("db: latest read"), self._lock, self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else (int(row[0]), float(row[1]))

    def count(self, sensor: str | None = None) -> int:
        """Stored readings, of one sensor or of all."""
        stmt = select(func.count()).select_from(readings_table)
        if sensor is not None:
            stmt = stmt.where(readings_table.c.sensor_id == self._known_id(sensor))
        with _translated("db: count"), self._lock, self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def check(self) -> None:
        """Run the integrity check again (PRAGMA quick_check on SQLite); raise StoreError."""
        where = self.url.render_as_string(hide_password=True)
        with _translated(f"db {where}: check"), self._lock, self.engine.connect() as conn:
            self._quick_check(conn, where)
            conn.execute(text("SELECT 1"))

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"SensorStore({self.url.render_as_string(hide_password=True)!r})"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers never block the writer and a crash leaves the last commit intact;
    # NORMAL: fsync at checkpoints only (a power cut may drop recent commits, not corrupt).
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # 512 KiB of page cache per connection (SQLite's default is 2 MiB): range reads
        # scan the primary key in order and need few pages; a Pi needs the memory.
        cursor.execute("PRAGMA cache_size=-256")
    finally:
        cursor.close()
