"""The allocation layer's DRR and fair queueing against hand-computed sequences."""

from __future__ import annotations

import pytest

from admission import PolicyValueError
from admission.allocation import DeficitRoundRobin, FairQueue


def drain(q: DeficitRoundRobin | FairQueue) -> list[str]:
    out = []
    while (nxt := q.pop()) is not None:
        out.append(f"{nxt[0]}{nxt[1]}")
    return out


def test_drr_shares_by_weight_in_unit_costs() -> None:
    q = DeficitRoundRobin({"a": 1.0, "b": 2.0}, quantum=1.0)
    for i in range(4):
        q.push("a", i, 1.0)
        q.push("b", i, 1.0)
    # Each round: a's quantum 1 releases one, b's quantum 2 releases two.
    assert drain(q) == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "a3"]
    assert q.flows["a"].deficit == 0.0 and q.flows["b"].released_cost == 4.0


def test_drr_carries_the_deficit_over_for_costly_items() -> None:
    q = DeficitRoundRobin({"big": 1.0, "small": 1.0}, quantum=2.0)
    q.push("big", 0, 3.0)
    q.push("big", 1, 3.0)
    for i in range(5):
        q.push("small", i, 1.0)
    # Round 1: big has 2 < 3 and passes (carries 2); small spends 2 on two items.
    # Round 2: big has 4: releases one (1 left, < 3); small two more. Round 3: big 3 -> one.
    assert drain(q) == ["small0", "small1", "big0", "small2", "small3", "big1", "small4"]


def test_drr_gives_an_idle_flow_no_share_and_no_credit() -> None:
    q = DeficitRoundRobin({"a": 1.0, "b": 1.0}, quantum=5.0)
    q.push("a", 0, 1.0)
    assert q.pop() == ("a", 0)
    assert q.flows["a"].deficit == 0.0  # emptied: the unused 4 are not banked
    for i in range(3):
        q.push("b", i, 1.0)
    assert drain(q) == ["b0", "b1", "b2"]  # b alone uses the whole capacity (borrowing)
    assert q.pop() is None


def test_drr_congestion_grows_the_protected_share() -> None:
    q = DeficitRoundRobin({"short": 1.0, "heavy": 1.0}, quantum=1.0,
                          protected=frozenset({"short"}), boost=2.0)  # fmt: skip
    for i in range(6):
        q.push("short", i, 1.0)
        q.push("heavy", i, 1.0)
    q.set_congestion(0.5)  # short's weight 1 * (1 + 2 * 0.5) = 2
    assert q.weight("short") == 2.0 and q.weight("heavy") == 1.0
    assert drain(q)[:6] == ["short0", "short1", "heavy0", "short2", "short3", "heavy1"]
    q.set_congestion(7.0)
    assert q.congestion == 1.0


def test_drr_skips_rounds_without_a_release_at_once() -> None:
    q = DeficitRoundRobin({"a": 1.0, "b": 1.0}, quantum=1.0)
    q.push("a", 0, 1e9)
    q.push("b", 0, 2e9)
    assert q.pop() == ("a", 0)  # a billion rounds later, in one step
    assert q.flows["b"].deficit == pytest.approx(1e9)
    assert q.pop() == ("b", 0)


def test_fair_queue_interleaves_by_weight() -> None:
    q = FairQueue({"a": 1.0, "b": 2.0})
    for i in range(3):
        q.push("a", i, 2.0)
        q.push("b", i, 2.0)
    # Finish tags: a 2, 4, 6; b 1, 2, 3; start tags a 0, 2, 4; b 0, 1, 2 (ties: pushed first).
    assert drain(q) == ["a0", "b0", "b1", "a1", "b2", "a2"]
    assert q.released_cost == {"a": 6.0, "b": 6.0}


def test_bad_allocation_settings_are_refused() -> None:
    with pytest.raises(PolicyValueError, match="quantum"):
        DeficitRoundRobin({}, quantum=0.0)
    with pytest.raises(PolicyValueError, match="weight of 'a'"):
        DeficitRoundRobin({"a": -1.0}, quantum=1.0)
    with pytest.raises(PolicyValueError, match="cost"):
        FairQueue({}).push("a", 0, float("nan"))


def test_drr_orders_within_a_flow_by_the_shells_key() -> None:
    # Allocation picks the flow; the key (say, a task deadline) picks the item within it.
    q = DeficitRoundRobin({"a": 1.0, "b": 1.0}, quantum=1.0)
    for item, deadline in ((0, 3.0), (1, 1.0), (2, 2.0)):
        q.push("a", item, 1.0, key=deadline)
    q.push("b", 0, 1.0)
    assert drain(q) == ["a1", "b0", "a2", "a0"]
