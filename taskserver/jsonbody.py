"""JSON from a peer, parsed with a bounded nesting depth.

Task payloads, task results and request bodies are JSON written by someone else. Python's
parser recurses once per nesting level, so a body of 100,000 ``[`` raises RecursionError,
which nothing expects, and a document nested a few hundred levels deep parses but then
breaks whatever recurses over it next (``json.dumps`` in a deeper stack, an executor).
So every such document is held to MAX_DEPTH levels, the same on the gateway, the task
servers and the edge agents, and a deeper one is an ordinary ValueError naming the limit.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "JsonError", "check_depth", "loads"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a document from a peer."""

_decode = json.JSONDecoder().decode


class JsonError(ValueError):
    """Not JSON, or nested deeper than MAX_DEPTH; the message says which."""


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse `raw` as JSON of at most MAX_DEPTH levels; JsonError if it is not."""
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
        value = _decode(text)
    except RecursionError:
        raise JsonError(f"nested more than {MAX_DEPTH} levels deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise JsonError(f"invalid JSON: {exc}") from exc
    # Depth needs a walk only if the text has more than MAX_DEPTH brackets at all.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        check_depth(value)
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
