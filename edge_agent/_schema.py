"""The store's tables, its range query and the flat form of a sensor's readings."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    bindparam,
    select,
)

MAX_SENSOR_NAME = 32

metadata = MetaData()
sensors_table = Table(
    "sensors",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(MAX_SENSOR_NAME), nullable=False, unique=True),
)
readings_table = Table(
    "readings",
    metadata,
    Column("sensor_id", SmallInteger, ForeignKey("sensors.id"), nullable=False),
    Column("ts", BigInteger, nullable=False),
    Column("value", Float, nullable=False),
    PrimaryKeyConstraint("sensor_id", "ts"),
    # The primary key is the table: no rowid, no second copy of (sensor_id, ts).
    sqlite_with_rowid=False,
)


@dataclass(slots=True)
class Readings:
    """One sensor's readings, oldest first, as flat arrays (16 bytes a reading)."""

    ts: array[int] = field(default_factory=lambda: array("q"))
    """Unix seconds."""
    values: array[float] = field(default_factory=lambda: array("d"))

    def __len__(self) -> int:
        return len(self.ts)

    def pairs(self) -> list[tuple[int, float]]:
        """The readings as (ts, value) tuples."""
        return list(zip(self.ts, self.values, strict=True))


RANGE_QUERY = (
    select(readings_table.c.ts, readings_table.c.value)
    .where(
        readings_table.c.sensor_id == bindparam("sid"),
        readings_table.c.ts >= bindparam("lo"),
        readings_table.c.ts < bindparam("hi"),
    )
    .order_by(readings_table.c.ts)
    .limit(bindparam("n"))
)


def driver_statement(stmt: Any, dialect: Any) -> tuple[str, Any]:
    """A Core statement compiled for the dialect, and a function from values to DBAPI params."""
    compiled = stmt.compile(dialect=dialect)
    order = compiled.positiontup

    def params_of(**values: Any) -> Any:
        params = compiled.construct_params(values)
        return tuple(params[k] for k in order) if compiled.positional else params

    return str(compiled), params_of
