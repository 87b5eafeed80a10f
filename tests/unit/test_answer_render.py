"""A query answer rendered once (`QueryAnswer.render`), as the HTTP shell sends it.

The bytes are the JSON of `body` plus the shell's keys: task results that are JSON go in as
their servers wrote them, and whatever `decode_result` reads otherwise (text, a document
nested too deeply, JSON only the standard library reads) comes out as it always did.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from gateway import queries
from gateway.queries import QueryOutcome, TaskOutcome, render_answer, render_answer_py
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


# --- The C writer of the tasks (gateway/_hotpath.c: render_tasks) and its Python twin ------

_C = queries._c_render is not None
_NOT_C = "the C writer is not in use (not built, or TAILGATE_PURE_PYTHON=1)"
_CALLBACKS = queries._C_RENDER_ARGS
_TEXTS = ["ts-1", "", 'quo"te', "back\\slash", "tab\there", "nul\x00", "del\x7f", "é✓", "a/b"]
_RESULTS = [None, b"", b"{}", b'{"a": [1, 2.5]}', b"null", b"not json", b"\xff\xfe",
            b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), b'{"x": NaN}', b"7",
            b"[" + b",".join([b"[1]"] * (MAX_DEPTH + 1)) + b"]"]  # fmt: skip


class _Text(str):
    """A str subclass: the C writer copies only str itself."""


def _ms(rng: random.Random) -> float | None:
    """Timings as they come and as they could: ties of the 4-decimal rounding, values past
    the C writer's own range, signed zeros, non-finite values."""
    k = rng.randrange(-(10**9), 10**9)
    return rng.choice(
        [
            None,
            0.0,
            -0.0,
            math.nan,
            math.inf,
            -math.inf,
            rng.uniform(0.0, 5.0),
            rng.uniform(-1.0, 1.0) * 10 ** rng.randrange(-9, 9),
            (k + 0.5) / 1e4,  # a tie, or the double nearest to one
            k / 1e4,
            (k + 0.5) / 1e4 + rng.choice([-1, 1]) * 1e-9,
            rng.uniform(9.9e7, 1.1e8),
            rng.uniform(-1e16, 1e16),
            1e300,
            float(rng.randrange(10**6)),
        ]
    )


def _outcome(rng: random.Random) -> TaskOutcome:
    return TaskOutcome(
        rng.choice(_TEXTS[:2] + [f"srv-{rng.randrange(10**4)}"] * 5 + _TEXTS),
        rng.choice(["ok", "failed", "dropped", "timeout", "lost"]),
        _ms(rng),
        _ms(rng),
        _ms(rng),
        _ms(rng),
        rng.choice([None, True, False]),
        rng.choice(_RESULTS),
        rng.choice([None, None, "", "queue full", 'say "no"', "é\n✓"]),
        _ms(rng),
        rng.choice([0, 0, 0, 1, 7]),
    )


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_the_c_writer_renders_the_bytes_of_its_python_twin() -> None:
    rng = random.Random(5)
    head, tail = {"query_id": "q-1", "fanout": 9}, {"request_id": "r"}
    taken = 0
    for n in [1, 2, 10, 100] * 200:
        outcomes = [_outcome(rng) for _ in range(n)]
        assert render_answer(head, outcomes, tail) == render_answer_py(head, outcomes, tail)
        taken += queries._c_render(outcomes, *_CALLBACKS) is not None
    assert taken == 800  # every one of them written in C


_DECLINED = [("queue_ms", 3), ("service_ms", True), ("retries", True), ("server", 7),
             ("missed_deadline", 0), ("result", bytearray(b"{}")), ("error", _Text("no")),
             ("estimated_wait_ms", 2), ("retries", 2**70)]  # fmt: skip


@pytest.mark.skipif(not _C, reason=_NOT_C)
@pytest.mark.parametrize("field, value", _DECLINED)
def test_a_field_the_c_writer_does_not_take_is_rendered_by_python(field: str, value: Any) -> None:
    outcomes = [TaskOutcome("s", "ok", 1.0, 2.0, 3.0, 4.0, False, b"{}") for _ in range(3)]
    setattr(outcomes[1], field, value)
    assert queries._c_render(outcomes, *_CALLBACKS) is None
    head = {"query_id": "q-1"}
    assert render_answer(head, outcomes, {}) == render_answer_py(head, outcomes, {})


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_what_orjson_refuses_falls_back_to_the_standard_library_on_both_paths() -> None:
    outcomes = [TaskOutcome("s\ud800", "ok", 1.0, 2.0, 3.0, 4.0, False, b'"\\ud800"')]
    raw = render_answer({"query_id": "q-1"}, outcomes, {})
    assert raw == render_answer_py({"query_id": "q-1"}, outcomes, {})
    assert json.loads(raw)["tasks"][0]["server"] == "s\ud800"
