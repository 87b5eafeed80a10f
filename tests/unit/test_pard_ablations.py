"""PARD-oc, PARD-split and PARD-WCL (Table 1) against PARD and Clipper++, on hand-built states."""

from __future__ import annotations

import numpy as np
import pytest

from loadtests.sim.pipeline import ON_TIME, PipelineModel, SimConfig, simulate_pipeline
from taskserver.pard import (
    DROPPER_NAMES,
    BudgetQueue,
    FixedSplitBroker,
    ModuleState,
    OverloadControlBroker,
    PipelineGraph,
    QueueOrder,
    Reason,
    RequestBroker,
    StatePlanner,
    WorstCaseSplitBroker,
    create_dropper,
    cumulative_share,
)
from tests.unit.test_pard_broker import TableProfile, chain_planner, request
from tests.unit.test_pard_sim import LinearProfile

# chain_planner(): A -> B -> C seen from A, d = (0.0625, 0.125, 0.125), q_B = 0.125, q_C = 0,
# w_A = 0.09375; PARD's L = t_e - t_s + 0.0625 + 0.125 + 0.25 + 0.09375.

TABLE_1 = {
    "PARD-back": "back",
    "PARD-sf": "sf",
    "PARD-oc": "oc",
    "PARD-split": "split",
    "PARD-WCL": "wcl",
    "PARD-lower": "lower",
    "PARD-upper": "upper",
    "PARD-FCFS": "fcfs",
    "PARD-HBF": "hbf-only",
    "PARD-LBF": "lbf-only",
}


def test_every_table_1_ablation_is_a_named_policy() -> None:
    planner = chain_planner()
    for paper_name, name in TABLE_1.items():
        assert name in DROPPER_NAMES
        dropper = create_dropper(paper_name, planner)
        assert isinstance(dropper, RequestBroker) and dropper.name == name
    for name, kind in (
        ("oc", OverloadControlBroker),
        ("split", FixedSplitBroker),
        ("wcl", WorstCaseSplitBroker),
    ):
        dropper = create_dropper(name, planner)
        assert type(dropper) is kind
        # Only the drop test is replaced: PARD's adaptive DEPQ stays.
        assert dropper.order is QueueOrder.ADAPTIVE
        assert isinstance(dropper.new_queue(), BudgetQueue)


# ---- PARD-split ---------------------------------------------------------------------------


def test_split_drops_what_pard_keeps_when_the_downstream_is_idle() -> None:
    planner = chain_planner()
    pard, split = create_dropper("pard", planner), create_dropper("split", planner)
    module = planner.context(expected_start_s=0.375)
    r = request("r", sent_s=0.0)
    assert pard.decide(r, module, 0.25).admit  # L = 0.90625 <= 1: the pipeline can make it
    d = split.decide(r, module, 0.25)
    # A's fixed split: SLO * d_A / sum d = 0.0625 / 0.3125 = 0.2; t_e - t_s + d_A = 0.4375.
    assert d.drop and d.reason is Reason.OVER_SPLIT
    assert (d.estimate_s, d.limit_s) == (0.4375, pytest.approx(0.2))


def test_split_keeps_what_pard_drops_when_a_downstream_queue_grows() -> None:
    planner = chain_planner()
    planner.merge(ModuleState("B", 1, queue_delay_s=0.75, wait_fractions=(0.5, 0.5), seq=1))
    pard, split = create_dropper("pard", planner), create_dropper("split", planner)
    module = planner.context(expected_start_s=0.0)  # idle worker
    r = request("r", sent_s=0.0)
    late = pard.decide(r, module, 0.0)  # L = 0.0625 + 0.75 + 0.25 + 0.09375
    assert late.drop and late.estimate_s == 1.15625
    ok = split.decide(r, module, 0.0)
    assert ok.admit and ok.reason is Reason.WITHIN_SPLIT and ok.estimate_s == 0.0625
    assert split.share() == pytest.approx(0.2)  # fixed: the queue does not move it


def test_split_is_not_clippers_rule() -> None:
    planner = chain_planner()  # A's share is 0.2 under both
    split, clipper = create_dropper("split", planner), create_dropper("clipper++", planner)
    module = planner.context(expected_start_s=0.0)
    # Late from upstream, quick at A: Clipper++ looks at t_b - t_r = 0.0625 only.
    r = request("r", sent_s=-0.5, received_s=0.0)
    assert clipper.decide(r, module, 0.0625).admit
    d = split.decide(r, module, 0.0625)
    assert d.drop and d.estimate_s == 0.625  # t_e - t_s + d_A
    # At the sink the cumulative split is the whole SLO; Clipper++ still holds C to its 0.4.
    sink = StatePlanner(
        "C", PipelineGraph.chain("A", "B", "C"), TableProfile({"A": 62.5, "B": 125, "C": 125})
    )
    split_c, clipper_c = create_dropper("split", sink), create_dropper("clipper++", sink)
    r = request("r", sent_s=0.0, received_s=0.0)
    context = sink.context(expected_start_s=0.0)
    assert clipper_c.decide(r, context, 0.5).drop  # 0.5 s at C > 0.4
    assert split_c.decide(r, context, 0.5).admit  # through C at 0.625 <= 1.0


def test_split_takes_the_tightest_path_of_a_dag() -> None:
    graph = PipelineGraph.from_subs({"A": ["B", "C"], "B": ["D"], "C": ["D"]})
    profile = TableProfile({"A": 62.5, "B": 125, "C": 250, "D": 62.5})
    # A-B-D: 0.0625 / 0.25;  A-C-D: 0.0625 / 0.375 -> the smaller, 1/6.
    assert FixedSplitBroker(StatePlanner("A", graph, profile)).share() == pytest.approx(1 / 6)
    assert FixedSplitBroker(StatePlanner("B", graph, profile)).share() == pytest.approx(0.75)
    assert FixedSplitBroker(StatePlanner("D", graph, profile)).share() == 1.0
    cost = {"A": 1.0, "B": 1.0, "C": 0.0}.__getitem__
    assert cumulative_share([("A", "B", "C")], "B", cost) == 1.0  # C costs nothing


# ---- PARD-WCL -----------------------------------------------------------------------------


def test_wcl_reallocates_the_split_as_a_downstream_queue_grows() -> None:
    planner = chain_planner()
    wcl, split = create_dropper("wcl", planner), create_dropper("split", planner)
    # WCL_i = q_i + 2 d_i: A 0.125, B 0.125 + 0.25, C 0.25 -> A's share 0.125 / 0.75.
    assert wcl.share() == pytest.approx(1 / 6)
    module = planner.context(expected_start_s=0.0)
    r = request("r", sent_s=-0.0625)  # through A at 0.125
    assert wcl.decide(r, module, 0.0).admit and split.decide(r, module, 0.0).admit
    planner.merge(ModuleState("B", 1, queue_delay_s=0.75, wait_fractions=(0.5, 0.5), seq=1))
    # B's WCL is now 1.0: A's share 0.125 / 1.375; the fixed split stays at 0.2.
    assert wcl.share() == pytest.approx(0.125 / 1.375)
    d = wcl.decide(r, module, 0.0)
    assert d.drop and d.reason is Reason.OVER_SPLIT and d.limit_s == pytest.approx(1 / 11)
    assert split.decide(r, module, 0.0).admit


def test_wcl_drops_what_pard_keeps_and_keeps_what_pard_drops() -> None:
    planner = chain_planner()
    pard, wcl = create_dropper("pard", planner), create_dropper("wcl", planner)
    busy = planner.context(expected_start_s=0.375)
    r = request("r", sent_s=0.0)
    assert pard.decide(r, busy, 0.25).admit  # L = 0.90625
    assert wcl.decide(r, busy, 0.25).drop  # 0.4375 > 1/6 of the SLO
    planner.merge(ModuleState("B", 1, queue_delay_s=0.75, wait_fractions=(0.5, 0.5), seq=1))
    idle = planner.context(expected_start_s=0.0)
    assert pard.decide(r, idle, 0.0).drop  # L = 1.15625
    assert wcl.decide(r, idle, 0.0).admit  # 0.0625 <= 1/11


# ---- PARD-oc ------------------------------------------------------------------------------


def test_oc_drops_on_queueing_delay_alone() -> None:
    planner = chain_planner()
    pard, oc = create_dropper("pard", planner), create_dropper("oc", planner)
    module = planner.context(expected_start_s=0.0)
    # tau_A = (1 - 2 * 0.3125) * 0.0625 / 0.3125 = 0.075
    queued = request("queued", sent_s=0.0, received_s=0.0)  # Q_A = 0.125 at t_b = 0.125
    assert pard.decide(queued, module, 0.125).admit  # L = 0.65625: plenty of budget left
    d = oc.decide(queued, module, 0.125)
    assert d.drop and d.reason is Reason.OVER_QUEUE_TARGET
    assert (d.estimate_s, d.limit_s) == (0.125, pytest.approx(0.075))
    # Late from upstream but quick here: eq. (3) drops it, the overload controller cannot see.
    late = request("late", sent_s=-0.5, received_s=0.0)
    assert pard.decide(late, module, 0.0625).drop  # L = 1.09375
    ok = oc.decide(late, module, 0.0625)
    assert ok.admit and ok.reason is Reason.WITHIN_QUEUE_TARGET


def test_oc_target_is_zero_when_the_slo_leaves_no_queueing() -> None:
    planner = chain_planner()
    oc = create_dropper("oc", planner)
    assert isinstance(oc, OverloadControlBroker)
    assert oc.target_s(request("r", slo_s=0.5)) == 0.0  # 0.5 < 2 * 0.3125
    module = planner.context(expected_start_s=0.0)
    assert oc.decide(request("r", slo_s=0.5), module, 0.0).admit  # no queueing at all
    assert oc.decide(request("r", slo_s=0.5), module, 1e-6).drop


@pytest.mark.parametrize("name", ["oc", "split", "wcl"])
def test_replaced_tests_form_batches_in_depq_order_and_feed_the_planner(name: str) -> None:
    planner = chain_planner()
    broker = create_dropper(name, planner, priority=None)
    queue = broker.new_queue()
    for rid, sent in (("a", -0.03125), ("b", 0.0), ("c", -0.015625)):
        queue.push(request(rid, sent_s=sent, received_s=0.0), 0.0)
    plan = broker.form_batch(queue, planner.context(expected_start_s=0.0, batch_size=2), 0.0)
    assert not plan.dropped
    # A fresh module starts in LBF (mu not known yet): the smallest budgets first.
    assert [r.request_id for r in plan.requests] == ["a", "c"]
    assert planner.snapshot(now=0.0).queue_delay_s == 0.0  # Q_k recorded for both


@pytest.mark.parametrize("name", ["oc", "split", "wcl"])
def test_replaced_tests_run_in_the_simulator_and_drop_under_overload(name: str) -> None:
    subs = {"A": ["B", "C"], "B": ["D"], "C": ["D"]}
    model = PipelineModel(
        "p", subs, 0.2, LinearProfile(2.0, 2.5), dict.fromkeys("ABCD", (1, 2, 4, 8, 16))
    )
    arrivals = np.sort(np.random.default_rng(3).uniform(0.0, 3.0, size=1500))  # 1.3x capacity
    out = simulate_pipeline(model, arrivals, name, SimConfig(seed=1))
    s = out.summary
    assert out.dropper == name
    assert s.arrived == 1500 and s.in_flight == 0
    assert s.on_time + s.late + s.dropped == 1500
    assert s.dropped > 0 and s.on_time > 0
    assert sum(out.drops_by_module().values()) == s.dropped
    assert np.nanmax(out.latency_s[out.outcome == ON_TIME]) <= 0.2
