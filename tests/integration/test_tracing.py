"""Request ids and distributed tracing across a real gateway and real task servers.

The processes export their spans with the OpenTelemetry SDK's OTLP/HTTP exporter to a
receiver this test runs on 127.0.0.1, which decodes the protobuf export requests as a
collector (Jaeger, Tempo) would; nothing of the processes is faked.
"""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from taskserver.tracecontext import parse_traceparent
from tests.integration.conftest import Cluster, register
from tests.integration.harness import REPO_ROOT, Proc, start_gateway, start_taskserver

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
"""Export batches every 100 ms (the SDK's default is 5 s)."""


@dataclass(frozen=True)
class Span:
    """One span as a collector received it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            str(resource.get("service.name")),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            _attributes(s.attributes),
                            s.status.code == 2,  # STATUS_CODE_ERROR
                        )
                    )
        with self._lock:
            self.spans.extend(got)

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, trace_id: str, count: int, timeout_s: float = 15.0) -> list[Span]:
        """The trace's spans once `count` of them arrived."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            spans = self.of_trace(trace_id)
            if len(spans) >= count:
                await asyncio.sleep(0.3)  # anything beyond the count would come with them
                return self.of_trace(trace_id)
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.of_trace(trace_id))} of {count} spans arrived")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind is not None else None
    return out


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


def _traced(cluster: Cluster, receiver: OtlpReceiver) -> tuple[Proc, list[Proc]]:
    """A gateway and three task servers that trace: the task servers are given the endpoint
    in [tracing], the gateway through OTEL_EXPORTER_OTLP_ENDPOINT."""
    ts_cfg = cluster.tmp_path / "taskserver.toml"
    ts_cfg.write_text(
        f'[tracing]\nenabled = true\notlp_endpoint = "{receiver.base_url}/v1/traces"\n'
    )
    servers = []
    for i in range(3):
        servers.append(start_taskserver(f"ts-{i}", config=ts_cfg, env=FAST_EXPORT))
        cluster.procs.append(servers[-1])
    gw_cfg = cluster.tmp_path / "gateway.toml"
    gw_cfg.write_text("[tracing]\nenabled = true\n")
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    gw = start_gateway(gw_cfg, env=env)
    cluster.procs.append(gw)
    return gw, servers


async def test_a_fanout_query_is_one_trace_across_gateway_and_task_servers(
    cluster: Cluster, http: aiohttp.ClientSession, receiver: OtlpReceiver
) -> None:
    gw, servers = _traced(cluster, receiver)
    for ts in servers:
        await register(http, gw, ts)
    headers = {
        "traceparent": f"00-{TRACE}-{CALLER_SPAN}-01",
        "tracestate": "rojo=00f067aa0ba902b7",
        "X-Request-Id": "client-req-7",
    }
    body = {"class": "C", "targets": {"pool": "default", "fanout": 3}}
    async with http.post(gw.url + "/v1/queries", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
        answered = parse_traceparent(resp.headers["traceparent"])
        assert resp.headers["X-Request-Id"] == "client-req-7"
        assert resp.headers["tracestate"] == "rojo=00f067aa0ba902b7"
    assert answer["request_id"] == "client-req-7"
    assert answered is not None and answered.trace_id == TRACE  # the caller's trace goes on
    assert answered.parent_id != CALLER_SPAN

    # 1 query span + 3 task spans (gateway), 3 queue waits + 3 services (task servers).
    spans = await receiver.wait_for(TRACE, 10)
    assert len(spans) == 10, [(s.service, s.name) for s in spans]
    (q,) = [s for s in spans if s.name == "tailgate.query"]
    assert q.service == "tailgate-gateway"
    assert q.parent_id == CALLER_SPAN and q.span_id == answered.parent_id
    assert q.attributes["tailgate.fanout"] == 3
    assert q.attributes["tailgate.class"] == "C"
    assert q.attributes["tailgate.pool"] == "default"
    assert q.attributes["tailgate.slo_ms"] == 1000.0
    assert q.attributes["tailgate.outcome"] == "met"
    assert q.attributes["tailgate.request_id"] == "client-req-7"
    assert q.attributes["tailgate.query_id"] == answer["query_id"]
    tasks = {s.span_id: s for s in spans if s.name == "tailgate.task"}
    assert len(tasks) == 3
    assert {t.service for t in tasks.values()} == {"tailgate-gateway"}
    assert {t.parent_id for t in tasks.values()} == {q.span_id}
    assert {t.attributes["tailgate.server_id"] for t in tasks.values()} == {
        "ts-0",
        "ts-1",
        "ts-2",
    }
    assert {t.attributes["tailgate.outcome"] for t in tasks.values()} == {"ok"}
    # Each task's queue wait and service on its own server hang under its task span.
    server_side = [s for s in spans if s.service == "tailgate-taskserver"]
    assert sorted(s.name for s in server_side) == sorted(
        ["tailgate.task.queue_wait", "tailgate.task.service"] * 3
    )
    for task_id, task in tasks.items():
        children = {s.name: s for s in server_side if s.parent_id == task_id}
        assert set(children) == {"tailgate.task.queue_wait", "tailgate.task.service"}
        for child in children.values():
            assert child.attributes["tailgate.server_id"] == task.attributes["tailgate.server_id"]
            assert child.attributes["tailgate.query_id"] == answer["query_id"]
            assert child.attributes["tailgate.outcome"] == "ok"
            assert not child.error

    # Without a traceparent the query starts a trace of its own, named in the answer.
    async with http.post(gw.url + "/v1/queries", json=body) as resp:
        assert resp.status == 200
        own = parse_traceparent(resp.headers["traceparent"])
        request_id = resp.headers["X-Request-Id"]
    assert own is not None and own.trace_id != TRACE
    assert len(request_id) == 32  # made by the gateway
    spans = await receiver.wait_for(own.trace_id, 10)
    (root,) = [s for s in spans if s.name == "tailgate.query"]
    assert root.parent_id == "" and root.span_id == own.parent_id


async def test_every_answer_carries_the_request_id_and_a_continued_traceparent(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway()  # no tracing: no OpenTelemetry in the process
    await register(http, gw, cluster.taskserver("ts-1"))
    body = {"class": "A", "targets": {"pool": "default", "fanout": 1}}
    async with http.post(gw.url + "/v1/queries", json=body, headers={"X-Request-Id": "r1"}) as r:
        assert r.status == 200
        assert r.headers["X-Request-Id"] == "r1" and (await r.json())["request_id"] == "r1"
        assert "traceparent" not in r.headers  # none asked, none made up
    # Errors carry it too: a bad body (400), an unknown path (404), a wrong method (405).
    for method, path, payload, status in (
        ("POST", "/v1/queries", {"class": "nope"}, 400),
        ("GET", "/v1/nowhere", None, 404),
        ("DELETE", "/v1/classes", None, 405),
    ):
        async with http.request(
            method, gw.url + path, json=payload, headers={"X-Request-Id": f"e-{status}"}
        ) as r:
            assert r.status == status
            assert r.headers["X-Request-Id"] == f"e-{status}"
    # An invalid id is replaced, not refused.
    for bad in ("has space", "x" * 129, "caf\u00e9"):
        async with http.post(gw.url + "/v1/queries", json=body, headers={"X-Request-Id": bad}) as r:
            assert r.status == 200
            made = r.headers["X-Request-Id"]
            assert made != bad and len(made) == 32 and (await r.json())["request_id"] == made
    # Without the tracing extra the caller's trace is continued under a new parent id.
    sent = f"00-{TRACE}-{CALLER_SPAN}-01"
    async with http.get(gw.url + "/healthz", headers={"traceparent": sent}) as r:
        back = parse_traceparent(r.headers["traceparent"])
    assert back is not None and (back.trace_id, back.flags) == (TRACE, 1)
    assert back.parent_id != CALLER_SPAN
    # An invalid traceparent is ignored, its tracestate with it.
    headers = {"traceparent": f"00-{TRACE.upper()}-{CALLER_SPAN}-01", "tracestate": "a=1"}
    async with http.get(gw.url + "/healthz", headers=headers) as r:
        assert "traceparent" not in r.headers and "tracestate" not in r.headers
        assert len(r.headers["X-Request-Id"]) == 32


@pytest.mark.parametrize("command", [["gateway", "--port", "0"], ["taskserver", "--port", "0"]])
def test_tracing_on_without_the_extra_is_one_line(tmp_path: Path, command: list[str]) -> None:
    # A package named opentelemetry that refuses to import hides the installed SDK.
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    cfg = tmp_path / "tailgate.toml"
    cfg.write_text("[tracing]\nenabled = true\n")
    argv = [sys.executable, "-m", "deploy.cli", "--config", str(cfg), *command]
    if command[0] == "gateway":
        argv += ["--storage-url", ""]
    env = {"PYTHONPATH": str(tmp_path / "shadow"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "tracing.enabled" in lines[0] and "pip install -e '.[tracing]'" in lines[0]
    assert done.stdout == ""  # nothing announced: it never listened
