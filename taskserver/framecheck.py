"""Bounds check of one framed Thrift message before thriftpy2 decodes it.

Why: thriftpy2 (0.7.1) trusts declared lengths. Its Cython decoder mallocs a declared
string length before reading it, and its memory buffer returns short reads past the end
of a frame instead of failing, so ``for _ in range(size)`` runs to a declared container
size on zeros: a 25-byte frame declaring a list of 2**31 - 1 tasks grows a process by
gigabytes. Apache Thrift's own bindings have length limits; thriftpy2 has none.

What: before a frame is decoded, one walk over its bytes checks the message the way the
decoder will read it — the strict binary header, then every field, string and container
of the body, whatever its declared type — and refuses, before anything is allocated:

- a string or binary longer than what remains of the frame, or than ``max_string_bytes``;
- a list, set or map whose count times its items' smallest encoding is more than what
  remains of the frame, or whose count exceeds ``max_container_items``;
- nesting deeper than ``max_depth``, a type our peers never send (thriftpy2 skips some of
  those in zero bytes, so a declared count of them would spin), a message that ends early,
  and bytes after the message's end.

A frame that passes can be decoded: every read stays inside it, so decoding takes time
and memory in proportion to the frame's size, whatever it declares.

Why a walk, not a guarded buffer or a decoder of our own: the walk is generic (it needs
no IDL), it leaves thriftpy2's Cython decoder doing the decoding, and in C it costs a few
hundred nanoseconds a frame (``taskserver/_framecheck.c``, built at install when a C
compiler is there). This module is its reference: the same rules in Python, used when the
extension is missing, and compared with it on fuzzed inputs in the tests. ``IMPLEMENTATION``
says which one runs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from taskserver.native import require_native

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "IMPLEMENTATION",
    "WireLimits",
    "check_frame",
    "check_frame_py",
    "check_max_frame_bytes",
]

_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_VERSION_MASK = 0xFFFF0000
_VERSION_1 = 0x80010000
MAX_NAME_BYTES = 255

_MIN_SIZE = {2: 1, 3: 1, 12: 1, 6: 2, 8: 4, 11: 4, 4: 8, 10: 8, 14: 5, 15: 5, 13: 6}
"""Smallest encoding of a value of each wire type our peers send (bool, byte, struct's stop
byte, i16, i32, a string's length, double, i64, set, list, map headers)."""
_FIXED = {t: _MIN_SIZE[t] for t in (2, 3, 4, 6, 8, 10)}

DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
"""Largest frame a task server's or an edge agent's Thrift port takes by default
(``max_frame_bytes``): tasks come in ~1 MiB batches, a pipeline hand-off is ~600 KB. The
gateway takes up to WireLimits' 64 MiB from the servers it dials: a sensing range answers
up to a million readings."""


def check_max_frame_bytes(value: object) -> int:
    """`value` if it is a frame limit a server may be configured with (1 KiB..1 GiB), else
    ValueError naming ``max_frame_bytes`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 1 << 30:
        raise ValueError(f"max_frame_bytes: must be 1024..2**30, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class WireLimits:
    """What one framed message may declare; the frame's own size bounds everything first."""

    max_frame_bytes: int = 64 * 1024 * 1024
    """Largest frame a connection accepts (a pipeline hand-off carries a ~600 KB image)."""
    max_string_bytes: int = 32 * 1024 * 1024
    """Largest string or binary value."""
    max_container_items: int = 1 << 20
    """Most items in one list, set or map (a batch of tasks or results is one list)."""
    max_depth: int = 32
    """Deepest nesting of structs and containers, the message's own struct included."""

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_string_bytes", "max_container_items", "max_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")

    @classmethod
    def for_frames_of(cls, max_frame_bytes: int) -> WireLimits:
        """The default limits, with frames of at most max_frame_bytes (strings no longer)."""
        default = cls()
        return cls(
            max_frame_bytes=max_frame_bytes,
            max_string_bytes=min(default.max_string_bytes, max_frame_bytes),
        )


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


class _Walk:
    """The reference walk: one message, with the same rules and words as the C walk."""

    __slots__ = ("buf", "end", "limits", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, limits: WireLimits) -> None:
        self.buf, self.pos, self.end, self.limits = buf, 0, len(buf), limits

    def need(self, n: int, what: str) -> None:
        left = self.end - self.pos
        if left < n:
            raise _Refused("truncated", f"{what} at byte {self.pos} needs {n} bytes, {left} left")

    def i32(self) -> int:
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def message(self) -> None:
        self.need(4, "message header")
        (head,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        if head & _VERSION_MASK != _VERSION_1:
            raise _Refused("header", f"not a strict binary message (header 0x{head:08x})")
        mtype = head & 0xFF
        if not 1 <= mtype <= 4:
            raise _Refused("header", f"unknown message type {mtype}")
        self.need(4, "name length")
        n = self.i32()
        if n < 0 or n > MAX_NAME_BYTES or n > self.end - self.pos:
            raise _Refused("header", f"bad method name length {n}")
        self.pos += n
        self.need(4, "sequence id")
        self.pos += 4
        self.struct(1)
        if self.pos != self.end:
            raise _Refused(
                "trailing",
                f"{self.end - self.pos} bytes after the message's end at byte {self.pos}",
            )

    def struct(self, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise _Refused(
                "depth", f"struct at byte {self.pos} nests deeper than {self.limits.max_depth}"
            )
        buf = self.buf
        while True:
            self.need(1, "field type")
            ft = buf[self.pos]
            if ft == 0:
                self.pos += 1
                return
            if ft not in _MIN_SIZE:
                raise _Refused("type", f"unknown field type {ft} at byte {self.pos}")
            self.pos += 1
            self.need(2, "field id")
            self.pos += 2
            self.value(ft, depth)

    def value(self, t: int, depth: int) -> None:
        at = self.pos
        fixed = _FIXED.get(t)
        if fixed is not None:
            self.need(fixed, "value")
            self.pos += fixed
        elif t == 11:
            self.need(4, "string length")
            n = self.i32()
            limit = self.limits.max_string_bytes
            if n < 0:
                raise _Refused("string_length", f"negative length {n} at byte {at}")
            if n > limit:
                raise _Refused(
                    "string_length", f"length {n} at byte {at} exceeds the limit {limit}"
                )
            if n > self.end - self.pos:
                raise _Refused(
                    "string_length",
                    f"length {n} at byte {at}, {self.end - self.pos} left in the frame",
                )
            self.pos += n
        elif t == 12:
            self.struct(depth + 1)
        elif t in (14, 15):
            self.need(5, "list header")
            types = (self.buf[self.pos],)
            self.pos += 1
            self.items(types, depth, at)
        elif t == 13:
            self.need(6, "map header")
            types = (self.buf[self.pos], self.buf[self.pos + 1])
            self.pos += 2
            self.items(types, depth, at)
        else:  # pragma: no cover - value() is only called with a checked type
            raise _Refused("type", f"unknown type {t} at byte {at}")

    def items(self, types: tuple[int, ...], depth: int, at: int) -> None:
        d = depth + 1
        limits = self.limits
        if d > limits.max_depth:
            raise _Refused("depth", f"container at byte {at} nests deeper than {limits.max_depth}")
        per = fixed = 0
        for t in types:
            ms = _MIN_SIZE.get(t)
            if ms is None:
                raise _Refused("type", f"unknown element type {t} at byte {at}")
            per += ms
            fixed += ms if t in _FIXED else 0
        n = self.i32()
        left = self.end - self.pos
        if n < 0:
            raise _Refused("container_length", f"negative count {n} at byte {at}")
        if n > limits.max_container_items:
            raise _Refused(
                "container_length",
                f"count {n} at byte {at} exceeds the limit {limits.max_container_items}",
            )
        if n * per > left:
            raise _Refused(
                "container_length",
                f"count {n} at byte {at} needs at least {n * per} bytes, {left} left in the frame",
            )
        if fixed == per:  # every item of a fixed size: nothing inside to check
            self.pos += n * per
            return
        for _ in range(n):
            for t in types:
                self.value(t, d)


def check_frame_py(
    frame: bytes | bytearray | memoryview, limits: WireLimits
) -> tuple[str, str] | None:
    """None if the message in `frame` (without its 4-byte length) is safe to decode, else
    (reason, detail): reason is one of header, truncated, type, string_length,
    container_length, depth, trailing."""
    try:
        _Walk(frame, limits).message()
    except _Refused as exc:
        return exc.reason, exc.detail
    return None


try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twin
    from taskserver._framecheck import check as _c_check
except ImportError:  # built at install when a C compiler is there; the walk above otherwise
    _c_check = None

IMPLEMENTATION: Literal["c", "python"] = "python" if _c_check is None else "c"
"""Which walk check_frame runs."""


def check_frame(
    frame: bytes | bytearray | memoryview, limits: WireLimits
) -> tuple[str, str] | None:
    """check_frame_py's verdict, from the C walk when it is built."""
    if _c_check is None:
        return check_frame_py(frame, limits)
    return _c_check(frame, limits.max_string_bytes, limits.max_container_items, limits.max_depth)
