"""Errors the gateway answers with, each mapped to one HTTP status.

::

    ApiError                  {"error": {"code", "message", "field"}}; field is null when
    │                         no field is at fault, "" for the body as a whole
    │                         (500 internal: a bug, logged)
    ├── BadRequest            400: the body or a parameter is invalid (names the field)
    ├── Unauthorized          401: no credential, or one the gateway does not know
    │                         (WWW-Authenticate; gateway.auth)
    ├── Forbidden             403: a credential without the right to the route
    ├── NotFound              404
    ├── RequestTimeout        408: the body did not arrive within body_timeout_s
    │                         (gateway.limits; the connection is closed)
    ├── PayloadTooLarge       413
    ├── UnsupportedMediaType  415: a request body that is not application/json
    ├── SloUnreachableError   422: the SLO is below the unloaded p-th latency
    ├── TooManyRequests       429: a failing source slowed down, or an API key over its
    │                         limits (Retry-After)
    └── Unavailable           503: no server can take the query now (Retry-After)
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answer: HTTP status, machine code, message and the field at fault."""

    status = 500
    code = "internal"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        out: dict[str, Any] = {
            "error": {"code": self.code, "message": self.message, "field": self.field}
        }
        out.update(self.extra)
        return out


class BadRequest(ApiError):
    """400."""

    status = 400
    code = "invalid_request"


class Unauthorized(ApiError):
    """401."""

    status = 401
    code = "unauthorized"


class Forbidden(ApiError):
    """403."""

    status = 403
    code = "forbidden"


class NotFound(ApiError):
    """404."""

    status = 404
    code = "not_found"


class RequestTimeout(ApiError):
    """408."""

    status = 408
    code = "request_timeout"


class PayloadTooLarge(ApiError):
    """413."""

    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    """415."""

    status = 415
    code = "unsupported_media_type"


class SloUnreachableError(ApiError):
    """422."""

    status = 422
    code = "slo_unreachable"


class TooManyRequests(ApiError):
    """429."""

    status = 429
    code = "too_many_requests"


class Unavailable(ApiError):
    """503."""

    status = 503
    code = "unavailable"
