"""The allocation layer's DRR and fair queueing against hand-computed sequences, a server
queue shared by flows, and the admission share."""

from __future__ import annotations

import pytest

from admission import AllocationConfig, PolicyValueError
from admission.allocation import (
    AdmissionShare,
    DeficitRoundRobin,
    DrrArbiter,
    FairArbiter,
    FairQueue,
)
from gateway.allocation import AllocatedQueue
from taskserver.queues import QueuedTask, create_task_queue


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


# -- a server's queue shared by flows (gateway.allocation) ---------------------------------


def task(flow: str, i: int, deadline: float, cost: float = 1.0) -> QueuedTask:
    return QueuedTask(f"{flow}{i}", 0, deadline, deadline, 0, 0.0, None, flow, cost)


def test_allocated_queue_shares_slots_by_weight_and_keeps_edf_within_a_flow() -> None:
    q = AllocatedQueue("tf-edfq", DrrArbiter({"flood": 1.0, "light": 1.0}, quantum=1.0))
    # The flood's tasks all have earlier deadlines: plain TF-EDFQ would send them all first.
    for i in range(6):
        q.push(task("flood", i, deadline=1.0 + i))
    for i in range(3):
        q.push(task("light", i, deadline=100.0 - i))  # EDF within the flow: light2 first
    order = []
    while (dq := q.pop(now=50.0)) is not None:
        order.append(dq.task.query_id)
    assert order == ["flood0", "light2", "flood1", "light1", "flood2", "light0",
                     "flood3", "flood4", "flood5"]  # fmt: skip
    assert len(q) == 0 and q.popped == 9
    assert q.missed == 6  # each flood task left after its deadline (now = 50)


def test_allocated_queue_weights_cost_not_task_count() -> None:
    # A fanout-32 query's tasks each cost 4 units, a small query's 1: at equal weights the
    # small flow releases four tasks per big one.
    q = AllocatedQueue("fifo", DrrArbiter({}, quantum=4.0))
    for i in range(3):
        q.push(task("big", i, 0.0, cost=4.0))
    for i in range(8):
        q.push(task("small", i, 0.0, cost=1.0))
    order = [q.pop(0.0).task.query_id for _ in range(11)]  # type: ignore[union-attr]
    assert order[:10] == ["big0", "small0", "small1", "small2", "small3",
                          "big1", "small4", "small5", "small6", "small7"]  # fmt: skip


def test_allocated_queue_removal_leaves_the_round_consistent() -> None:
    q = AllocatedQueue("tf-edfq", FairArbiter({}))
    q.push(task("a", 0, 1.0))
    q.push(task("b", 0, 2.0))
    q.push(task("b", 1, 3.0))
    assert [t.query_id for t in q.remove_query("a0")] == ["a0"]
    assert q.backlog() == {"b": 2}
    assert q.pop(0.0).task.query_id == "b0"  # type: ignore[union-attr]
    q.push(task("a", 1, 0.5))  # a comes back after leaving the round
    assert {q.pop(0.0).task.query_id, q.pop(0.0).task.query_id} == {"a1", "b1"}  # type: ignore[union-attr]
    assert q.pop(0.0) is None and q.drain() == []


def test_allocated_queue_counts_other_flows_ahead_by_their_weighted_share() -> None:
    q = AllocatedQueue("tf-edfq", DrrArbiter({"heavy": 1.0, "light": 1.0}, quantum=1.0))
    for i in range(10):
        q.push(task("heavy", i, deadline=1.0 + i))
    q.push(task("light", 0, deadline=50.0))
    probe = task("light", 1, deadline=60.0)
    ahead = q.ahead_of(probe)
    # Its own flow's light0, and of the heavy flow as much cost as light releases by then
    # (light0 + the probe: 2 units at equal weights): heavy0, heavy1. Not all ten.
    assert sorted(t.query_id for t in ahead) == ["heavy0", "heavy1", "light0"]
    plain = create_task_queue("tf-edfq")
    for t in (*(task("heavy", i, 1.0 + i) for i in range(10)), task("light", 0, 50.0)):
        plain.push(t)
    assert len(plain.ahead_of(probe)) == 11


# -- the admission share --------------------------------------------------------------------


def test_share_moves_a_refusal_to_the_flow_served_most() -> None:
    s = AdmissionShare({"flood": 1.0, "light": 1.0}, window_s=10.0)
    for i in range(10):
        assert s.decide("flood", 32.0, True, now_s=i * 0.01)
    # The rule refuses everyone now; light has been served nothing: it enters on flood's account.
    assert s.decide("light", 4.0, False, now_s=0.2)
    assert s.flows["flood"].debt == pytest.approx(4.0)
    # flood's own refusal stays a refusal (it is the most served).
    assert not s.decide("flood", 32.0, False, now_s=0.21)
    # The rule admits again: flood's next query repays the debt instead of entering.
    assert not s.decide("flood", 32.0, True, now_s=0.3)
    assert s.flows["flood"].debt == 0.0
    assert s.decide("flood", 32.0, True, now_s=0.31)
    snap = s.snapshot(0.4)
    assert snap["light"]["admitted_for_share"] == 1 and snap["flood"]["refused_for_share"] == 1
    assert snap["flood"]["refused"] == 1


def test_share_leaves_a_lone_flow_to_the_rule_and_bounds_the_debt() -> None:
    s = AdmissionShare({}, window_s=1.0)
    assert not s.decide("only", 1.0, False, now_s=0.0)  # no one else to take the refusal
    assert s.decide("a", 1.0, True, now_s=0.0)
    for _ in range(5):
        assert s.decide("b", 0.1, False, now_s=0.0)
    assert s.flows["a"].debt == pytest.approx(0.5)
    assert not s.decide("b", 2.0, False, now_s=0.0)  # 0.5 + 2 > a's 1: b is the most served now
    # The debt never exceeds what the flow itself was admitted over the window.
    for _ in range(50):
        s.decide("c", 0.01, False, now_s=0.0)
    assert s.flows["a"].debt <= s.flows["a"].admitted + 1e-12
    with pytest.raises(PolicyValueError, match="share_window_s"):
        AdmissionShare({}, window_s=0.0)


def test_allocation_config_checks_its_keys() -> None:
    assert not AllocationConfig().enabled
    cfg = AllocationConfig(policy="drr", weights={"a": 2.0}, protected=("a",), quantum_ms=0.5)
    arb = cfg.arbiter()
    assert isinstance(arb, DrrArbiter) and arb.weight("a") == 2.0 and arb.quantum == 0.5
    assert isinstance(AllocationConfig(policy="fair").arbiter(), FairArbiter)
    assert AllocationConfig(policy="drr").admission_share() is None  # windows: gates per flow
    assert AllocationConfig(policy="drr").gate_per_flow
    assert AllocationConfig(policy="drr", share="transfer").admission_share() is not None
    assert not AllocationConfig(policy="none").gate_per_flow
    for bad, match in (
        ({"policy": "wfq"}, "policy"),
        ({"flows": "user"}, "flows"),
        ({"weights": {"a": 0.0}}, "weights.a"),
        ({"quantum_ms": -1.0}, "quantum_ms"),
        ({"share": "maybe"}, "share"),
        ({"order": "random"}, "order"),
        ({"max_flows": 0}, "max_flows"),
        ({"boost": float("inf")}, "boost"),
    ):
        with pytest.raises(ValueError, match=match):
            AllocationConfig(**bad)  # type: ignore[arg-type]
