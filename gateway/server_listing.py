"""GET /v1/servers: the registered servers, filtered, and a page at a time when asked.

Building a server's view reads its link, its CDF row and its counters: tens of
microseconds, so the whole listing of 10,000 servers takes a good part of a second of the
event loop that also runs the queries. Filters (``pool``, ``cluster``, ``state``) pick the
servers before any view is built, and ``limit`` with ``after`` pages through them in
server-id order: a page costs its own views plus one sort of the ids. Without ``limit``
and ``after`` the listing is every server that passes the filters, in registration order,
as it always was.
"""

from __future__ import annotations

import asyncio
import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import BadRequest

if TYPE_CHECKING:
    from gateway.links import TaskLink

__all__ = [
    "LISTING_SLICE",
    "MAX_PAGE",
    "STATES",
    "ServerQuery",
    "encode_listing",
    "list_servers",
    "list_servers_spread",
    "pick_servers",
]

LISTING_SLICE = 250
"""Server views a listing builds before it lets the event loop run."""
MAX_PAGE = 10_000
"""Most servers one page may hold (`limit`)."""
STATES = ("connecting", "up", "down", "draining", "owned_elsewhere", "closed")
"""What `state` may name: the states GET /v1/servers shows (TaskLink.display_state)."""


@dataclass(frozen=True, slots=True)
class ServerQuery:
    """Which servers to list: filters, and the page (limit None: no paging)."""

    pool: str | None = None
    cluster: str | None = None
    state: str | None = None
    limit: int | None = None
    after: str | None = None
    """List only the servers whose id sorts after this one (the previous page's last)."""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> ServerQuery:
        """From a request's query string; BadRequest naming the parameter at fault."""
        state = query.get("state")
        if state is not None and state not in STATES:
            raise BadRequest(f"must be one of {', '.join(STATES)}, got {state!r}", field="state")
        limit = None
        raw = query.get("limit")
        if raw is not None:
            try:
                limit = int(raw)
            except ValueError:
                limit = 0
            if not 1 <= limit <= MAX_PAGE:
                raise BadRequest(
                    f"must be a whole number in 1..{MAX_PAGE}, got {raw!r}", field="limit"
                )
        return cls(query.get("pool"), query.get("cluster"), state, limit, query.get("after"))

    @property
    def paged(self) -> bool:
        """Whether the answer is a page (sorted by id, with `total` and `next_after`)."""
        return self.limit is not None or self.after is not None

    def admits(self, link: TaskLink) -> bool:
        """Whether the filters keep this server."""
        return (
            (self.pool is None or link.pool == self.pool)
            and (self.cluster is None or link.cluster == self.cluster)
            and (self.state is None or link.display_state == self.state)
        )


def list_servers(
    links: Iterable[TaskLink], q: ServerQuery, view: Callable[[TaskLink], dict[str, Any]]
) -> dict[str, Any]:
    """The body of GET /v1/servers: `view` of each server `q` keeps, a page of them when
    `q` pages (then with the count of all it keeps, and the id to ask `after` next)."""
    page, body = pick_servers(links, q)
    return {"servers": [view(lk) for lk in page], **body}


async def list_servers_spread(
    links: Iterable[TaskLink],
    q: ServerQuery,
    view: Callable[[TaskLink], dict[str, Any]],
    slice_size: int = LISTING_SLICE,
) -> dict[str, Any]:
    """`list_servers`, its views built a slice of servers at a time with the event loop run
    between slices: the whole listing of 10,000 servers held the loop most of a second. The
    servers are those kept when it starts; each view is read when its slice is built."""
    page, body = pick_servers(links, q)
    views: list[dict[str, Any]] = []
    for i in range(0, len(page), slice_size):
        if i:
            await asyncio.sleep(0)
        views.extend(view(lk) for lk in page[i : i + slice_size])
    return {"servers": views, **body}


def encode_listing(body: dict[str, Any]) -> bytes:
    """The listing as JSON: orjson (the standard library's encoder took 72 ms of the loop
    for 10,000 views, orjson 8 ms: medians of 5 runs on the 2-core VM), the standard
    library for what orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(body).encode()


def pick_servers(
    links: Iterable[TaskLink], q: ServerQuery
) -> tuple[list[TaskLink], dict[str, Any]]:
    """The servers `q` lists, in its order, and the rest of the body (`total` and
    `next_after` when it pages)."""
    kept = [lk for lk in links if q.admits(lk)]
    if not q.paged:
        return kept, {}
    kept.sort(key=lambda lk: lk.server_id)
    start = 0 if q.after is None else bisect_right([lk.server_id for lk in kept], q.after)
    end = len(kept) if q.limit is None else start + q.limit
    page = kept[start:end]
    return page, {
        "total": len(kept),
        "next_after": page[-1].server_id if end < len(kept) and page else None,
    }
