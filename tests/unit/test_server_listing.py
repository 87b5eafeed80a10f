"""GET /v1/servers' filters and pages (`gateway.server_listing`), on fake links."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.server_listing import (
    MAX_PAGE,
    ServerQuery,
    encode_listing,
    list_servers,
    list_servers_spread,
)
from tests.unit.loop_ticks import turns_during


@dataclass
class FakeLink:
    server_id: str
    pool: str = "default"
    cluster: str | None = None
    display_state: str = "up"


def _view(link: Any) -> dict[str, Any]:
    return {"id": link.server_id}


def _links() -> list[FakeLink]:
    # Registration order is not id order.
    return [
        FakeLink("s3"), FakeLink("s1", cluster="east"), FakeLink("g2", pool="gpu"),
        FakeLink("s2", display_state="down"), FakeLink("s4", cluster="east"),
    ]  # fmt: skip


def _ids(body: dict[str, Any]) -> list[str]:
    return [s["id"] for s in body["servers"]]


def test_without_paging_every_server_comes_in_registration_order() -> None:
    body = list_servers(_links(), ServerQuery.parse({}), _view)
    assert body == {"servers": [_view(lk) for lk in _links()]}


def test_filters_keep_the_pool_cluster_and_state_asked_for() -> None:
    def ids(**query: str) -> list[str]:
        return _ids(list_servers(_links(), ServerQuery.parse(query), _view))

    assert ids(pool="default") == ["s3", "s1", "s2", "s4"]
    assert ids(pool="default", state="up") == ["s3", "s1", "s4"]
    assert ids(cluster="east") == ["s1", "s4"]
    assert ids(state="down") == ["s2"]
    assert ids(pool="nowhere") == []


def test_pages_follow_the_ids_and_say_where_the_next_starts() -> None:
    first = list_servers(_links(), ServerQuery.parse({"limit": "2"}), _view)
    assert first == {"servers": [{"id": "g2"}, {"id": "s1"}], "total": 5, "next_after": "s1"}
    second = list_servers(_links(), ServerQuery.parse({"limit": "2", "after": "s1"}), _view)
    assert _ids(second) == ["s2", "s3"] and second["next_after"] == "s3"
    last = list_servers(_links(), ServerQuery.parse({"limit": "2", "after": "s3"}), _view)
    assert _ids(last) == ["s4"] and last["next_after"] is None
    rest = list_servers(_links(), ServerQuery.parse({"after": "s2", "pool": "default"}), _view)
    assert rest == {"servers": [{"id": "s3"}, {"id": "s4"}], "total": 4, "next_after": None}


def test_only_the_page_is_viewed() -> None:
    viewed: list[str] = []

    def view(link: Any) -> dict[str, Any]:
        viewed.append(link.server_id)
        return _view(link)

    list_servers(_links(), ServerQuery.parse({"limit": "1", "after": "s2"}), view)
    assert viewed == ["s3"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "sleeping"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": str(MAX_PAGE + 1)}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "2.5"}, "limit"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(query: dict[str, str], field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        ServerQuery.parse(query)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "query",
    [{}, {"pool": "default"}, {"limit": "2"}, {"limit": "2", "after": "s1"}, {"state": "down"}],
)
async def test_the_spread_listing_is_the_listing_and_lets_the_loop_run(
    query: dict[str, str],
) -> None:
    links = _links() * 3  # 15 servers, 5 to a slice: the loop runs between them
    whole = list_servers(links, ServerQuery.parse(query), _view)
    spread, turns = await turns_during(
        list_servers_spread(links, ServerQuery.parse(query), _view, slice_size=5)
    )
    assert spread == whole
    # A pause between slices of 5: the loop ran once or more in each.
    assert turns >= (len(whole["servers"]) - 1) // 5
    assert turns >= 2 or query != {}


def test_the_listing_encodes_as_the_standard_library_reads_it() -> None:
    body = list_servers(_links(), ServerQuery.parse({"limit": "2"}), _view)
    assert json.loads(encode_listing(body)) == body
    # What orjson refuses still encodes (the standard library's way).
    odd = {"servers": [{"id": "s\ud800"}]}
    assert json.loads(encode_listing(odd)) == odd
