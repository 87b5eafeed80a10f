"""W3C Trace Context (https://www.w3.org/TR/trace-context/): `traceparent` and `tracestate`.

Pure parsing and formatting, no OpenTelemetry: the gateway reads both headers from its
clients with or without the `tracing` extra, and both travel to the task servers in the
Task message (tailgate.thrift). One rule, one place: the gateway's HTTP shell and the task
server's wire both call these.

An invalid value is never an error: the spec says to ignore it (a traceparent that does not
parse starts a new trace; a tracestate that does not parse, or comes without a valid
traceparent, is dropped, never passed on).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MAX_TRACESTATE_CHARS",
    "MAX_TRACESTATE_MEMBERS",
    "TRACEPARENT_CHARS",
    "TraceParent",
    "new_span_id",
    "parse_traceparent",
    "parse_tracestate",
]

TRACEPARENT_CHARS = 55
"""Length of a version-00 traceparent: 2 + 1 + 32 + 1 + 16 + 1 + 2."""
MAX_TRACESTATE_CHARS = 512
"""Longest tracestate kept (the spec asks every vendor to pass on at least 512 characters);
a longer one is dropped whole rather than cut, since cutting could split a member."""
MAX_TRACESTATE_MEMBERS = 32
"""Most list members a tracestate may hold (W3C §3.3.1.1)."""

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_HEX2 = re.compile(r"[0-9a-f]{2}")
# version 00: exactly version-traceid-parentid-flags, lower-case hex only.
_V00 = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY = re.compile(
    r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
)
# printable ASCII but "," and "="; no trailing space.
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed traceparent: whose trace, which span is the parent, and its flags."""

    trace_id: str
    """32 lower-case hex digits, not all zero."""
    parent_id: str
    """16 lower-case hex digits, not all zero: the caller's span."""
    flags: int = 1
    """Trace flags; bit 0 is `sampled`."""

    @property
    def sampled(self) -> bool:
        """The caller records this trace (and asks that we do too)."""
        return bool(self.flags & 1)

    def header(self) -> str:
        """As a version-00 traceparent header value."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags & 0xFF:02x}"

    def child(self, span_id: str | None = None) -> TraceParent:
        """The same trace with a new parent (a span of ours), flags kept."""
        return TraceParent(self.trace_id, span_id or new_span_id(), self.flags)


def new_span_id() -> str:
    """A random span id (16 hex digits, not all zero)."""
    while True:
        span_id = os.urandom(8).hex()
        if span_id != _ZERO_SPAN:
            return span_id


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The traceparent in a header value, or None when it is missing or invalid (W3C §3.2).

    Version 00 must be exactly 55 characters. A higher version (not ff) is read by its first
    55 characters when the next one, if any, is "-" (§4.3: a newer version only appends
    fields). Hex is lower case; an all-zero trace id or parent id is invalid.
    """
    if value is None:
        return None
    value = value.strip(" \t")
    if len(value) < TRACEPARENT_CHARS:
        return None
    version = value[:2]
    if not _HEX2.fullmatch(version) or version == "ff":
        return None
    if version == "00":
        if len(value) != TRACEPARENT_CHARS:
            return None
    elif len(value) > TRACEPARENT_CHARS and value[TRACEPARENT_CHARS] != "-":
        return None
    m = _V00.fullmatch(value[:TRACEPARENT_CHARS])
    if m is None:
        return None
    _, trace_id, parent_id, flags = m.groups()
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, int(flags, 16))


def parse_tracestate(values: str | Iterable[str] | None) -> str | None:
    """The tracestate of one or more header values, normalised ("k=v,k2=v2"), or None when
    there is none or it is invalid: a bad member, a key given twice, more than
    MAX_TRACESTATE_MEMBERS members or more than MAX_TRACESTATE_CHARS characters (W3C §3.3).

    Several header lines are one list, in order (RFC 9110 §5.3). Empty members are allowed
    and dropped.
    """
    if values is None:
        return None
    joined = values if isinstance(values, str) else ",".join(values)
    if len(joined) > 4 * MAX_TRACESTATE_CHARS:
        return None  # far too long to be worth reading
    members: list[str] = []
    keys: set[str] = set()
    for raw in joined.split(","):
        member = raw.strip(" \t")
        if not member:
            continue
        key, sep, val = member.partition("=")
        if not sep or not _KEY.fullmatch(key) or not _VALUE.fullmatch(val) or key in keys:
            return None
        keys.add(key)
        members.append(f"{key}={val}")
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    out = ",".join(members)
    return out if len(out) <= MAX_TRACESTATE_CHARS else None
