"""A query answer rendered once (`QueryAnswer.render`), as the HTTP shell sends it.

The bytes are the JSON of `body` plus the shell's keys: task results that are JSON go in as
their servers wrote them, and whatever `decode_result` reads otherwise (text, a document
nested too deeply, JSON only the standard library reads) comes out as it always did.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.queries import QueryOutcome, TaskOutcome
from gateway.query_path import QueryAnswer
from taskserver.jsonbody import MAX_DEPTH


def _answer(*results: bytes | None, **summary: Any) -> QueryAnswer:
    outcomes = [
        TaskOutcome(f"s{i}", "ok", 0.123456789, 1.5, 2.25, 3.0, False, raw, estimated_wait_ms=0.5)
        for i, raw in enumerate(results)
    ]
    return QueryAnswer(QueryOutcome.MET, {"query_id": "q-1", "fanout": len(results), **summary},
                       outcomes)  # fmt: skip


def test_the_rendered_answer_is_the_body_with_the_shells_keys_last() -> None:
    answer = _answer(b'{"labels": ["car", "bus"], "score": 0.91}', b'{"n": 1}', None, b"[]")
    raw = answer.render(request_id="req-7")
    assert json.loads(raw) == {**answer.body, "request_id": "req-7"}
    assert list(json.loads(raw)) == ["query_id", "fanout", "tasks", "request_id"]
    task = json.loads(raw)["tasks"][0]
    assert task["queue_ms"] == 0.1235 and task["estimated_wait_ms"] == 0.5
    # JSON results go in as the server wrote them (spaces and all), not decoded and encoded.
    assert b'"result":{"labels": ["car", "bus"], "score": 0.91}' in raw


def test_a_big_integer_in_a_result_keeps_every_digit() -> None:
    raw = _answer(b'{"id": 123456789012345678901234567890}').render()
    assert json.loads(raw)["tasks"][0]["result"] == {"id": 123456789012345678901234567890}


@pytest.mark.parametrize(
    "result",
    [
        b"not json at all",
        b"\xff\xfe broken utf-8",
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        b'"\\ud800 lone surrogate"',
        b"",
    ],
)
def test_results_that_are_not_strict_json_render_as_the_body_shows_them(result: bytes) -> None:
    answer = _answer(result, b'{"ok": true}')
    assert json.loads(answer.render()) == json.loads(json.dumps(answer.body))


def test_nan_in_a_result_renders_as_null_so_the_answer_stays_strict_json() -> None:
    raw = _answer(b'{"x": NaN, "y": 1}').render()
    assert b"NaN" not in raw
    assert json.loads(raw)["tasks"][0]["result"] == {"x": None, "y": 1}


def test_equal_results_are_read_once_and_rendered_alike() -> None:
    answer = _answer(*[b'{"same": [1, 2, 3]}'] * 50)
    tasks = json.loads(answer.render())["tasks"]
    assert [t["result"] for t in tasks] == [{"same": [1, 2, 3]}] * 50
