"""A module worker's model in a process of its own: ProcessRunner, one child per worker.

PARD runs one worker per container (§4.1, §5.1), so a module's capacity grows with its
workers. Threads of one Python process fall short of that: on a 16-core host, 16 workers
as threads ran their batches at 1.4-1.5x the profiled time while the process used 2.4-8
cores, their batch building and bookkeeping sharing one GIL. A ProcessRunner keeps a
worker's onnxruntime session, with its own intra-op threads, in a child process. The
decisions (the DEPQ, PARD's decision at t_b, the batch size rule, the WorkerScaler) stay in
the parent, unchanged: only "run this batch on a session" crosses over. It is a
ModelRunner, so a module worker runs it from its replica's thread as it runs an OnnxModel.

Start (the worker's cold start, off the serving path: the executor builds a new worker in
a thread of its own). The child comes from multiprocessing's "spawn" context, a fresh
interpreter, never a fork of a process whose onnxruntime or BLAS threads are up. It builds
its OnnxModel, warms it up, runs one probe for its output's shape, and reports ready; the
parent then maps two shared buffers, one for the batch and one for the output, each sized
for the module's largest feasible batch, and hands their descriptors to the child.

Batches. The module worker stacks a batch's inputs straight into the input buffer
(`batch_buffer`), so the batch is written once, as it was in the thread version; a frame
of a few dozen bytes on a duplex pipe (a socketpair) says "run these rows"; the child runs
the session on the buffer in place, writes the output into the output buffer and answers
with its shape and the model's own time; the parent copies the output out (kilobytes: the
shipped models' outputs are < 8 KB a row). A worker runs one batch at a time (the module
dispatches to idle workers only), so each direction's ring holds one slot. The buffers are
memfd mappings, not /dev/shm names: nothing is left behind when a process dies, and a
container's small /dev/shm (Docker's 64 MB; 16 workers of object detection at batch 32
hold 300 MB) is not in the way. A batch that does not fit (larger than the largest
feasible size, another shape or dtype), or an output larger than its buffer, travels
inline on the pipe instead; ``transport="pipe"`` sends every batch that way. Measured with
``python -m loadtests.bench_worker_hop`` (README): shared buffers cost a fixed round trip
per batch, the pipe that plus the batch's bytes through the kernel, several times more
from 3x224x224 x 8 on.

Failure. A child that dies (kill -9, out of memory, a crash inside onnxruntime) closes
its end of the pipe, so the parent's wait for the batch ends at once with WorkerLost; a
child that does not answer within `answer_timeout_s` is killed, with the same outcome.
The module worker fails that batch's requests and calls `restart()` (a new child, cold
start included). A child whose parent dies sees the pipe close while it waits for its next
batch and exits; closing a runner closes its end of the pipe the same way (the child ends
after its running batch, and is killed if it has not within a few seconds); the child is a
daemon process, terminated when the parent exits normally, and one whose runner is
collected unclosed is killed.

Messages. Starting: pickled tuples (multiprocessing's Connection)::

    child  -> parent   ("ready", info) | ("error", "config" | "start", message)
    parent -> child    ("buffers", (in_bytes, out_bytes) | None) [two descriptors, SCM_RIGHTS]
    child  -> parent   ("mapped",)

then fixed frames on the same socket, `_HEAD` and a tail (on a 2-core VM, the median of
2,000 round trips was 31 µs with pickled tuples and Connection.poll, 14 µs with frames)::

    parent -> child    RUN  shape, dtype, inline  [the batch's bytes when inline]
    child  -> parent   OK   shape, dtype, inline, the model's ns  [the output when inline]
                     | FAILED  the message
"""

from __future__ import annotations

import logging
import math
import mmap
import multiprocessing
import os
import signal
import socket
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

import numpy as np

from taskserver.pipeline.config import ModuleConfig
from taskserver.pipeline.errors import InferenceFailed, PipelineConfigError, WorkerLost

__all__ = ["TRANSPORTS", "ProcessRunner", "shared_buffers_available"]

TRANSPORTS: tuple[str, ...] = ("shared", "pipe")

log = logging.getLogger(__name__)

_STOP_WAIT_S = 5.0  # a child asked to stop gets this long before it is killed
_HEAD = struct.Struct("<cB?B")  # kind, dimensions, inline, dtype length
_RUN, _OK, _FAILED = b"R", b"O", b"F"


def shared_buffers_available() -> bool:
    """Whether this platform has anonymous shared files (memfd, Linux)."""
    return hasattr(os, "memfd_create")


def _shared_buffer(size: int, name: str) -> tuple[int, mmap.mmap]:
    """An anonymous shared file of `size` bytes and its mapping here."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def _close_map(mapping: mmap.mmap | None) -> None:
    if mapping is None:
        return
    try:
        mapping.close()
    except BufferError:  # an array still views it: unmapped when that one goes
        pass


def _send_raw(sock: socket.socket, array: np.ndarray) -> None:
    sock.sendall(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _recv_raw(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from the socket; EOFError if the other end closed first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the other end closed the pipe")
        got += n


def _read(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    _recv_raw(sock, memoryview(data))
    return data


def _send_frame(
    sock: socket.socket, kind: bytes, shape: tuple[int, ...], dtype: str, inline: bool, value: int
) -> None:
    """A frame: `_HEAD`, the dtype's name, then `value` and the shape as int64s."""
    name = dtype.encode()
    tail = struct.pack(f"<q{len(shape)}q", value, *shape)
    sock.sendall(_HEAD.pack(kind, len(shape), inline, len(name)) + name + tail)


def _read_frame(sock: socket.socket) -> tuple[bytes, tuple[int, ...], str, bool, int]:
    kind, ndim, inline, size = _HEAD.unpack(_read(sock, _HEAD.size))
    tail = _read(sock, size + 8 * (ndim + 1))
    value, *shape = struct.unpack_from(f"<q{ndim}q", tail, size)
    return kind, tuple(shape), tail[:size].decode(), inline, value


def _send_failed(sock: socket.socket, message: str) -> None:
    text = message.encode()
    _send_frame(sock, _FAILED, (), "", False, len(text))
    sock.sendall(text)


def _exit_text(process: BaseProcess) -> str:
    process.join(1.0)
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _reap(process: BaseProcess, conn: Connection) -> None:
    """Kill a child whose runner was dropped without close() (a finalizer: no self)."""
    conn.close()
    if process.is_alive():
        process.kill()
        process.join(_STOP_WAIT_S)


class ProcessRunner:
    """A ModelRunner whose OnnxModel runs in a child process (module docstring)."""

    def __init__(
        self,
        module: ModuleConfig,
        providers: Sequence[str],
        *,
        intra_op_threads: int = 1,
        allow_spinning: bool = False,
        transport: str = "shared",
        start_timeout_s: float = 120.0,
        answer_timeout_s: float = 60.0,
        wait: bool = True,
    ) -> None:
        """Start the child; with `wait`, block until it is loaded and warm (else wait_ready).

        PipelineConfigError when the model cannot be loaded there (as OnnxModel raises).
        """
        if transport not in TRANSPORTS:
            raise PipelineConfigError(f"worker transport: one of {TRANSPORTS}, got {transport!r}")
        if transport == "shared" and not shared_buffers_available():
            transport = "pipe"
        self.module = module
        self.transport = transport
        self.start_timeout_s = start_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self._spec = (module, tuple(providers), intra_op_threads, allow_spinning)
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._sock: socket.socket | None = None
        self._in: mmap.mmap | None = None
        self._out: mmap.mmap | None = None
        self._lent: np.ndarray | None = None  # the view batch_buffer handed out last
        self._finalizer: Any = None
        self._lost: str | None = None  # why the child is gone, once it is
        self._started_at = 0.0
        # What the child reports when ready (the ModelRunner attributes).
        self.provider = ""
        self.input_shape: tuple[int, ...] = ()
        self.input_dtype = np.dtype(np.float32)
        self.output_name = ""
        self.pid: int | None = None
        self.load_s = 0.0  # the child's session build
        self.warm_s = 0.0  # its warm-up runs
        self.start_s = 0.0  # spawn to ready, buffers mapped: the worker's cold start
        self.starts = 0
        self.batches = 0
        self.exec_ns = 0  # the model's time, measured in the child
        self.hop_ns = 0  # the rest of run(): messages, copies, wake-ups
        self._spawn()
        if wait:
            self.wait_ready()

    # ---- life cycle ---------------------------------------------------------------------

    def _spawn(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=_child_main,
            args=(child_end, *self._spec),
            name=f"tailgate-worker-{self.module.name}",
            daemon=True,
        )
        self._started_at = time.perf_counter()
        try:
            process.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()  # the child's end lives in the child alone: its death is EOF here
        self._process = process
        self._conn = parent_end
        self._sock = socket.fromfd(parent_end.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
        self._finalizer = weakref.finalize(self, _reap, process, parent_end)
        self._lost = None
        self.pid = process.pid

    def wait_ready(self) -> None:
        """Block until the child is loaded, warm and mapped; PipelineConfigError if it fails."""
        with self._lock:
            self._wait_ready()

    def _wait_ready(self) -> None:
        conn, process = self._conn, self._process
        assert conn is not None and process is not None
        label, pid = self.module.label, process.pid
        try:
            if not conn.poll(self.start_timeout_s):
                self._shut()
                raise PipelineConfigError(
                    f"module {label}: worker process not ready within {self.start_timeout_s:g} s"
                )
            reply = conn.recv()
        except (EOFError, OSError):
            why = _exit_text(process)
            self._shut()
            raise PipelineConfigError(
                f"module {label}: worker process {pid} ended while starting ({why}; its "
                f"error is on stderr; a script that starts process workers needs the "
                f"`if __name__ == '__main__':` guard of multiprocessing's spawn)"
            ) from None
        if reply[0] == "error":
            self._shut()
            _, kind, message = reply
            if kind == "config":
                raise PipelineConfigError(message)
            raise PipelineConfigError(f"module {label}: worker process failed to start: {message}")
        info = reply[1]
        self.provider = info["provider"]
        self.input_shape = tuple(info["input_shape"])
        self.input_dtype = np.dtype(info["input_dtype"])
        self.output_name = info["output_name"]
        self.load_s, self.warm_s = info["load_s"], info["warm_s"]
        try:
            self._map(info)
        except (EOFError, OSError) as exc:
            why = _exit_text(process)
            self._shut()
            raise PipelineConfigError(
                f"module {label}: worker process {pid} failed mapping its buffers ({why}): {exc}"
            ) from exc
        assert self._sock is not None
        self._sock.settimeout(self.answer_timeout_s)  # from here on, frames on the socket
        self.start_s = time.perf_counter() - self._started_at
        self.starts += 1

    def _map(self, info: dict[str, Any]) -> None:
        """Buffers for the largest feasible batch and its output, shared with the child."""
        conn, sock = self._conn, self._sock
        assert conn is not None and sock is not None
        if self.transport == "pipe":
            conn.send(("buffers", None))
        else:
            self._share(info)
        if not conn.poll(self.start_timeout_s):
            raise OSError("no answer to the buffers")
        if conn.recv() != ("mapped",):
            raise OSError("an unexpected answer to the buffers")

    def _share(self, info: dict[str, Any]) -> None:
        most = self.module.batch_sizes[-1]
        row_in = math.prod(self.input_shape) * self.input_dtype.itemsize
        row_out = math.prod(info["output_row"]) * np.dtype(info["output_dtype"]).itemsize
        sizes = (max(most * row_in, 1), max(most * row_out, 1))
        tag = f"tailgate-{self.module.id}"
        fd_in, self._in = _shared_buffer(sizes[0], f"{tag}-in")
        try:
            fd_out, self._out = _shared_buffer(sizes[1], f"{tag}-out")
        except BaseException:
            os.close(fd_in)
            raise
        conn, sock = self._conn, self._sock
        assert conn is not None and sock is not None
        try:
            conn.send(("buffers", sizes))
            sendfds(sock, [fd_in, fd_out])
        finally:
            os.close(fd_in)
            os.close(fd_out)

    def restart(self) -> None:
        """Replace the child (after WorkerLost) with a new one, loaded and warm."""
        with self._lock:
            self._shut()
            self._spawn()
            self._wait_ready()
        log.info(
            "module %s: worker process %s started in %.2f s",
            self.module.label,
            self.pid,
            self.start_s,
        )

    def close(self) -> None:
        """Stop the child (a clean stop, killed after a few seconds) and unmap the buffers."""
        with self._lock:
            self._shut()

    def _shut(self) -> None:
        process, conn = self._process, self._conn
        if process is not None and conn is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            if self._sock is not None:
                self._sock.close()
            conn.close()  # the child reads the end of its pipe: it stops after its batch
            process.join(_STOP_WAIT_S)
            if process.is_alive():
                process.kill()
                process.join(_STOP_WAIT_S)
            if process.exitcode is not None:
                process.close()
        self._process = self._conn = self._sock = None
        self._lent = None
        _close_map(self._in)
        _close_map(self._out)
        self._in = self._out = None
        self._lost = self._lost or "closed"

    @property
    def alive(self) -> bool:
        """Whether the child is running and ready for batches."""
        return self._lost is None and self._process is not None and self._process.is_alive()

    # ---- batches ------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Seconds the child spent warming up (it warms up before it reports ready)."""
        return self.warm_s

    def batch_buffer(self, n: int) -> np.ndarray | None:
        """A view of the shared input buffer for `n` rows to build a batch in, or None."""
        shape = (n, *self.input_shape)
        if self._in is None or math.prod(shape) * self.input_dtype.itemsize > len(self._in):
            return None
        self._lent = np.ndarray(shape, self.input_dtype, buffer=self._in)
        return self._lent

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch in the child; InferenceFailed if the model fails, WorkerLost if the
        child dies or does not answer in time."""
        with self._lock:
            return self._run(batch)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        sock, process = self._sock, self._process
        if sock is None or process is None or self._lost is not None:
            raise WorkerLost(f"module {self.module.label}: worker process {self._lost or 'gone'}")
        start = time.perf_counter_ns()
        lent, self._lent = self._lent, None
        inline = True
        if lent is not None and batch is lent:
            inline = False
        elif self._in is not None and batch.dtype == self.input_dtype:
            if batch.shape[1:] == self.input_shape and batch.nbytes <= len(self._in):
                np.ndarray(batch.shape, batch.dtype, buffer=self._in)[...] = batch
                inline = False
        try:
            _send_frame(sock, _RUN, batch.shape, batch.dtype.str, inline, 0)
            if inline:
                _send_raw(sock, batch)
            kind, shape, dtype, inline_out, value = _read_frame(sock)
            if kind == _FAILED:
                raise InferenceFailed(_read(sock, value).decode(errors="replace"))
            dt = np.dtype(dtype)
            if inline_out:
                data = _read(sock, math.prod(shape) * dt.itemsize)
                output = np.frombuffer(data, dt).reshape(shape)
            else:
                assert self._out is not None
                output = np.ndarray(shape, dt, buffer=self._out).copy()
        except TimeoutError as exc:
            process.kill()
            why = f"did not answer within {self.answer_timeout_s:g} s (killed)"
            raise self._lose(why, len(batch)) from exc
        except (EOFError, OSError) as exc:
            raise self._lose(_exit_text(process), len(batch)) from exc
        took = time.perf_counter_ns() - start
        self.batches += 1
        self.exec_ns += value
        self.hop_ns += took - value
        return output

    def _lose(self, why: str, rows: int) -> WorkerLost:
        pid = self._process.pid if self._process is not None else None
        self._lost = f"{pid} lost ({why})"
        return WorkerLost(
            f"module {self.module.label}: worker process {pid} {why} while running a batch "
            f"of {rows}"
        )

    def __repr__(self) -> str:
        return f"ProcessRunner({self.module.label}, pid={self.pid}, provider={self.provider!r})"


# ---- the child ------------------------------------------------------------------------------


def _child_main(
    conn: Connection,
    module: ModuleConfig,
    providers: tuple[str, ...],
    intra_op_threads: int,
    allow_spinning: bool,
) -> None:
    """The child's life: load, warm up, report ready, then run batches until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the parent's to handle
    from taskserver.pipeline.sessions import OnnxModel

    try:
        started = time.perf_counter()
        model = OnnxModel(
            module, providers, intra_op_threads=intra_op_threads, allow_spinning=allow_spinning
        )
        load_s = time.perf_counter() - started
        warm_s = model.warm_up()
        probe = model.run(np.zeros((1, *model.input_shape), dtype=model.input_dtype))
    except PipelineConfigError as exc:
        reply: tuple[Any, ...] = ("error", "config", str(exc))
    except Exception as exc:  # anything else the session raised: the parent says so
        reply = ("error", "start", f"{type(exc).__name__}: {exc}")
    else:
        info = {
            "provider": model.provider,
            "input_shape": model.input_shape,
            "input_dtype": model.input_dtype.str,
            "output_name": model.output_name,
            "output_row": probe.shape[1:],
            "output_dtype": probe.dtype.str,
            "load_s": load_s,
            "warm_s": warm_s,
        }
        reply = ("ready", info)
    try:
        conn.send(reply)
        if reply[0] != "ready":
            return
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            _serve(conn, sock, model)
    except (EOFError, OSError):
        pass  # the parent closed the pipe (a stop) or is gone: either way, we end


def _serve(conn: Connection, sock: socket.socket, model: Any) -> None:
    _, sizes = conn.recv()
    shared_in: mmap.mmap | None = None
    shared_out: mmap.mmap | None = None
    if sizes is not None:
        fds = recvfds(sock, 2)
        try:
            shared_in = mmap.mmap(fds[0], sizes[0])
            shared_out = mmap.mmap(fds[1], sizes[1])
        finally:
            for fd in fds:
                os.close(fd)
    conn.send(("mapped",))
    scratch = bytearray()
    while True:
        _, shape, dtype, inline, _ = _read_frame(sock)
        dt = np.dtype(dtype)
        if inline:
            size = math.prod(shape) * dt.itemsize
            if len(scratch) < size:
                scratch = bytearray(size)
            view = memoryview(scratch)[:size]
            _recv_raw(sock, view)
            batch = np.frombuffer(view, dt).reshape(shape)
        else:
            batch = np.ndarray(shape, dt, buffer=shared_in)
        start = time.perf_counter_ns()
        try:
            output = model.run(batch)
        except InferenceFailed as exc:
            _send_failed(sock, str(exc))
            continue
        except Exception as exc:  # a runner's own bug: the batch fails, the child serves on
            _send_failed(sock, f"module {model.module.label}: {exc!r}")
            continue
        exec_ns = time.perf_counter_ns() - start
        del batch
        output = np.ascontiguousarray(output)
        if shared_out is not None and output.nbytes <= len(shared_out):
            np.ndarray(output.shape, output.dtype, buffer=shared_out)[...] = output
            _send_frame(sock, _OK, output.shape, output.dtype.str, False, exec_ns)
        else:
            _send_frame(sock, _OK, output.shape, output.dtype.str, True, exec_ns)
            _send_raw(sock, output)
