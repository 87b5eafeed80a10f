"""How every Tailgate process writes its log: today's text lines, or one JSON object per line.

Here, in the package every process imports (the gateway, task servers, edge agents and the
``tailgate up`` launcher all run ``deploy.cli``, which sets it up once with
``configure_logging``), so a log collector reads one format from all of them.

A JSON line has ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger`` and ``msg``, then
every field a call site passed with ``extra=``: ``query_id``, ``class``, ``pool``,
``outcome``, ``server_id`` where a line is about a query or a server, ``method``, ``path``,
``status``, ``duration_ms``, ``bytes`` and ``request_id`` on access-log lines (and ``exc``
with the traceback of a logged exception). The text format leaves the extra fields out.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = [
    "LOG_FORMATS",
    "TEXT_FORMAT",
    "JsonFormatter",
    "configure_logging",
    "current_log_format",
    "make_formatter",
]

LOG_FORMATS = ("text", "json")
"""--log-format values."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The text line: time, level, logger, message."""

# What every LogRecord carries by itself; anything else on a record came with extra=.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (values JSON cannot hold become strings)."""
        ts = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in line:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def make_formatter(log_format: str) -> logging.Formatter:
    """The formatter of a --log-format value; ValueError naming any other value."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"--log-format: must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def configure_logging(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Send every logger's records at `level` and above to `stream` (stderr) in `log_format`.

    As ``logging.basicConfig``: a root logger that has handlers already is left alone.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(make_formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])


def current_log_format(logger: logging.Logger | None = None) -> str:
    """The format the handlers of `logger` (the root logger) write: "json" or "text"."""
    handlers = (logger or logging.getLogger()).handlers
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in handlers) else "text"
