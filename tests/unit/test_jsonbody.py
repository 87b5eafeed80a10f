"""JSON from a peer (taskserver.jsonbody): parsed as json.loads parses it, held to MAX_DEPTH
levels, and a deeper one refused before the parser recurses into it."""

from __future__ import annotations

import gc
import json
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from taskserver import jsonbody
from taskserver.heap import GcPauses
from taskserver.jsonbody import MAX_DEPTH, JsonError

_TEXTS = ["", "a", "[", "]", "{", "}", "[[", "}]", '\\"', "\\\\", "é", "\\u005b", "x[y]z"]


def _doc(rng: random.Random, depth: int) -> Any:
    """A random document nesting at most `depth` levels, its strings full of brackets,
    quotes and backslashes."""
    roll = rng.random()
    if depth <= 0 or roll < 0.3:
        return rng.choice([rng.choice(_TEXTS) * rng.randrange(4), 7, -0.5, None, True])
    if roll < 0.65:
        return [_doc(rng, depth - 1) for _ in range(rng.randrange(6))]
    return {rng.choice(_TEXTS) + str(i): _doc(rng, depth - 1) for i in range(rng.randrange(6))}


def _depth(value: Any) -> int:
    """Levels of arrays and objects, counted one level at a time (no recursion)."""
    level, depth = [value], 0
    while level := [v for v in level if isinstance(v, (list, dict))]:
        depth += 1
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)]
    return depth


def _chain(depth: int, rng: random.Random) -> Any:
    """A document exactly `depth` levels deep, arrays and objects mixed at random."""
    value: Any = "]]}}"
    for _ in range(depth):
        value = [1, value] if rng.random() < 0.5 else {"k[": value, "z": "{"}
    return value


def test_documents_parse_as_json_loads_parses_them() -> None:
    rng = random.Random(4)
    seen_many = 0
    for _ in range(3000):
        doc = _doc(rng, rng.randrange(1, 9))
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
        seen_many += text.count("[") + text.count("{") > MAX_DEPTH
        assert jsonbody.loads(text) == json.loads(text)
        assert jsonbody.loads(text.encode()) == json.loads(text)
    assert seen_many > 300  # the bracket reading ran, on strings full of brackets


@pytest.mark.parametrize("seed", range(20))
def test_depth_is_held_to_the_limit_whatever_the_mix_of_arrays_and_objects(seed: int) -> None:
    rng = random.Random(seed)
    for depth in (MAX_DEPTH - 1, MAX_DEPTH):
        doc = _chain(depth, rng)
        assert jsonbody.loads(json.dumps(doc)) == doc
    for depth in (MAX_DEPTH + 1, MAX_DEPTH + 7, 2 * MAX_DEPTH, 2 * MAX_DEPTH + 1, 600):
        doc = _chain(depth, rng)
        assert _depth(doc) == depth
        with pytest.raises(JsonError, match=f"nested more than {MAX_DEPTH} levels deep"):
            jsonbody.loads(json.dumps(doc))


def test_brackets_that_never_pair_up_are_refused_unparsed() -> None:
    for text in ("[" * 100_000, "[" * 70 + "}" * 70, '{"a": ' * 80 + "1", "[]" * 40 + "]["):
        with pytest.raises(JsonError, match="invalid JSON"):
            jsonbody.loads(text)
    # Inside strings, brackets are text: a string of them is no nesting at all.
    assert jsonbody.loads(json.dumps(["[" * 10_000, "{" * 500])) == ["[" * 10_000, "{" * 500]


@pytest.fixture
def deep_collections() -> Iterator[tuple[GcPauses, list[Any]]]:
    """A collection every allocation or so, a pause timer among the callbacks, and the
    exceptions the collector would print, kept (the hook is a builtin: it runs at any
    depth, where a Python function could not be entered)."""
    pauses, ignored = GcPauses(), []
    threshold, hook = gc.get_threshold(), sys.unraisablehook
    gc.callbacks.append(pauses)
    sys.unraisablehook = ignored.append
    gc.set_threshold(1)
    try:
        yield pauses, ignored
    finally:
        gc.set_threshold(*threshold)
        sys.unraisablehook = hook
        gc.callbacks.remove(pauses)


def test_a_deep_document_leaves_the_collectors_callbacks_alone(
    deep_collections: tuple[GcPauses, list[Any]],
) -> None:
    """Parsing 100,000 levels ran Python's parser to the recursion limit, where a
    collection's callback could not even be entered: 24-43 tracebacks in 40 parses."""
    pauses, ignored = deep_collections
    for _ in range(20):
        for text in ("[" * 100_000, "[" * 100_000 + "]" * 100_000):
            with pytest.raises(JsonError):
                jsonbody.loads(text)
    assert [repr(u.exc_value) for u in ignored] == []
    assert pauses.untimed == 0 and pauses.passes(0) > 0
