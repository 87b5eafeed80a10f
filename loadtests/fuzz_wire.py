"""Fuzz a task server's or an edge agent's Thrift port with hostile and malformed messages.

    python -m loadtests.fuzz_wire [--target taskserver|edge-agent] [--inputs 20000]
                                  [--seed 1] [--as-limit-mb 1024]

Starts the target through the CLI under an address-space limit (a regression then fails
inside the target instead of eating the machine), sends it ``--inputs`` inputs over
loopback, and reports what a hardened server must show: it never crashed, it answered a
liveness ping after every batch, every slot was free again once the tasks' budgets plus
the grace had passed (no leaked slot), its resident memory grew by less than 10 MB
(measured after a warm-up), and its log holds no traceback.

The inputs (seeded, so a failure replays): tasks whose fields are missing, of another type,
not UTF-8, NaN, infinite or huge; payloads that are deep, invalid or ask for days of
service; submits cancelled in the same write; claims with forged proofs; oneway methods
sent as calls and calls sent as oneway; frames declaring 2**31 items or a 1 GB string;
sets and maps of zero-width types; nesting past the limit; unknown methods and types;
random mutations, truncations and splices of valid frames; and garbage. Malformed inputs
go on connections the server may close (a new one is opened), well-formed ones with
hostile values on one connection kept open to the end, so their tasks run to an outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.ports import free_port
from taskserver.spawn import tailgate_argv, taskserver_argv
from taskserver.wire import (
    CALL,
    EXCEPTION,
    ONEWAY,
    REPLY,
    Batcher,
    ThriftConnection,
    WireError,
    encode_message,
    gateway_body_types,
    thrift,
)

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[1]
_I32 = struct.Struct("!i")


# -- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Input:
    """Bytes to write, and whether they may close the connection (hostile) or not (steady)."""

    data: bytes
    steady: bool
    kind: str


def _frame(body: bytes) -> bytes:
    return _I32.pack(len(body)) + body


def _head(name: bytes, mtype: int, seqid: int = 0) -> bytes:
    return struct.pack("!I", 0x80010000 | mtype) + _I32.pack(len(name)) + name + _I32.pack(seqid)


def _field(ttype: int, fid: int) -> bytes:
    return bytes([ttype]) + struct.pack("!h", fid)


def _deep_json(depth: int) -> bytes:
    return b'{"echo":' + b"[" * depth + b"]" * depth + b"}"


class InputGenerator:
    """Seeded fuzz inputs for one target kind ("taskserver" or "edge-agent")."""

    def __init__(self, seed: int, target: str = "taskserver", token: str | None = None) -> None:
        self.rng = random.Random(seed)
        self.target = target
        self.token = token
        self.t = thrift()
        self._n = 0
        self._valid: list[bytes] = []

    # -- field values --------------------------------------------------------------------
    def _qid(self) -> Any:
        r = self.rng.random()
        self._n += 1
        if r < 0.80:
            return f"fz-{self._n}"
        return self.rng.choice(["", "x" * 300, b"\xff\xfe-not-utf8", None, "q\u2603"])

    def _budget(self, steady: bool) -> Any:
        r = self.rng.random()
        if steady or r < 0.7:
            return self.rng.uniform(-50.0, 800.0)
        return self.rng.choice([math.nan, math.inf, -math.inf, 1e300, -1e300, 1e12, None])

    def _payload(self, steady: bool) -> bytes | None:
        rng = self.rng
        if self.target == "edge-agent":
            return self._sensing_payload()
        r = rng.random()
        if r < 0.35:
            return json.dumps({"service_ms": rng.uniform(0.0, 5.0)}).encode()
        if r < 0.45:  # far beyond any budget: the watchdog must take the slot back
            return json.dumps({"service_ms": rng.choice([1e6, 1e9, 1e15, 1e300])}).encode()
        options: list[bytes | None] = [
            b"",
            None,
            b"{}",
            b'{"fail": "fuzz"}',
            b'{"drop": "fuzz"}',
            b'{"drop": 7}',
            b'{"service_ms": -1}',
            b'{"service_ms": "soon"}',
            b'{"service_ms": NaN}',
            b'{"service_ms": 1e999}',
            b"[1, 2, 3]",
            b"not json",
            b"\xff\xfe\xfd",
            _deep_json(rng.choice([50, 100, 5_000, 100_000])),
            b'{"echo": "' + b"a" * rng.choice([10, 100_000]) + b'"}',
        ]
        return rng.choice(options)

    def _sensing_payload(self) -> bytes | None:
        rng = self.rng
        sensors = ["temperature", "humidity", "pressure", "", "no-such-sensor", 7]
        ops: list[Any] = [
            {"op": "latest", "sensor": rng.choice(sensors)},
            {"op": "status"},
            {
                "op": "range",
                "sensor": rng.choice(sensors),
                "start": rng.choice(["2026-01-01T00:00:00Z", 0, -1e300, "yesterday", None]),
                "end": rng.choice(["2025-01-01T00:00:00Z", 2e9, 1e300, "2026-13-40", None]),
            },
            {"op": "range", "sensors": [rng.choice(sensors) for _ in range(rng.randint(0, 4))]},
            {"op": rng.choice(["bogus", "", None, 3])},
        ]
        r = rng.random()
        if r < 0.8:
            return json.dumps(rng.choice(ops)).encode()
        return rng.choice([b"", None, b"[]", b"nope", _deep_json(rng.choice([70, 100_000]))])

    def _task(self, steady: bool) -> Any:
        rng = self.rng
        task = self.t.Task(
            query_id=self._qid() if not steady else f"st-{rng.getrandbits(40)}",
            task_index=rng.choice([0, 1, 7, -1, 2**31 - 1])
            if steady or rng.random() < 0.95
            else None,
            deadline_budget_ms=self._budget(steady),
            slo_budget_ms=self._budget(steady),
            priority=rng.choice([0, 1, 2, -5]) if rng.random() < 0.95 or steady else None,
            class_name=rng.choice(["A", "B", None, b"\xff"]),
            payload=self._payload(steady),
        )
        return task

    # -- messages --------------------------------------------------------------------------
    def _encode(self, name: str, mtype: int, body: Any) -> bytes | None:
        try:
            return encode_message(name, mtype, self.rng.getrandbits(31), body)
        except Exception:  # a value the encoder refuses: not an input
            return None

    def _steady(self) -> bytes | None:
        """A well-formed message with hostile values, on the connection kept open."""
        rng, svc = self.rng, self.t.TaskServer
        r = rng.random()
        if r < 0.6:
            tasks = [self._task(True) for _ in range(rng.randint(1, 4))]
            frame = Batcher.submit().encode(tasks)
            self._valid.append(frame[4:])
            del self._valid[:-256]  # mutants come from the latest valid frames
            if rng.random() < 0.3:  # cancelled in the same write: before its runner starts
                frame += encode_message(
                    "cancel", ONEWAY, 0, svc.cancel_args(query_id=tasks[0].query_id)
                )
            return frame
        if r < 0.8:
            return self._encode("status", CALL, svc.status_args(claim=self._claim()))
        if r < 0.9:
            return self._encode("ping", CALL, svc.ping_args(token=rng.choice(["", "p", None])))
        return self._encode("pipeline_state", CALL, svc.pipeline_state_args())

    def _claim(self) -> Any:
        rng = self.rng
        if rng.random() < 0.2:
            return None
        proof = rng.choice([None, b"", rng.randbytes(32), b"x" * 1000])
        return self.t.OwnerClaim(
            rng.choice(["intruder", "", "g" * 300, None]),
            rng.choice([60_000.0, 1e300, -5.0, math.nan, None]),
            proof,
        )

    def _hostile(self) -> bytes | None:
        """A message that breaks the contract or the framing: the server may close on it."""
        rng, svc, t = self.rng, self.t.TaskServer, self.t
        r = rng.random()
        if r < 0.25:  # decodable, but fields missing or of the wrong kind
            choice = rng.randrange(8)
            if choice == 0:
                return self._encode("submit", ONEWAY, svc.submit_args(task=None))
            if choice == 1:
                return self._encode("submit", ONEWAY, svc.submit_args(task=self._task(False)))
            if choice == 2:
                return self._encode("submit_batch", ONEWAY, svc.submit_batch_args(tasks=None))
            if choice == 3:
                return self._encode("cancel", ONEWAY, svc.cancel_args(query_id=None))
            if choice == 4:  # a oneway method sent as a call
                return self._encode("submit", CALL, svc.submit_args(task=self._task(True)))
            if choice == 5:  # a two-way call sent as oneway
                return self._encode("status", ONEWAY, svc.status_args())
            if choice == 6:  # messages a server never takes
                name = rng.choice(["result", "nosuchmethod", "status"])
                mtype = rng.choice([REPLY, EXCEPTION, CALL])
                args = t.TaskSink.result_args(result=t.TaskResult("q", 0, 0))
                return self._encode(name, mtype, args)
            return self._encode(
                "submit_batch", ONEWAY, svc.submit_batch_args(tasks=[self._task(False)] * 3)
            )
        if r < 0.45:  # declared lengths and types that once allocated or spun
            n = rng.choice([2**31 - 1, 10**9, 10**6, 65_536])
            attack = rng.randrange(7)
            if attack == 0:
                return _frame(_head(b"submit_batch", ONEWAY) + _field(15, 1) + b"\x0c" + _i(n))
            if attack == 1:
                return _frame(_head(b"ping", CALL) + _field(11, 1) + _i(n) + b"x")
            if attack == 2:
                return _frame(_head(b"submit", ONEWAY) + _field(14, 9) + b"\x01" + _i(n) + b"\0")
            if attack == 3:
                return _frame(_head(b"submit", ONEWAY) + _field(13, 9) + b"\x01\x01" + _i(n))
            if attack == 4:
                return _frame(_head(b"submit", ONEWAY) + _field(13, 9) + b"\x08\x08" + _i(n))
            if attack == 5:
                depth = rng.choice([33, 64, 1000])
                return _frame(_head(b"submit", ONEWAY) + _field(12, 1) * depth + b"\0" * depth)
            return _frame(_head(b"submit", ONEWAY) + _field(rng.choice([1, 5, 7, 9, 16, 99]), 1))
        if r < 0.85 and self._valid:  # mutants of valid frames
            b = bytearray(rng.choice(self._valid))
            kind = rng.random()
            if kind < 0.4:
                for _ in range(rng.randint(1, 6)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            elif kind < 0.7:
                at = rng.randrange(max(len(b) - 4, 1))
                b[at : at + 4] = _i(rng.choice([-1, 2**31 - 1, 10**6, len(b), 0x7F]))
            elif kind < 0.85:
                b = b[: rng.randrange(len(b))]
            else:
                other = rng.choice(self._valid)
                b = b[: rng.randrange(len(b))] + other[rng.randrange(len(other)) :]
            return _frame(bytes(b)) if b else None
        # garbage, and frame lengths out of bounds
        choice = rng.randrange(4)
        if choice == 0:
            return rng.randbytes(rng.randint(1, 64))
        if choice == 1:
            return _i(rng.choice([0, -1, -(2**31), 2**31 - 1, 64 * 1024 * 1024 + 1]))
        if choice == 2:
            return _frame(rng.randbytes(rng.randint(1, 200)))
        return b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"

    def __iter__(self) -> Iterator[Input]:
        while True:
            steady = self.rng.random() < 0.4
            data = self._steady() if steady else self._hostile()
            if data:
                yield Input(data, steady, "steady" if steady else "hostile")


def _i(v: int) -> bytes:
    return _I32.pack(v)


# -- the driver -----------------------------------------------------------------------------


class _Sink(asyncio.Protocol):
    """A connection that reads and discards what the server sends (results, replies)."""

    def __init__(self) -> None:
        self.closed = asyncio.get_running_loop().create_future()
        self.received = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass
class FuzzReport:
    """What a fuzz run saw."""

    inputs: int = 0
    steady: int = 0
    hostile: int = 0
    connections: int = 0
    probes: int = 0
    probe_failures: list[str] = field(default_factory=list)
    idle_after_s: float | None = None
    """Seconds after the last input until busy = queued = 0 (None: not within the bound)."""
    final_status: dict[str, Any] = field(default_factory=dict)


async def _open(port: int) -> _Sink:
    loop = asyncio.get_running_loop()
    _, sink = await loop.create_connection(_Sink, HOST, port)
    return sink


async def _status(port: int, timeout_s: float = 2.0) -> Any:
    """A ServerStatus through a fresh, well-behaved connection."""
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(
            lambda: ThriftConnection(gateway_body_types(), lambda *a: None), HOST, port
        ),
        timeout_s,
    )
    try:
        return await conn.call("status", thrift().TaskServer.status_args(), timeout_s)
    finally:
        conn.close()


async def fuzz(
    port: int,
    inputs: Iterator[Input],
    count: int,
    *,
    probe_every: int = 500,
    idle_bound_s: float = 30.0,
    alive: Callable[[], bool] = lambda: True,
) -> FuzzReport:
    """Send `count` inputs to the server on `port`; probe it every `probe_every` inputs."""
    report = FuzzReport()
    steady = await _open(port)
    closing: list[_Sink] = []
    report.connections = 1
    try:
        for i, item in enumerate(inputs):
            if i >= count:
                break
            if item.steady:
                if steady.closed.done():
                    report.probe_failures.append(f"input {i}: the steady connection was closed")
                    steady = await _open(port)
                    report.connections += 1
                assert steady.transport is not None
                if not steady.transport.is_closing():
                    steady.transport.write(item.data)
                report.steady += 1
            else:
                # A connection of its own, closed once written: the server reads every hostile
                # input from a fresh connection, and sees connections end in every state.
                hostile = await _open(port)
                report.connections += 1
                assert hostile.transport is not None
                hostile.transport.write(item.data)
                hostile.transport.close()
                report.hostile += 1
                closing.append(hostile)
                if len(closing) >= 128:
                    await asyncio.gather(*(_settled(c) for c in closing))
                    closing.clear()
            report.inputs += 1
            if (i + 1) % probe_every == 0:
                await _probe(port, report, alive, f"after input {i + 1}")
        await _probe(port, report, alive, "at the end")
        # Every task on the steady connection ends by its budget plus the grace: the server
        # must come back to no busy slot and an empty queue by itself.
        t0 = time.monotonic()
        while time.monotonic() - t0 < idle_bound_s and alive():
            st = await _status(port)
            report.final_status = {"busy": st.busy, "queued": st.queued}
            if st.busy == 0 and st.queued == 0:
                report.idle_after_s = round(time.monotonic() - t0, 2)
                break
            await asyncio.sleep(0.1)
    finally:
        for sink in (steady, *closing):
            if sink.transport is not None:
                sink.transport.abort()
    return report


async def _settled(sink: _Sink) -> None:
    """Wait (a bounded while) for a hostile connection to end."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(sink.closed), 2.0)


async def _probe(port: int, report: FuzzReport, alive: Callable[[], bool], when: str) -> None:
    report.probes += 1
    if not alive():
        report.probe_failures.append(f"{when}: the server process is gone")
        return
    try:
        await _status(port)
    except (OSError, TimeoutError, WireError) as exc:
        report.probe_failures.append(f"{when}: no status answer ({exc!r})")


# -- the target process ----------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """Resident memory of a process, KiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def limited(as_limit_bytes: int) -> Callable[[], None]:
    """A preexec_fn that caps the child's address space."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (as_limit_bytes, as_limit_bytes))

    return apply


@dataclass
class Target:
    """A fuzzed process: its kind, Popen, Thrift port, stderr file and metrics port."""

    kind: str
    popen: subprocess.Popen[bytes]
    port: int
    stderr_path: Path
    metrics_port: int

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def violations(self) -> dict[str, int]:
        """Connections it closed for protocol violations, by reason (from its /metrics)."""
        url = f"http://{HOST}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("tailgate_taskserver_wire_violations_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = out.get(reason, 0) + int(float(line.rsplit(" ", 1)[1]))
        return out


def _free_port() -> int:
    return free_port(HOST)


def start_target(
    kind: str, workdir: Path, *, as_limit_bytes: int, token: str | None = "fuzz-token"
) -> Target:
    """Start a task server (kind "taskserver") or an edge agent ("edge-agent") on a free port.

    The task server gets a short max_task_s and task_grace_s, so every fuzzed task has an
    outcome within seconds.
    """
    metrics_port = _free_port()
    if kind == "taskserver":
        cfg = workdir / "fuzz.toml"
        cfg.write_text("[taskserver]\nmax_task_s = 4.0\ntask_grace_s = 1.0\n")
        argv = taskserver_argv("fuzz-ts", metrics_port=metrics_port, config_path=str(cfg))
    elif kind == "edge-agent":
        argv = [
            *tailgate_argv(),
            "edge-agent", "run", "--id", "fuzz-pi", "--cluster", "lab", "--port", "0",
            "--db", str(workdir / "fuzz-agent.db"), "--metrics-port", str(metrics_port),
        ]  # fmt: skip
    else:
        raise ValueError(f"target: must be taskserver or edge-agent, got {kind!r}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
        env.pop(name, None)
    if token is not None:
        env["TAILGATE_AGENT_TOKEN"] = token
    stderr_path = workdir / f"{kind}.stderr"
    with stderr_path.open("wb") as err:
        popen = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            preexec_fn=limited(as_limit_bytes),
        )
    assert popen.stdout is not None
    deadline = time.monotonic() + 30
    line = b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        chunk = popen.stdout.readline()
        if not chunk:
            break
        line += chunk
    if not line:
        popen.kill()
        popen.wait(5)
        raise RuntimeError(f"{kind} did not start: {stderr_path.read_text(errors='replace')}")
    address = json.loads(line)["address"]
    return Target(kind, popen, int(address.rpartition(":")[2]), stderr_path, metrics_port)


async def run(kind: str, count: int, seed: int, as_limit_mb: int, warmup: int) -> int:
    """Fuzz one target process end to end and print the report; 0 when every check holds."""
    with tempfile.TemporaryDirectory(prefix="tailgate-fuzz-") as tmp:
        target = start_target(kind, Path(tmp), as_limit_bytes=as_limit_mb * 1024 * 1024)
        try:
            gen = iter(InputGenerator(seed, kind))
            before = await fuzz(target.port, gen, warmup, alive=target.alive)
            rss0 = rss_kib(target.popen.pid)
            t0 = time.perf_counter()
            report = await fuzz(target.port, gen, count, alive=target.alive)
            elapsed = time.perf_counter() - t0
            alive = target.alive()
            rss1 = rss_kib(target.popen.pid) if alive else 0
            violations = target.violations() if alive else {}
        finally:
            target.stop()
        log = target.log()
    tracebacks = log.count("Traceback")
    print(f"target: {kind} (address-space limit {as_limit_mb} MiB), seed {seed}")
    print(
        f"inputs: {report.inputs} in {elapsed:.1f} s after a warm-up of {before.inputs} "
        f"({report.steady} on the steady connection, {report.hostile} hostile, "
        f"{report.connections} connections)"
    )
    print(f"alive at the end: {alive}; probes: {report.probes}, failed: {report.probe_failures}")
    print(
        f"slots: idle {report.idle_after_s} s after the last input "
        f"(busy/queued {report.final_status})"
    )
    print(f"RSS: {rss0 / 1024:.1f} MiB -> {rss1 / 1024:.1f} MiB ({(rss1 - rss0) / 1024:+.1f})")
    print(f"connections it closed for protocol violations: {violations}")
    print(f"tracebacks in its log: {tracebacks}")
    ok = (
        alive
        and not report.probe_failures
        and report.idle_after_s is not None
        and rss1 - rss0 < 10 * 1024
        and tracebacks == 0
    )
    print("verdict:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """CLI entry."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=("taskserver", "edge-agent"), default="taskserver")
    p.add_argument("--inputs", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--as-limit-mb", type=int, default=1024)
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(args.target, args.inputs, args.seed, args.as_limit_mb, args.warmup))
    return 130


if __name__ == "__main__":
    sys.exit(main())
