"""Pop order, miss accounting and cancellation of the four queue disciplines."""

from __future__ import annotations

import pytest

from taskserver.queues import (
    Dequeued,
    QueuedTask,
    QueueFull,
    QueuePolicy,
    TaskQueue,
    create_task_queue,
)


def make_task(
    query_id: str,
    *,
    task_index: int = 0,
    deadline_s: float = 10.0,
    slo_deadline_s: float = 10.0,
    priority: int = 0,
    arrival_s: float = 0.0,
) -> QueuedTask:
    return QueuedTask(
        query_id=query_id,
        task_index=task_index,
        deadline_s=deadline_s,
        slo_deadline_s=slo_deadline_s,
        priority=priority,
        arrival_s=arrival_s,
    )


def pop_all(queue: TaskQueue, now: float = 100.0) -> list[str]:
    order = []
    while (out := queue.pop(now)) is not None:
        order.append(out.task.query_id)
    return order


# A hand-built mix: "late-tight" arrives last with a large fanout (tight t_D) but a loose SLO;
# "hi" is the high class (priority 0, tight SLO) with fanout 1 (loose t_D).
MIX = [
    dict(query_id="early-loose", deadline_s=9.0, slo_deadline_s=10.0, priority=1, arrival_s=0.0),
    dict(query_id="hi", deadline_s=8.0, slo_deadline_s=5.0, priority=0, arrival_s=1.0),
    dict(query_id="mid", deadline_s=7.0, slo_deadline_s=9.0, priority=2, arrival_s=2.0),
    dict(query_id="late-tight", deadline_s=3.0, slo_deadline_s=12.0, priority=1, arrival_s=3.0),
]


def filled(policy: QueuePolicy) -> TaskQueue:
    queue = TaskQueue(policy)
    for fields in MIX:
        queue.push(make_task(**fields))
    return queue


def test_tf_edfq_serves_tight_fanout_deadline_first_even_if_it_arrived_last():
    assert pop_all(filled(QueuePolicy.TF_EDFQ)) == ["late-tight", "mid", "hi", "early-loose"]


def test_t_edfq_orders_by_slo_deadline_ignoring_fanout_deadline():
    assert pop_all(filled(QueuePolicy.T_EDFQ)) == ["hi", "mid", "early-loose", "late-tight"]


def test_priq_is_strict_by_priority_then_arrival():
    assert pop_all(filled(QueuePolicy.PRIQ)) == ["hi", "early-loose", "late-tight", "mid"]


def test_fifo_is_arrival_order():
    assert pop_all(filled(QueuePolicy.FIFO)) == ["early-loose", "hi", "mid", "late-tight"]


def test_default_policy_is_tf_edfq():
    assert TaskQueue().policy is QueuePolicy.TF_EDFQ


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_ties_break_by_arrival_then_insertion_order(policy):
    queue = TaskQueue(policy)
    # Same deadlines, SLO deadlines and priority; arrivals 1.0, 0.0, 1.0, 0.0 in push order.
    for name, arrival in [("b1", 1.0), ("a1", 0.0), ("b2", 1.0), ("a2", 0.0)]:
        queue.push(make_task(name, arrival_s=arrival))
    assert pop_all(queue) == ["a1", "a2", "b1", "b2"]


def test_key_is_the_explicit_policy_key():
    task = make_task("q", deadline_s=3.0, slo_deadline_s=4.0, priority=2, arrival_s=1.0)
    assert TaskQueue(QueuePolicy.TF_EDFQ).key(task) == (3.0, 1.0)
    assert TaskQueue(QueuePolicy.T_EDFQ).key(task) == (4.0, 1.0)
    assert TaskQueue(QueuePolicy.PRIQ).key(task) == (2, 1.0)
    assert TaskQueue(QueuePolicy.FIFO).key(task) == (1.0,)


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_miss_accounting_is_on_the_fanout_deadline_for_every_policy(policy):
    queue = TaskQueue(policy)
    # slo_deadline_s would say "met" at now=2.5; t_D says missed.
    queue.push(make_task("a", deadline_s=2.0, slo_deadline_s=9.0, arrival_s=0.5))
    out = queue.pop(now=2.5)
    assert out == Dequeued(task=out.task, wait_s=2.0, missed_deadline=True)
    assert (queue.popped, queue.missed) == (1, 1)


def test_dequeue_exactly_at_the_deadline_is_not_a_miss():
    queue = TaskQueue()
    queue.push(make_task("a", deadline_s=2.0, arrival_s=0.25))
    queue.push(make_task("b", deadline_s=2.0, arrival_s=0.5))
    first = queue.pop(now=2.0)
    second = queue.pop(now=2.0 + 1e-9)
    assert (first.task.query_id, first.wait_s, first.missed_deadline) == ("a", 1.75, False)
    assert (second.task.query_id, second.missed_deadline) == ("b", True)
    assert (queue.popped, queue.missed) == (2, 1)


def test_pop_and_peek_on_empty_queue():
    queue = TaskQueue()
    assert queue.pop(now=1.0) is None
    assert queue.peek() is None
    assert (queue.popped, queue.missed, len(queue)) == (0, 0, 0)


def test_peek_returns_the_next_task_without_removing_it():
    queue = filled(QueuePolicy.TF_EDFQ)
    assert queue.peek().query_id == "late-tight"
    assert len(queue) == 4
    assert queue.pop(now=0.0).task.query_id == "late-tight"


def test_item_is_carried_through():
    queue = TaskQueue()
    payload = object()
    task = make_task("q")
    task.item = payload
    queue.push(task)
    assert queue.pop(now=0.0).task.item is payload


def test_remove_query_removes_only_that_query_and_keeps_order():
    queue = TaskQueue(QueuePolicy.TF_EDFQ)
    for i in range(3):
        queue.push(make_task("gone", task_index=i, deadline_s=1.0 + i, arrival_s=0.0))
    for name, deadline in [("x", 0.5), ("y", 1.5), ("z", 2.5)]:
        queue.push(make_task(name, deadline_s=deadline))
    removed = queue.remove_query("gone")
    assert [(t.query_id, t.task_index) for t in removed] == [("gone", 0), ("gone", 1), ("gone", 2)]
    assert len(queue) == 3
    assert queue.peek().query_id == "x"
    assert queue.remove_query("gone") == []
    assert queue.remove_query("never-seen") == []
    assert pop_all(queue) == ["x", "y", "z"]
    assert len(queue) == 0
    assert queue.popped == 3


def test_remove_query_after_some_of_its_tasks_were_popped():
    queue = TaskQueue(QueuePolicy.FIFO)
    for i in range(3):
        queue.push(make_task("q", task_index=i, arrival_s=float(i)))
    queue.push(make_task("other", arrival_s=5.0))
    assert queue.pop(now=0.0).task.task_index == 0
    assert [t.task_index for t in queue.remove_query("q")] == [1, 2]
    assert len(queue) == 1
    assert pop_all(queue) == ["other"]


def test_many_removals_compact_the_heap_and_keep_len_and_order():
    queue = TaskQueue(QueuePolicy.TF_EDFQ)
    for i in range(1000):
        queue.push(make_task(f"q{i}", deadline_s=float(1000 - i)))
    for i in range(0, 1000, 3):
        queue.remove_query(f"q{i}")
    kept = [i for i in range(1000) if i % 3]
    assert len(queue) == len(kept)
    assert pop_all(queue) == [f"q{i}" for i in reversed(kept)]


def test_a_query_may_be_pushed_again_after_removal():
    queue = TaskQueue()
    queue.push(make_task("q", deadline_s=2.0))
    queue.remove_query("q")
    queue.push(make_task("q", deadline_s=1.0))
    assert len(queue) == 1
    assert pop_all(queue) == ["q"]


def test_drain_returns_live_tasks_in_policy_order_and_empties_the_queue():
    queue = filled(QueuePolicy.FIFO)
    queue.remove_query("hi")
    queue.pop(now=0.0)
    drained = queue.drain()
    assert [t.query_id for t in drained] == ["mid", "late-tight"]
    assert len(queue) == 0
    assert queue.pop(now=0.0) is None
    assert (queue.popped, queue.missed) == (1, 0)


def test_max_len_raises_queue_full_and_frees_up_after_pop_or_removal():
    queue = TaskQueue(max_len=2)
    queue.push(make_task("a"))
    queue.push(make_task("b"))
    with pytest.raises(QueueFull, match="max_len=2"):
        queue.push(make_task("c"))
    assert len(queue) == 2
    queue.pop(now=0.0)
    queue.push(make_task("c"))
    queue.remove_query("c")
    queue.push(make_task("d"))
    assert len(queue) == 2


@pytest.mark.parametrize("max_len", [0, -1, 1.5, True])
def test_bad_max_len_is_rejected(max_len):
    with pytest.raises(ValueError, match="max_len"):
        TaskQueue(max_len=max_len)


@pytest.mark.parametrize(
    ("name", "policy"),
    [
        ("tf-edfq", QueuePolicy.TF_EDFQ),
        ("T_EDFQ", QueuePolicy.T_EDFQ),
        ("priq", QueuePolicy.PRIQ),
        (QueuePolicy.FIFO, QueuePolicy.FIFO),
    ],
)
def test_factory_builds_the_configured_policy(name, policy):
    queue = create_task_queue(name, max_len=5)
    assert queue.policy is policy
    assert queue.max_len == 5


def test_unknown_policy_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'edf'") as info:
        create_task_queue("edf")
    for valid in ("tf-edfq", "t-edfq", "priq", "fifo"):
        assert repr(valid) in str(info.value)


def test_peek_and_pop_skip_a_cancelled_head():
    queue = TaskQueue(QueuePolicy.TF_EDFQ)
    for name, deadline in [("head", 0.5), ("a", 1.0), ("b", 2.0), ("c", 3.0)]:
        queue.push(make_task(name, deadline_s=deadline))
    assert [t.query_id for t in queue.remove_query("head")] == ["head"]
    assert queue.peek().query_id == "a"
    assert len(queue) == 3
    assert pop_all(queue) == ["a", "b", "c"]
    assert queue.popped == 3
