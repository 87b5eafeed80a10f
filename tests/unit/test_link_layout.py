"""A link and its connection keep their state in slots, not in a per-instance dict.

A query reads the link of each of its k tasks in turn (the target pick, the up check, the
dispatch, the result), and with thousands of links those reads miss the caches: attributes
in the object itself cost fewer cache lines than a __dict__ (README: the links in slots).
A base class with a __dict__, or an attribute set outside the slots, would undo that
silently; these tests say so instead.
"""

from __future__ import annotations

import pytest

from gateway.links import ServerLink
from taskserver.wire import ThriftConnection, gateway_body_types


def _link() -> ServerLink:
    return ServerLink(
        "s1", "127.0.0.1", 1, pool="p", on_result=lambda *a: None, on_failure=lambda *a: None
    )


def test_a_link_has_no_instance_dict_and_takes_no_attribute_beside_its_slots() -> None:
    link = _link()
    assert not hasattr(link, "__dict__")
    with pytest.raises(AttributeError):
        link.not_a_slot = 1  # type: ignore[attr-defined]
    # What the dispatch reads is set from the start.
    assert (link.state, link.queue, link.outstanding, link.tasks_sent) == (
        "connecting",
        None,
        {},
        0,
    )


def test_a_connection_has_no_instance_dict() -> None:
    conn = ThriftConnection(gateway_body_types(), lambda *a: None)
    assert not hasattr(conn, "__dict__")
    with pytest.raises(AttributeError):
        conn.not_a_slot = 1  # type: ignore[attr-defined]
    assert (conn.closed, conn.transport) == (False, None)
