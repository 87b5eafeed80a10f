"""The gateway's access log: one line per HTTP request, off unless asked for.

``[gateway] access_log = true`` (or ``--access-log`` on ``tailgate gateway`` / ``tailgate
up``) hands `AccessLogger` to aiohttp's runner. Each answered request becomes one INFO record
of the logger ``gateway.access``: method, path, status, duration, body bytes and the request
id (``X-Request-Id`` of the answer, else of the request) in the text, and as the fields
``method``, ``path``, ``status``, ``duration_ms``, ``bytes`` and ``request_id`` of a JSON
line (``tailgate --log-format json``; taskserver.logformat). The query string is left out:
the path names the resource, and a query string may carry what does not belong in a log.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

__all__ = ["ACCESS_LOGGER", "AccessLogger", "access_fields", "access_log_options"]

ACCESS_LOGGER = "gateway.access"
"""The logger the access lines go to."""

REQUEST_ID_HEADER = "X-Request-Id"


def access_fields(
    method: str,
    path: str,
    status: int,
    duration_s: float,
    body_bytes: int,
    request_id: str | None,
) -> dict[str, Any]:
    """The fields of one access line (request_id left out when there is none)."""
    fields: dict[str, Any] = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(duration_s * 1000.0, 3),
        "bytes": body_bytes,
    }
    if request_id:
        fields["request_id"] = request_id
    return fields


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger, writing `access_fields` as one record per request."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        """One line for a request answered `time` seconds after it came."""
        request_id = response.headers.get(REQUEST_ID_HEADER) or request.headers.get(
            REQUEST_ID_HEADER
        )
        fields = access_fields(
            request.method,
            request.path,
            response.status,
            time,
            response.body_length,
            request_id,
        )
        self.logger.info(
            "%s %s %d %.1f ms %d B%s",
            request.method,
            request.path,
            response.status,
            fields["duration_ms"],
            response.body_length,
            f" request {request_id}" if request_id else "",
            extra=fields,
        )

    @property
    def enabled(self) -> bool:
        """Only when the logger passes INFO (aiohttp then skips the call otherwise)."""
        return self.logger.isEnabledFor(logging.INFO)


def access_logger() -> logging.Logger:
    """The logger of the access lines."""
    return logging.getLogger(ACCESS_LOGGER)


def access_log_options(enabled: bool) -> dict[str, Any]:
    """aiohttp.web.AppRunner's access-log arguments: `AccessLogger` on ``gateway.access``
    when enabled, else none at all."""
    if not enabled:
        return {"access_log": None}
    return {"access_log": access_logger(), "access_log_class": AccessLogger}
