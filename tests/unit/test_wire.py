"""Framing and decoding of the duplex Thrift connection, without sockets."""

from __future__ import annotations

from typing import Any

from taskserver.wire import (
    ONEWAY,
    ThriftConnection,
    encode_message,
    gateway_body_types,
    server_body_types,
    thrift,
)


class FakeTransport:
    def __init__(self) -> None:
        self.aborted = False
        self.closed = False

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True


def _task(i: int) -> Any:
    t = thrift()
    return t.Task(
        query_id=f"q{i}",
        task_index=i,
        deadline_budget_ms=5.0 + i,
        slo_budget_ms=50.0,
        priority=1,
        class_name="A",
        payload=b'{"k":1}',
    )


def test_frames_split_anywhere_decode_in_order() -> None:
    got: list[tuple[str, Any]] = []
    conn = ThriftConnection(server_body_types(), lambda n, m, s, b: got.append((n, b)))
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    svc = thrift().TaskServer
    stream = b"".join(
        encode_message("submit", ONEWAY, 0, svc.submit_args(task=_task(i))) for i in range(5)
    ) + encode_message("cancel", ONEWAY, 0, svc.cancel_args(query_id="q3"))
    for i in range(0, len(stream), 7):  # arbitrary TCP segmentation
        conn.data_received(stream[i : i + 7])
    assert [n for n, _ in got] == ["submit"] * 5 + ["cancel"]
    assert [b.task.task_index for _, b in got[:5]] == [0, 1, 2, 3, 4]
    assert got[2][1].task.deadline_budget_ms == 7.0
    assert got[0][1].task.payload == b'{"k":1}'
    assert got[5][1].query_id == "q3"


def test_result_messages_decode_on_the_gateway_side() -> None:
    got: list[Any] = []
    conn = ThriftConnection(gateway_body_types(), lambda n, m, s, b: got.append(b.result))
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    t = thrift()
    res = t.TaskResult(
        query_id="q",
        task_index=2,
        status=0,
        queue_ms=1.5,
        service_ms=2.5,
        server_ms=4.25,
        missed_deadline=True,
        result=b"{}",
    )
    conn.data_received(encode_message("result", ONEWAY, 0, t.TaskSink.result_args(result=res)))
    assert got[0].server_ms == 4.25 and got[0].missed_deadline is True


def test_garbage_aborts_the_connection() -> None:
    got: list[Any] = []
    conn = ThriftConnection(server_body_types(), lambda *a: got.append(a))
    tr = FakeTransport()
    conn.connection_made(tr)  # type: ignore[arg-type]
    conn.data_received(b"\xff\xff\xff\xff" + b"junk")
    assert tr.aborted and not got
    tr2 = FakeTransport()
    conn2 = ThriftConnection(server_body_types(), lambda *a: got.append(a))
    conn2.connection_made(tr2)  # type: ignore[arg-type]
    conn2.data_received(b"\x00\x00\x00\x05hello")
    assert tr2.aborted and not got


def test_positional_construction_matches_the_idl_field_order() -> None:
    # links.py and server.py build Task and TaskResult positionally on the hot path.
    t = thrift()
    names = lambda cls: [spec[1] for _, spec in sorted(cls.thrift_spec.items())]  # noqa: E731
    assert names(t.Task) == [
        "query_id",
        "task_index",
        "deadline_budget_ms",
        "slo_budget_ms",
        "priority",
        "class_name",
        "payload",
        "traceparent",
        "tracestate",
    ]
    assert names(t.TaskResult) == [
        "query_id",
        "task_index",
        "status",
        "queue_ms",
        "service_ms",
        "server_ms",
        "missed_deadline",
        "result",
        "error",
    ]


def _idl_without_trace_context(tmp_path: Any) -> Any:
    """The IDL as it was before the Task's trace-context fields: what an older peer speaks."""
    import re

    import thriftpy2

    from taskserver.wire import IDL_PATH

    text = IDL_PATH.read_text()
    old = re.sub(r"\n  [89]: optional string trace(parent|state),", "", text)
    task_struct = old.split("struct Task {")[1].split("}")[0]
    assert old != text and "optional string trace" not in task_struct
    path = tmp_path / "tailgate_before_tracing.thrift"
    path.write_text(old)
    return thriftpy2.load(str(path), module_name="tailgate_before_tracing_thrift")


def _decoded_task(module: Any, frame: bytes) -> Any:
    got: list[Any] = []
    types = {("submit", ONEWAY): module.TaskServer.submit_args}
    conn = ThriftConnection(types, lambda n, m, s, b: got.append(b.task))
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    conn.data_received(frame)
    assert len(got) == 1
    return got[0]


def test_trace_context_and_older_peers_decode_each_other(tmp_path: Any) -> None:
    old, new = _idl_without_trace_context(tmp_path), thrift()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = new.Task("q", 3, 5.0, 50.0, 1, "A", b"{}", traceparent, "rojo=1")
    frame = encode_message("submit", ONEWAY, 0, new.TaskServer.submit_args(task=traced))
    # An older task server skips the fields it does not know and reads the task as before.
    seen_old = _decoded_task(old, frame)
    assert (seen_old.query_id, seen_old.task_index, seen_old.payload) == ("q", 3, b"{}")
    assert not hasattr(seen_old, "traceparent")
    # This side reads them back; a task from an older gateway simply has none.
    seen_new = _decoded_task(new, frame)
    assert (seen_new.traceparent, seen_new.tracestate) == (traceparent, "rojo=1")
    plain = old.Task("q", 4, 5.0, 50.0, 1, "A", b"{}")
    frame = encode_message("submit", ONEWAY, 0, old.TaskServer.submit_args(task=plain))
    seen = _decoded_task(new, frame)
    assert seen.task_index == 4 and seen.traceparent is None and seen.tracestate is None
