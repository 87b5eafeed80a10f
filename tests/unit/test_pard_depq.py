"""DEPQ operations against a sorted-list oracle, and the worker queues built on it."""

from __future__ import annotations

import random

import pytest

from taskserver.pard import (
    BudgetQueue,
    DoubleEndedPriorityQueue,
    DuplicateRequest,
    FifoQueue,
    PipelineRequest,
    QueueOrder,
    create_queue,
)


def make_request(request_id: object, deadline_s: float, slo_s: float = 0.4) -> PipelineRequest:
    return PipelineRequest(request_id, deadline_s, slo_s, received_s=0.0)


class Oracle:
    """Sorted list of (key, seq, id): the obvious, slow DEPQ."""

    def __init__(self) -> None:
        self.items: list[tuple[float, int, int]] = []

    def push(self, key: float, seq: int, item_id: int) -> None:
        self.items.append((key, seq, item_id))
        self.items.sort()

    def pop_min(self) -> int:
        return self.items.pop(0)[2]

    def pop_max(self) -> int:
        # Largest key; among equal keys the earliest push (the DEPQ's documented tie rule).
        top = max(self.items, key=lambda e: (e[0], -e[1]))
        self.items.remove(top)
        return top[2]

    def remove(self, item_id: int) -> bool:
        for e in self.items:
            if e[2] == item_id:
                self.items.remove(e)
                return True
        return False


def test_depq_matches_sorted_list_oracle_on_random_operations() -> None:
    rng = random.Random(20240517)
    depq: DoubleEndedPriorityQueue[str] = DoubleEndedPriorityQueue()
    oracle = Oracle()
    next_id = 0
    for _ in range(20_000):
        op = rng.random()
        if op < 0.45 or not oracle.items:
            key = float(rng.randint(0, 50))  # few distinct keys: ties are common
            depq.push(next_id, key, f"item{next_id}")
            oracle.push(key, next_id, next_id)
            next_id += 1
        elif op < 0.65:
            assert depq.peek_min() == f"item{oracle.items[0][2]}"
            assert depq.pop_min() == f"item{oracle.pop_min()}"
        elif op < 0.85:
            assert depq.pop_max() == f"item{oracle.pop_max()}"
        else:
            victim = rng.randrange(next_id)
            present = oracle.remove(victim)
            assert (depq.remove(victim) is not None) is present
            assert victim not in depq
        assert len(depq) == len(oracle.items)
    while oracle.items:
        assert depq.pop_max() == f"item{oracle.pop_max()}"
    assert len(depq) == 0


def test_depq_memory_stays_proportional_to_live_items() -> None:
    depq: DoubleEndedPriorityQueue[int] = DoubleEndedPriorityQueue()
    for i in range(10_000):
        depq.push(i, float(i), i)
        if i >= 10:
            depq.pop_min()  # leaves a tombstone in the max heap each time
    assert len(depq) == 10
    assert len(depq._max) <= 4 * len(depq) + 64 + 1
    assert [depq.pop_max() for _ in range(10)] == list(range(9999, 9989, -1))


def test_depq_errors() -> None:
    depq: DoubleEndedPriorityQueue[int] = DoubleEndedPriorityQueue()
    with pytest.raises(IndexError):
        depq.pop_min()
    with pytest.raises(IndexError):
        depq.peek_max()
    depq.push("a", 1.0, 1)
    with pytest.raises(DuplicateRequest, match="'a'"):
        depq.push("a", 2.0, 2)
    with pytest.raises(ValueError, match="NaN"):
        depq.push("b", float("nan"), 3)
    assert depq.remove("missing") is None
    assert depq.key("a") == 1.0


def test_fixed_orders_pop_by_remaining_budget() -> None:
    for order, expected in ((QueueOrder.HBF, ["c", "b", "a"]), (QueueOrder.LBF, ["a", "b", "c"])):
        queue = BudgetQueue(order)
        for rid, deadline in (("b", 0.5), ("a", 0.3), ("c", 0.9)):
            queue.push(make_request(rid, deadline), now=0.0)
        assert [queue.pop(0.1).request_id for _ in range(3)] == expected
        assert queue.pop(0.1) is None


def test_budget_queue_remove_and_peek_both_ends() -> None:
    queue = BudgetQueue(QueueOrder.LBF)
    for rid, deadline in (("x", 0.2), ("y", 0.4), ("z", 0.6)):
        queue.push(make_request(rid, deadline), now=0.0)
    assert queue.remove("x").request_id == "x"
    assert "x" not in queue and len(queue) == 2
    assert queue.peek_min().request_id == "y"
    assert queue.peek_max().request_id == "z"
    assert queue.pop_max().request_id == "z"


def test_fifo_queue_is_arrival_order_with_remove_by_id() -> None:
    queue = FifoQueue()
    for rid, deadline in (("1", 0.9), ("2", 0.1), ("3", 0.5)):
        queue.push(make_request(rid, deadline), now=0.0)
    with pytest.raises(DuplicateRequest):
        queue.push(make_request("2", 0.3), now=0.0)
    assert [r.request_id for r in queue.head(2)] == ["1", "2"]
    assert queue.remove("2").request_id == "2"
    assert [queue.pop(0.0).request_id for _ in range(2)] == ["1", "3"]
    assert queue.pop(0.0) is None


def test_create_queue_by_name() -> None:
    assert isinstance(create_queue("fcfs"), FifoQueue)
    assert create_queue("adaptive").order is QueueOrder.ADAPTIVE
    with pytest.raises(ValueError, match="'random'"):
        create_queue("random")
    with pytest.raises(ValueError, match="fcfs"):
        BudgetQueue("fcfs")
