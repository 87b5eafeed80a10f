"""The drop decision of PARD eq. (3), its ablations and the DEPQ batch forming, by hand."""

from __future__ import annotations

import pytest

from taskserver.pard import (
    DROPPER_NAMES,
    BudgetQueue,
    ClipperPlusPlus,
    Estimator,
    FifoQueue,
    ModuleState,
    NexusDropper,
    NoDropper,
    PipelineGraph,
    PipelineRequest,
    QueueOrder,
    Reason,
    RequestBroker,
    StatePlanner,
    create_dropper,
)

# Durations are dyadic (62.5 ms = 1/16 s, ...) so every sum below is exact in binary floats.


class TableProfile:
    def __init__(self, ms: dict[str, float]) -> None:
        self.ms = ms

    def duration_ms(self, module_id: str, batch: int) -> float:
        return self.ms[module_id] * batch


def request(rid: object, sent_s: float = 0.0, slo_s: float = 1.0, received_s: float = 0.0):
    return PipelineRequest(rid, deadline_s=sent_s + slo_s, slo_s=slo_s, received_s=received_s)


def chain_planner() -> StatePlanner:
    """A -> B -> C, seen from A: q = (0.125, 0), d = (0.125, 0.125), W/d = (0.5, 0.25)."""
    planner = StatePlanner(
        "A", PipelineGraph.chain("A", "B", "C"), TableProfile({"A": 62.5, "B": 125, "C": 125})
    )
    planner.merge(ModuleState("B", 1, queue_delay_s=0.125, wait_fractions=(0.5, 0.5), seq=0))
    planner.merge(ModuleState("C", 1, queue_delay_s=0.0, wait_fractions=(0.25, 0.25), seq=0))
    planner.refresh()
    return planner


def test_eq3_by_hand_on_a_chain() -> None:
    planner = chain_planner()
    broker = create_dropper("pard", planner)
    module = planner.context(expected_start_s=0.375)  # t_e; d_A = 0.0625
    now = 0.25  # t_b
    decision = broker.decide(request("r", sent_s=0.0), module, now)
    parts = decision.parts
    assert (parts.pre_s, parts.wait_s, parts.exec_s) == (0.25, 0.125, 0.0625)  # t_b-t_s, W_k, d_k
    assert (parts.sub_queue_s, parts.sub_exec_s, parts.sub_wait_s) == (0.125, 0.25, 0.09375)
    # L = t_e - t_s + d_k + sum q + sum d + w_k = 0.375 + 0.0625 + 0.125 + 0.25 + 0.09375
    assert decision.estimate_s == 0.90625
    assert decision.admit and decision.reason is Reason.WITHIN_SLO
    assert decision.limit_s == 1.0
    late = broker.decide(request("late", sent_s=-0.125), module, now)  # L = 1.03125
    assert late.drop and late.reason is Reason.OVER_SLO and late.estimate_s == 1.03125


def test_eq3_meeting_the_slo_exactly_is_admitted() -> None:
    planner = chain_planner()
    broker = create_dropper("pard", planner)
    module = planner.context(expected_start_s=0.375)
    assert broker.decide(request("r", slo_s=0.90625), module, 0.25).admit
    assert broker.decide(request("r", slo_s=0.90625 - 1e-9), module, 0.25).drop


def test_idle_worker_has_no_batch_wait() -> None:
    planner = chain_planner()
    broker = create_dropper("pard", planner)
    parts = broker.decide(request("r"), planner.context(expected_start_s=0.0), 0.25).parts
    assert parts.wait_s == 0.0  # t_e in the past: the batch starts now


@pytest.mark.parametrize(
    ("name", "estimate_s", "admit"),
    [
        ("pard", 0.90625, True),
        ("back", 0.4375, True),  # L_pre + L_cur only
        ("sf", 0.6875, True),  # + sum d_i
        ("lower", 0.8125, True),  # + sum q_i + sum d_i, w = 0
        ("upper", 1.0625, False),  # + sum q_i + sum d_i, w = sum d_i
    ],
)
def test_ablation_estimates(name: str, estimate_s: float, admit: bool) -> None:
    planner = chain_planner()
    decision = create_dropper(name, planner).decide(
        request("r"), planner.context(expected_start_s=0.375), 0.25
    )
    assert decision.estimate_s == estimate_s
    assert decision.admit is admit


def test_dag_takes_the_maximum_over_downstream_paths() -> None:
    graph = PipelineGraph.from_subs({"A": ["B", "C"], "B": ["D"], "C": ["D"]})
    planner = StatePlanner("A", graph, TableProfile({"A": 62.5, "B": 125, "C": 250, "D": 62.5}))
    planner.merge(ModuleState("B", 1, queue_delay_s=0.25, wait_fractions=(0.0, 0.0), seq=0))
    planner.merge(ModuleState("C", 1, queue_delay_s=0.0625, wait_fractions=(0.5, 0.5), seq=0))
    planner.merge(ModuleState("D", 1, queue_delay_s=0.0625, wait_fractions=(0.0, 0.0), seq=0))
    planner.refresh()
    broker = create_dropper("pard", planner)
    module = planner.context(expected_start_s=0.0)
    # B-D: 0.3125 + 0.1875 + 0 = 0.5;  C-D: 0.125 + 0.3125 + 0.125 = 0.5625 -> C-D
    parts = broker.decide(request("r"), module, 0.0).parts
    assert parts.path == ("C", "D")
    assert parts.sub_s == 0.5625
    assert parts.total_s == 0.0625 + 0.5625
    # B's queue grows: B-D = 0.5625 + 0.1875 = 0.75 becomes the critical path.
    planner.merge(ModuleState("B", 1, queue_delay_s=0.5, wait_fractions=(0.0, 0.0), seq=1))
    parts = broker.decide(request("r"), module, 0.0).parts
    assert parts.path == ("B", "D") and parts.sub_s == 0.75


def test_sink_module_has_no_downstream_part() -> None:
    planner = StatePlanner("C", PipelineGraph.chain("A", "B", "C"), TableProfile({"C": 125}))
    decision = create_dropper("pard", planner).decide(
        request("r", sent_s=-0.5), planner.context(expected_start_s=0.0), 0.0
    )
    assert decision.estimate_s == 0.625 and decision.parts.path == ()


def three_waiting(queue, now: float = 0.0) -> dict[str, PipelineRequest]:
    reqs = {
        "low": request("low", sent_s=-0.5),  # at t_b = 0.25: L = 1.40625, hopeless
        "mid": request("mid", sent_s=-0.0625),  # L = 0.96875
        "high": request("high", sent_s=0.25),  # L = 0.65625
    }
    for r in (reqs["mid"], reqs["low"], reqs["high"]):  # arrival order: mid, low, high
        queue.push(r, now)
    return reqs


@pytest.mark.parametrize(
    ("name", "dropped", "admitted"),
    [
        ("hbf-only", ["low"], ["high"]),  # HBF takes the largest budget; the sweep drops "low"
        ("lbf-only", ["low"], ["mid"]),  # LBF decides "low" first (drop), then takes "mid"
        ("fcfs", [], ["mid"]),  # arrival order
    ],
)
def test_queue_order_ablations_form_different_batches(
    name: str, dropped: list[str], admitted: list[str]
) -> None:
    planner = chain_planner()
    broker = create_dropper(name, planner)
    queue = broker.new_queue()
    three_waiting(queue)
    plan = broker.form_batch(queue, planner.context(expected_start_s=0.375), now=0.25)
    assert [r.request_id for r, _ in plan.dropped] == dropped
    assert [r.request_id for r in plan.requests] == admitted
    assert len(queue) == 3 - len(dropped) - len(admitted)


def test_form_batch_feeds_queue_delay_and_batch_wait_to_the_planner() -> None:
    planner = chain_planner()
    broker = create_dropper("lbf-only", planner)
    queue = broker.new_queue()
    queue.push(request("r", received_s=0.125), 0.125)
    broker.form_batch(queue, planner.context(expected_start_s=0.28125), now=0.25)
    state = planner.snapshot(now=0.25)
    assert state.queue_delay_s == 0.125  # t_b - t_r
    assert state.wait_fractions[0] == 0.5  # W = 0.03125 of d_A = 0.0625


# ---- baselines ------------------------------------------------------------------------------


def nexus_queue(*deadlines: tuple[str, float]) -> FifoQueue:
    queue = FifoQueue()
    for rid, deadline in deadlines:
        queue.push(PipelineRequest(rid, deadline, 1.0, 0.0), 0.0)
    return queue


def test_nexus_drops_ahead_of_the_first_window_that_meets_its_deadlines() -> None:
    nexus = create_dropper("nexus")
    module = StatePlanner("A", PipelineGraph.chain("A"), TableProfile({"A": 125})).context(0.5, 2)
    # The next batch ends at t_e + d(2) = 0.5 + 0.25 = 0.75.
    queue = nexus_queue(("r1", 0.8), ("r2", 0.7), ("r3", 0.9), ("r4", 1.0), ("r5", 0.76))
    plan = nexus.form_batch(queue, module, now=0.5)
    assert [(r.request_id, d.reason) for r, d in plan.dropped] == [
        ("r1", Reason.NEXUS_HEAD),  # could make it, but sits before the first good window
        ("r2", Reason.OVER_SLO),
    ]
    assert [r.request_id for r in plan.requests] == ["r3", "r4"]
    assert [r.request_id for r in queue] == ["r5"]
    # A short tail run is the window when nothing longer fits; all-late queues empty out.
    plan = nexus.form_batch(nexus_queue(("a", 0.7), ("b", 0.76)), module, now=0.5)
    assert [r.request_id for r, _ in plan.dropped] == ["a"] and plan.requests[0].request_id == "b"
    plan = nexus.form_batch(nexus_queue(("a", 0.7), ("b", 0.6)), module, now=0.5)
    assert len(plan.dropped) == 2 and not plan.admitted


def test_clipper_plus_plus_drops_over_its_module_share() -> None:
    planner = chain_planner()  # d = (0.0625, 0.125, 0.125): A's share is 0.0625 / 0.3125 = 1/5
    clipper = create_dropper("clipper++", planner)
    module = planner.context(expected_start_s=0.0)
    ok = clipper.decide(request("r", received_s=0.0), module, now=0.125)
    assert ok.admit and ok.limit_s == pytest.approx(0.2) and ok.estimate_s == 0.125
    late = clipper.decide(request("r", received_s=0.0), module, now=0.25)
    assert late.drop and late.reason is Reason.OVER_SHARE


def test_clipper_share_uses_the_longest_path_of_a_dag() -> None:
    graph = PipelineGraph.from_subs({"A": ["B", "C"], "B": ["D"], "C": ["D"]})
    planner = StatePlanner("A", graph, TableProfile({"A": 62.5, "B": 125, "C": 250, "D": 62.5}))
    clipper = ClipperPlusPlus(planner)
    assert clipper.share_s(request("r", slo_s=0.75), planner.context(0.0)) == 0.125  # 0.75/6


def test_no_dropper_admits_everything_in_arrival_order() -> None:
    none = create_dropper("none")
    queue = none.new_queue()
    for rid in ("a", "b", "c"):
        queue.push(request(rid, sent_s=-5.0), 0.0)
    module = StatePlanner("A", PipelineGraph.chain("A"), TableProfile({"A": 125})).context(0.0, 2)
    plan = none.form_batch(queue, module, now=0.0)
    assert [r.request_id for r in plan.requests] == ["a", "b"] and not plan.dropped


# ---- factory --------------------------------------------------------------------------------


def test_factory_builds_every_named_policy() -> None:
    planner = chain_planner()
    kinds = {name: create_dropper(name, planner) for name in DROPPER_NAMES}
    assert isinstance(kinds["none"], NoDropper)
    assert isinstance(kinds["nexus"], NexusDropper)
    assert isinstance(kinds["clipper++"], ClipperPlusPlus)
    expect = {
        "pard": (Estimator.FULL, QueueOrder.ADAPTIVE),
        "back": (Estimator.BACK, QueueOrder.ADAPTIVE),
        "sf": (Estimator.SF, QueueOrder.ADAPTIVE),
        "lower": (Estimator.LOWER, QueueOrder.ADAPTIVE),
        "upper": (Estimator.UPPER, QueueOrder.ADAPTIVE),
        "fcfs": (Estimator.FULL, QueueOrder.FCFS),
        "hbf-only": (Estimator.FULL, QueueOrder.HBF),
        "lbf-only": (Estimator.FULL, QueueOrder.LBF),
        "instant-switch": (Estimator.FULL, QueueOrder.INSTANT),
    }
    for name, (estimator, order) in expect.items():
        broker = kinds[name]
        assert isinstance(broker, RequestBroker) and broker.name == name
        assert (broker.estimator, broker.order) == (estimator, order)
    assert isinstance(kinds["instant-switch"].new_queue(), BudgetQueue)
    assert isinstance(kinds["fcfs"].new_queue(), FifoQueue)
    assert create_dropper("PARD-back", planner).estimator is Estimator.BACK
    assert create_dropper("pard-hbf", planner).order is QueueOrder.HBF


def test_factory_errors_name_the_setting() -> None:
    with pytest.raises(ValueError, match="dropper name: unknown 'oracle'"):
        create_dropper("oracle")
    with pytest.raises(ValueError, match="dropper planner: 'pard'"):
        create_dropper("pard")
