"""The Thrift wire: framed binary messages over one duplex asyncio connection.

Why not thriftpy2's own async client and server: a ``TAsyncClient`` carries
one call at a time (thousands of outstanding tasks would need thousands of
sockets) and its pure-Python protocol costs ~28 µs per message. Here every
message is a standard Thrift message (TFramedTransport framing, strict
TBinaryProtocol, encoded by thriftpy2's Cython protocol in ~3 µs), but the
connection is duplex and multiplexed: oneway ``submit`` calls flow one way,
oneway ``result`` messages and the replies of two-way calls flow back, and
any number of tasks can be outstanding. A stock framed Thrift client can still
call ``status`` and ``ping``.

Every frame is bounds-checked before it is decoded (taskserver.framecheck): thriftpy2
trusts declared lengths, so a 25-byte frame could otherwise declare a list of 2**31 tasks.
A frame that fails the check, does not decode, or holds a message this side does not take
closes the connection; the connection reports it once through ``on_violation``, for the
owner's log and metrics.

Errors::

    WireError                 base of everything raised here
    ├── ProtocolViolation     a peer sent bytes that are not our Thrift messages (.reason)
    └── ConnectionClosed      the connection is gone; outstanding calls fail
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from enum import IntEnum
from functools import cache
from operator import attrgetter
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import thriftpy2
from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport import TCyMemoryBuffer

from taskserver.framecheck import WireLimits, check_frame

log = logging.getLogger(__name__)

IDL_PATH = Path(__file__).with_name("tailgate.thrift")
DEFAULT_LIMITS = WireLimits()
MAX_FRAME_BYTES = DEFAULT_LIMITS.max_frame_bytes
_DEFAULT_BUF = 4096  # thriftpy2's own initial buffer size
MAX_BATCH_BYTES = 1 << 20
"""A batch of tasks or results larger than this (payloads and results, ~128 bytes for the
other fields) is sent in several frames, so a burst never builds a frame that a peer's
max_frame_bytes (a few MiB at least) refuses."""
_LEN = struct.Struct("!i")

CALL = TMessageType.CALL
REPLY = TMessageType.REPLY
EXCEPTION = TMessageType.EXCEPTION
ONEWAY = TMessageType.ONEWAY
INVALID_MESSAGE_TYPE = TApplicationException.INVALID_MESSAGE_TYPE
"""TApplicationException kind: a method sent with the wrong message type."""


class WireError(Exception):
    """Base of the wire errors."""


class ProtocolViolation(WireError):
    """The peer sent a frame that is not one of our messages; ``reason`` says how, in one word
    (a metric label): frame_length, header, truncated, type, string_length,
    container_length, depth, trailing, undecodable, unexpected_message or bad_message."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ConnectionClosed(WireError):
    """The connection closed while calls were outstanding."""


class TaskStatus(IntEnum):
    """``TaskStatus`` of ``tailgate.thrift``: what became of a task (see the IDL's comments).

    Declared here so code names statuses, not numbers; `thrift()` checks it against the IDL
    when it loads, so the two cannot drift apart.
    """

    OK = 0
    FAILED = 1
    CANCELLED = 2
    REJECTED = 3
    DROPPED = 4

    @property
    def label(self) -> str:
        """The lower-case name the API and metrics use ("ok", "failed", ...)."""
        return self.name.lower()


@cache
def thrift() -> ModuleType:
    """The module generated from ``tailgate.thrift`` (loaded once, on first use)."""
    module = thriftpy2.load(str(IDL_PATH), module_name="tailgate_thrift")
    idl = dict(module.TaskStatus._NAMES_TO_VALUES)
    ours = {s.name: s.value for s in TaskStatus}
    if idl != ours:
        raise RuntimeError(f"TaskStatus in {IDL_PATH.name} is {idl}, wire.TaskStatus is {ours}")
    return module


@cache
def status_names() -> dict[int, str]:
    """TaskStatus values -> their lower-case names ("ok", "failed", ...)."""
    thrift()  # checked against the IDL
    return {s.value: s.label for s in TaskStatus}


def encode_message(name: str, mtype: int, seqid: int, body: Any, size_hint: int = 0) -> bytes:
    """Encode one framed Thrift message (4-byte length + binary message).

    `size_hint`: about how many bytes it takes; a buffer of that size up front saves the
    regrowing copies of a large one (a pipeline hand-off carries a ~600 KB frame).
    """
    buf = TCyMemoryBuffer() if size_hint <= _DEFAULT_BUF else TCyMemoryBuffer(buf_size=size_hint)
    proto = TCyBinaryProtocol(buf)
    proto.write_message_begin(name, mtype, seqid)
    proto.write_struct(body)
    proto.write_message_end()
    data = buf.getvalue()
    return _LEN.pack(len(data)) + data


def decode_message(
    frame: bytes, body_types: dict[tuple[str, int], type], limits: WireLimits = DEFAULT_LIMITS
) -> tuple[str, int, int, Any]:
    """Decode a frame's message into (name, type, seqid, body); ProtocolViolation if the frame
    is not safe to decode (taskserver.framecheck) or not a message of `body_types`."""
    refused = check_frame(frame, limits)
    if refused is not None:
        raise ProtocolViolation(*refused)
    proto = TCyBinaryProtocol(TCyMemoryBuffer(frame))
    try:
        name, mtype, seqid = proto.read_message_begin()
        if mtype == EXCEPTION:
            body: Any = TApplicationException()
        else:
            cls = body_types.get((name, mtype))
            if cls is None:
                raise ProtocolViolation(
                    "unexpected_message", f"{name!r} of type {mtype} is not taken here"
                )
            body = cls()
        proto.read_struct(body)
        proto.read_message_end()
    except ProtocolViolation:
        raise
    except Exception as exc:  # thriftpy2 raises assorted decode errors
        raise ProtocolViolation("undecodable", str(exc)) from exc
    return name, mtype, seqid, body


@cache
def server_body_types() -> dict[tuple[str, int], type]:
    """What a task server receives: TaskServer calls (oneway or two-way)."""
    svc = thrift().TaskServer
    types: dict[tuple[str, int], type] = {}
    for name in svc.thrift_services:
        args = getattr(svc, f"{name}_args")
        types[(name, CALL)] = args
        types[(name, ONEWAY)] = args
    return types


@cache
def gateway_body_types() -> dict[tuple[str, int], type]:
    """What the gateway receives: TaskSink messages and replies to TaskServer calls."""
    sink, svc = thrift().TaskSink, thrift().TaskServer
    types: dict[tuple[str, int], type] = {}
    for name in sink.thrift_services:
        types[(name, ONEWAY)] = getattr(sink, f"{name}_args")
        types[(name, CALL)] = getattr(sink, f"{name}_args")
    for name in svc.thrift_services:
        result = getattr(svc, f"{name}_result", None)
        if result is not None:
            types[(name, REPLY)] = result
    return types


MessageHandler = Callable[[str, int, int, Any], None]
FrameDecoder = Callable[[bytes], "list[Any] | None"]
"""Takes a frame whole (its items), or gives None for the general decoding."""
ViolationHandler = Callable[[ProtocolViolation, str], None]
"""Told of a frame that closed the connection: the violation and the peer's address."""


def _log_violation(violation: ProtocolViolation, peer: str) -> None:
    log.warning("closed the connection from %s: %s", peer, violation)


class Batcher:
    """How one kind of oneway item is coalesced: ``single`` for one, ``batch`` for many.

    ``Batcher.submit()`` sends tasks as ``submit``/``submit_batch``; ``Batcher.result()``
    sends results as ``result``/``result_batch``. A batch saves a message header and a
    frame per item, and the peer decodes the whole list in one C call.
    """

    __slots__ = (
        "batch_args",
        "batch_field",
        "batch_name",
        "blob",
        "single_args",
        "single_field",
        "single_name",
    )

    def __init__(
        self, svc: Any, single: str, single_field: str, batch: str, batch_field: str, blob: str
    ) -> None:
        self.single_name, self.single_args = single, getattr(svc, f"{single}_args")
        self.single_field = single_field
        self.batch_name, self.batch_args = batch, getattr(svc, f"{batch}_args")
        self.batch_field = batch_field
        self.blob = attrgetter(blob)
        """An item's part that can be large (a task's payload, a result's result)."""

    @classmethod
    def submit(cls) -> Batcher:
        """Tasks from the gateway to a task server."""
        return cls(thrift().TaskServer, "submit", "task", "submit_batch", "tasks", "payload")

    @classmethod
    def result(cls) -> Batcher:
        """Results from a task server back to the gateway."""
        return cls(thrift().TaskSink, "result", "result", "result_batch", "results", "result")

    def encode(self, items: list[Any]) -> bytes:
        """Framed oneway messages carrying the items, in order: one, unless the items hold
        more than MAX_BATCH_BYTES, which go in frames of about that size (a peer refuses a
        frame above its max_frame_bytes; an item alone is never split)."""
        # The common case, summed in C (map, filter, len): it all fits in one frame.
        total = sum(map(len, filter(None, map(self.blob, items)))) + 128 * len(items)
        if total <= MAX_BATCH_BYTES:
            return self._encode_one(items, total)
        sizes = [len(self.blob(item) or b"") + 128 for item in items]
        frames: list[bytes] = []
        start, total = 0, 0
        for i, size in enumerate(sizes):
            if total and total + size > MAX_BATCH_BYTES:
                frames.append(self._encode_one(items[start:i], total))
                start, total = i, 0
            total += size
        frames.append(self._encode_one(items[start:], total))
        return b"".join(frames)

    def _encode_one(self, items: list[Any], hint: int) -> bytes:
        if len(items) == 1:
            body = self.single_args(**{self.single_field: items[0]})
            return encode_message(self.single_name, ONEWAY, 0, body, hint)
        body = self.batch_args(**{self.batch_field: items})
        return encode_message(self.batch_name, ONEWAY, 0, body, hint)


class ItemEncoder(Protocol):
    """What a connection's batched oneway items are encoded by (a Batcher, or the gateway's
    task writer, gateway.hotpath.TaskFrames)."""

    def encode(self, items: list[Any]) -> bytes:
        """Framed oneway messages carrying the items, in order."""
        ...


def _expire(fut: asyncio.Future[Any]) -> None:
    """A call's timer: no reply came in time."""
    if not fut.done():
        fut.set_exception(TimeoutError())


class ThriftConnection(asyncio.Protocol):
    """One duplex framed-Thrift connection.

    Incoming messages go to ``on_message(name, type, seqid, body)``; outgoing
    ones are queued by ``send`` and written once per event-loop iteration, so a
    burst of tasks or results costs one syscall, not one per message.
    """

    # Slots, not a __dict__: every task and every result frame reads the connection's
    # state, on the gateway for each of a fanout's links in turn (see gateway.links.ServerLink).
    __slots__ = (
        "__weakref__",  # a weak reference tells whether a closed one was freed (tests)
        "_batcher",
        "_body_types",
        "_buf",
        "_calls",
        "_fast_decode",
        "_flush_scheduled",
        "_items",
        "_limits",
        "_max_frame",
        "_on_fast",
        "_on_lost",
        "_on_message",
        "_on_violation",
        "_out",
        "_seqid",
        "closed",
        "transport",
        "violation",
    )

    def __init__(
        self,
        body_types: dict[tuple[str, int], type],
        on_message: MessageHandler,
        on_lost: Callable[[Exception | None], None] | None = None,
        batcher: ItemEncoder | None = None,
        *,
        limits: WireLimits = DEFAULT_LIMITS,
        on_violation: ViolationHandler | None = None,
        fast_frames: tuple[FrameDecoder, Callable[[list[Any]], None]] | None = None,
    ) -> None:
        self._body_types = body_types
        self._batcher = batcher
        self._fast_decode, self._on_fast = fast_frames or (None, None)
        """A decoder that takes the common frames whole without Thrift objects, and the
        handler of what it took (the gateway's result frames: gateway.hotpath)."""
        self._items: list[Any] = []
        self._on_message = on_message
        self._on_lost = on_lost
        self._limits = limits
        self._max_frame = limits.max_frame_bytes
        self._on_violation = on_violation or _log_violation
        self.violation: ProtocolViolation | None = None
        """What closed this connection, if the peer broke the protocol."""
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._seqid = 0
        self._calls: dict[int, asyncio.Future[Any]] = {}

    # -- asyncio.Protocol -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        fast = self._fast_decode
        try:
            while end - pos >= 4:
                (size,) = _LEN.unpack_from(buf, pos)
                if size <= 0 or size > self._max_frame:
                    raise ProtocolViolation(
                        "frame_length", f"{size} bytes (1..{self._max_frame} allowed)"
                    )
                if end - pos - 4 < size:
                    break
                frame = bytes(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                if fast is not None:
                    items = fast(frame)
                    if items is not None:
                        self._on_fast(items)  # type: ignore[misc]
                        continue
                name, mtype, seqid, body = decode_message(frame, self._body_types, self._limits)
                if mtype in (REPLY, EXCEPTION):
                    self._resolve_call(seqid, mtype, body)
                else:
                    # A handler raises ProtocolViolation for a message that decodes but
                    # breaks the contract (a submit without its task, ...).
                    self._on_message(name, mtype, seqid, body)
        except ProtocolViolation as exc:
            buf.clear()
            self._refuse(exc)
            return
        except Exception:
            # A handler bug: log it loudly, and keep the process serving its other peers.
            log.exception("closed the connection from %s: handler failed", self.peer)
            buf.clear()
            self.abort()
            return
        del buf[:pos]

    @property
    def peer(self) -> str:
        """The peer's address, host:port (or "?" before or without a socket)."""
        addr = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(addr, tuple) and len(addr) >= 2:
            return f"{addr[0]}:{addr[1]}"
        return "?"

    def _refuse(self, violation: ProtocolViolation) -> None:
        """Close the connection on a peer that broke the protocol, and say so once."""
        if self.violation is None:
            violation.__traceback__ = None  # keeps no frame (and this connection) alive
            self.violation = violation
            self._on_violation(violation, self.peer)
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self._items.clear()
        err = ConnectionClosed(f"connection lost: {exc}" if exc else "connection closed")
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(err)
        if self._on_lost is not None:
            self._on_lost(exc)

    # -- sending ----------------------------------------------------------
    def send(self, name: str, mtype: int, seqid: int, body: Any) -> None:
        """Queue one message; it is written at the end of this loop iteration."""
        if self.closed:
            raise ConnectionClosed("connection is closed")
        if self._items:
            self._seal_items()  # keep the order in which things were sent
        self._out.append(encode_message(name, mtype, seqid, body))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def send_item(self, item: Any) -> None:
        """Queue one item of this connection's batched oneway call (see Batcher)."""
        if self.closed:
            raise ConnectionClosed("connection is closed")
        self._items.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _seal_items(self) -> None:
        assert self._batcher is not None, "send_item needs a Batcher"
        items, self._items = self._items, []
        self._out.append(self._batcher.encode(items))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._items and not self.closed:
            self._seal_items()
        if self.closed or self.transport is None or not self._out:
            self._out.clear()
            self._items.clear()
            return
        out, self._out = self._out, []
        self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    async def call(self, name: str, args: Any, timeout_s: float) -> Any:
        """A two-way call: send ``name`` and wait for its reply's success value; TimeoutError
        when none came within timeout_s."""
        self._seqid = (self._seqid + 1) & 0x7FFFFFFF
        seqid = self._seqid
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._calls[seqid] = fut
        # One timer on the reply's own future, not asyncio.wait_for (a second future, a
        # done callback and, on 3.11, a cancellation it may swallow): the gateway's
        # heartbeats are such calls, tens a second while nothing else happens.
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            self.send(name, CALL, seqid, args)
            reply = await fut
        finally:
            timer.cancel()
            self._calls.pop(seqid, None)
        if isinstance(reply, TApplicationException):
            raise WireError(f"{name} failed on the peer: {reply.message}")
        return reply.success

    def _resolve_call(self, seqid: int, mtype: int, body: Any) -> None:
        fut = self._calls.pop(seqid, None)
        if fut is not None and not fut.done():
            fut.set_result(body)

    def reply(self, name: str, seqid: int, success: Any) -> None:
        """Answer a two-way call received by ``on_message``."""
        result_cls = getattr(thrift().TaskServer, f"{name}_result")
        self.send(name, REPLY, seqid, result_cls(success=success))

    def reply_error(self, name: str, seqid: int, kind: int, message: str) -> None:
        """Answer a call with a TApplicationException (kind: one of its type constants)."""
        self.send(name, EXCEPTION, seqid, TApplicationException(kind, message))

    def close(self) -> None:
        """Flush what is queued and close."""
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once (bad peer)."""
        if self.transport is not None and not self.closed:
            self.transport.abort()
