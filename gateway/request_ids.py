"""Request ids and trace context on the HTTP API: X-Request-Id, traceparent, tracestate.

Every answer carries an ``X-Request-Id``: the client's own when it sent a valid one (1 to
MAX_REQUEST_ID_CHARS visible ASCII characters), else one made here (32 hex digits); an
invalid one is replaced, never refused. The id is kept on the request
(``request["request_id"]``) for the logs of the request, given to the query path (span
attribute ``tailgate.request_id``) and, in a query's answer, as ``request_id``.

``traceparent`` and ``tracestate`` are read as W3C Trace Context says
(taskserver.tracecontext): an invalid traceparent is ignored (and its tracestate with it).
The answer's ``traceparent`` is the gateway's own span for the request when it made one
(tracing on: POST /v1/queries and /v1/requests); otherwise, when the client sent a valid
traceparent, its continuation: the same trace id and flags under a new parent id (so the
client and the logs can name the hop even without the `tracing` extra); otherwise none.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from gateway.tracing import Caller
from taskserver.tracecontext import parse_traceparent, parse_tracestate

__all__ = [
    "MAX_REQUEST_ID_CHARS",
    "REQUEST_ID_HEADER",
    "caller_of",
    "stamp_response",
    "valid_request_id",
]

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 128
"""Longest client request id kept (a UUID is 36; tracing systems' ids are under 64)."""
_CALLER = "tailgate_caller"
"""Where a request keeps its Caller (an aiohttp request is a mutable mapping)."""


def valid_request_id(value: str | None) -> bool:
    """A request id we pass on: 1..MAX_REQUEST_ID_CHARS visible ASCII characters (no space,
    no control character: it goes into headers and log lines as it is)."""
    return (
        value is not None
        and 0 < len(value) <= MAX_REQUEST_ID_CHARS
        and value.isascii()
        and all("!" <= c <= "~" for c in value)
    )


def caller_of(request: web.Request) -> Caller:
    """The request's Caller, read from its headers once (and `request["request_id"]` set)."""
    caller = request.get(_CALLER)
    if caller is not None:
        return caller
    given = request.headers.get(REQUEST_ID_HEADER)
    request_id = given.strip() if given is not None else None
    if not valid_request_id(request_id):
        request_id = uuid.uuid4().hex
    assert request_id is not None
    parent = parse_traceparent(request.headers.get("traceparent"))
    tracestate = None
    if parent is not None and "tracestate" in request.headers:
        tracestate = parse_tracestate(request.headers.getall("tracestate"))
    caller = Caller(request_id, parent, tracestate)
    request[_CALLER] = caller
    request["request_id"] = request_id
    return caller


async def stamp_response(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: X-Request-Id, and traceparent (tracestate) on every answer."""
    caller = caller_of(request)
    headers = response.headers
    headers[REQUEST_ID_HEADER] = caller.request_id
    traceparent = caller.answered_as
    if traceparent is None and caller.parent is not None:
        # No span of ours: continue the caller's trace under a new parent id, once.
        traceparent = caller.answered_as = caller.parent.child().header()
    if traceparent is not None:
        headers["traceparent"] = traceparent
        if caller.tracestate is not None:
            headers["tracestate"] = caller.tracestate
