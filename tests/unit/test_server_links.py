"""The registry's table of links keeps each pool's slots and its central links as links
come and go, whichever dict method moves them: the same as a walk over every link."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.server_registry import ServerLinks


def _walked(links: dict[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    slots: dict[str, int] = {}
    for link in links.values():
        slots[link.pool] = slots.get(link.pool, 0) + link.slots
    return slots, {sid: lk for sid, lk in links.items() if lk.queue is not None}


def _link(rng: random.Random, sid: str) -> SimpleNamespace:
    central = rng.random() < 0.4
    return SimpleNamespace(
        server_id=sid,
        pool=rng.choice(["default", "edge", "gpu"]),
        slots=rng.randint(1, 4),
        queue=object() if central else None,
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_kept_figures_are_those_of_a_walk(seed: int) -> None:
    rng = random.Random(seed)
    links = ServerLinks()
    ids = [f"s{i}" for i in range(12)]
    for _ in range(600):
        sid = rng.choice(ids)
        op = rng.choice(["set", "set", "del", "pop", "pop_missing", "popitem", "setdefault",
                         "update", "ior", "clear"])  # fmt: skip
        if op == "set":
            links[sid] = _link(rng, sid)  # new or replacing
        elif op == "del" and sid in links:
            del links[sid]
        elif op == "pop":
            had = links.get(sid)
            assert links.pop(sid, None) is had and sid not in links
        elif op == "pop_missing":
            with pytest.raises(KeyError):
                links.pop("nobody")
        elif op == "popitem" and links:
            key, link = links.popitem()
            assert link.server_id == key
        elif op == "setdefault":
            links.setdefault(sid, _link(rng, sid))
        elif op == "update":
            other = rng.choice(ids)
            links.update({other: _link(rng, other)}, **{sid: _link(rng, sid)})
        elif op == "ior":
            links |= {sid: _link(rng, sid)}
        elif op == "clear" and rng.random() < 0.1:
            links.clear()
        slots, central = _walked(links)
        assert links.pool_slots == slots
        assert links.central == central
    assert isinstance(links, dict)


def test_a_pool_with_no_slots_left_leaves_the_table() -> None:
    links = ServerLinks()
    links["a"] = SimpleNamespace(server_id="a", pool="edge", slots=2, queue=object())
    links["b"] = SimpleNamespace(server_id="b", pool="default", slots=1, queue=None)
    assert links.pool_slots == {"edge": 2, "default": 1} and list(links.central) == ["a"]
    del links["a"]
    assert links.pool_slots == {"default": 1} and links.central == {}
