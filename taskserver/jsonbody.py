"""JSON from a peer, parsed with a bounded nesting depth.

Task payloads, task results and request bodies are JSON written by someone else. Python's
parser recurses once per nesting level, so a body of 100,000 ``[`` raises RecursionError,
which nothing expects, and a document nested a few hundred levels deep parses but then
breaks whatever recurses over it next (``json.dumps`` in a deeper stack, an executor).
So every such document is held to MAX_DEPTH levels, the same on the gateway, the task
servers and the edge agents, and a deeper one is an ordinary ValueError naming the limit.

The parser is not let recurse that deep to find out: a collection that starts at the bottom
of such a stack runs its callbacks there (the process's GC pause timer, taskserver.heap),
where even a comparison raises RecursionError and the collector prints a traceback. A text
with more than MAX_DEPTH brackets is first read for its brackets alone, outside its strings
(`_too_deep`), and one that nests deeper, or whose brackets do not pair up, is refused
before the parser sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "JsonError", "check_depth", "loads"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a document from a peer."""

_decode = json.JSONDecoder().decode


class JsonError(ValueError):
    """Not JSON, or nested deeper than MAX_DEPTH; the message says which."""


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string literal, escapes included (the unrolled form: no backtracking per char)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _too_deep(text: str, limit: int = MAX_DEPTH) -> tuple[str | None, int]:
    """Why `text` cannot be parsed within `limit` levels, read from its brackets alone
    (outside its strings), or None; and the passes that took.

    Each pass removes every adjacent pair ``[]`` and ``{}``, so it takes at least one level
    off the deepest chain, and at most two (a ``{}`` freed by removing ``[]`` pairs goes in
    the same pass): brackets left after `limit` passes nest more than `limit` deep, a pass
    that removes nothing leaves brackets that never pair up (not JSON), and a text read in
    p passes nests at most 2p levels."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for passes in range(limit):
        if not brackets:
            return None, passes
        shorter = brackets.replace("[]", "").replace("{}", "")
        if len(shorter) == len(brackets):
            return "invalid JSON: its brackets do not pair up", passes
        brackets = shorter
    return (None if not brackets else f"nested more than {limit} levels deep"), limit


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse `raw` as JSON of at most MAX_DEPTH levels; JsonError if it is not."""
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonError(f"invalid JSON: {exc}") from exc
    # Depth needs a look only if the text has more than MAX_DEPTH brackets at all.
    passes = 0
    if text.count("[") + text.count("{") > MAX_DEPTH:
        problem, passes = _too_deep(text)
        if problem is not None:
            raise JsonError(problem)
    try:
        value = _decode(text)
    except RecursionError:  # only from a stack already deep when called
        raise JsonError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise JsonError(f"invalid JSON: {exc}") from exc
    if 2 * passes > MAX_DEPTH:
        check_depth(value)  # the exact depth: the passes bound it by 2 * passes only
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """JsonError if `value` (parsed JSON) nests arrays and objects deeper than `limit`."""
    if type(value) not in _CONTAINERS:
        return
    level, depth = [value], 1
    while level:  # breadth first, one level at a time
        if depth > limit:
            raise JsonError(f"nested more than {limit} levels deep")
        below = []
        for node in level:
            items = node.values() if type(node) is dict else node
            below += [c for c in items if type(c) in _CONTAINERS]
        level, depth = below, depth + 1


_CONTAINERS = (dict, list)
