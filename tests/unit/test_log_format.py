"""--log-format: the JSON line's fields, today's text line, and children that log alike."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from taskserver.logformat import (
    TEXT_FORMAT,
    JsonFormatter,
    current_log_format,
    make_formatter,
)
from taskserver.spawn import tailgate_argv, taskserver_argv
from tests.unit.test_cli_globals import run as _cli


@pytest.fixture
def json_logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines to a buffer (the root logger stays as it is)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.log_format")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_json_line_has_ts_level_logger_msg_and_the_extra_fields(
    json_logger: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = json_logger
    before = datetime.now(UTC)
    logger.warning(
        "task %s/%d reclaimed",
        "q-1",
        3,
        extra={"query_id": "q-1", "class": "A", "pool": "default", "server_id": "ts-1"},
    )
    logger.info("plain")
    (first, second) = _lines(out)
    assert first["msg"] == "task q-1/3 reclaimed"
    assert (first["level"], first["logger"]) == ("WARNING", "tests.log_format")
    assert {k: first[k] for k in ("query_id", "class", "pool", "server_id")} == {
        "query_id": "q-1",
        "class": "A",
        "pool": "default",
        "server_id": "ts-1",
    }
    # RFC 3339 in UTC, with a Z, to the millisecond
    ts = str(first["ts"])
    assert ts.endswith("Z") and len(ts) == len("2026-01-01T00:00:00.000Z"), ts
    stamped = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert stamped.utcoffset() == timedelta(0)
    assert abs((stamped - before).total_seconds()) < 5
    # nothing of LogRecord's own attributes leaks into the line
    assert set(second) == {"ts", "level", "logger", "msg"}


def test_a_json_line_carries_the_traceback_and_odd_values_as_text(
    json_logger: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = json_logger
    try:
        raise RuntimeError("broken pipe dream")
    except RuntimeError:
        logger.exception("it failed", extra={"outcome": "failed", "when": datetime})
    (line,) = _lines(out)
    assert line["outcome"] == "failed"
    assert "RuntimeError: broken pipe dream" in str(line["exc"])
    assert line["when"] == str(datetime)  # not JSON: written as its str()


def test_the_text_format_is_todays_line() -> None:
    assert TEXT_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    record = logging.LogRecord("gateway.links", logging.INFO, "x", 1, "server %s up", ("a",), None)
    record.server_id = "a"
    text = make_formatter("text").format(record)
    assert text.endswith(" INFO gateway.links: server a up")
    with pytest.raises(ValueError, match="--log-format: must be one of text, json, got 'xml'"):
        make_formatter("xml")


def test_children_are_started_with_the_parents_log_format() -> None:
    assert "--log-format" not in tailgate_argv(log_format="text")
    assert tailgate_argv(log_format="json")[-2:] == ["--log-format", "json"]
    # Unless told, a child writes what this process writes (its root logger's handlers).
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(JsonFormatter())
    assert current_log_format() == "text"
    root.addHandler(handler)
    try:
        assert current_log_format() == "json"
        argv = taskserver_argv("ts-1")  # as `tailgate up` and the autoscaler start them
        at = argv.index("--log-format")
        assert argv[at + 1] == "json" and at < argv.index("taskserver")
    finally:
        root.removeHandler(handler)
    assert "--log-format" not in tailgate_argv()


def test_the_cli_takes_log_format_before_or_after_the_subcommand() -> None:
    # An unknown format is refused before the subcommand or after it (even a light one).
    bad = _cli("--log-format", "xml", "config")
    assert bad.returncode == 2 and "invalid choice: 'xml'" in bad.stderr, bad.stderr
    after = _cli("edge-agent", "seed", "--log-format", "xml")
    assert after.returncode == 2 and "invalid choice: 'xml'" in after.stderr, after.stderr
    ok = _cli("config", "--log-format", "json")
    assert ok.returncode == 0, ok.stderr
