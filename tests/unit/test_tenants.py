"""The gateway's allocation state (gateway.tenants): flows, their bound, per-flow gates."""

from __future__ import annotations

from admission import AdmissionConfig, AdmissionGate, AllocationConfig
from gateway.config import ClassConfig
from gateway.tenants import OTHER_FLOW, Tenants


def tenants(**allocation: object) -> tuple[Tenants, AdmissionGate]:
    classes = [ClassConfig("A", 10.0)]
    clock = [0.0]
    admission = AdmissionConfig(window_tasks=10)
    pool = AdmissionGate(admission, classes, lambda: clock[0])

    def new_gate() -> AdmissionGate:
        return AdmissionGate(admission, classes, lambda: clock[0])

    return Tenants(AllocationConfig(**allocation), pool, new_gate), pool  # type: ignore[arg-type]


def test_flows_are_tenants_or_classes_and_bounded() -> None:
    t, _ = tenants(policy="drr", max_flows=2)
    assert t.flow_of("a", "A") == "a" and t.flow_of("b", "A") == "b"
    assert t.flow_of("c", "A") == OTHER_FLOW  # beyond max_flows: one shared flow
    assert t.flow_of("a", "A") == "a"  # the known ones stay apart
    by_class, _ = tenants(policy="drr", flows="class")
    assert by_class.flow_of("a", "A") == "A"


def test_windows_give_each_flow_its_own_gate_fed_only_its_own_misses() -> None:
    t, pool = tenants(policy="drr", share="windows")
    flood, calm = t.gate_of("flood"), t.gate_of("calm")
    assert flood is not calm and pool not in (flood, calm)
    for _ in range(10):
        t.note_task("flood", True, "A")
        t.note_task("calm", False, "A")
    assert flood.pressure().miss_ratio == 1.0
    assert calm.pressure().miss_ratio == 0.0
    assert not flood.clearly_admitted() and calm.clearly_admitted()


def test_without_windows_every_flow_meets_the_pool_gate() -> None:
    for alloc in ({"policy": "none"}, {"policy": "drr", "share": "transfer"}):
        t, pool = tenants(**alloc)
        assert t.gate_of("x") is pool and t.gate_of("y") is pool
        t.note_task("x", True, "A")  # the pool's gate is fed by the query path itself
        assert not t.gates


def test_the_transfer_share_counts_what_it_moves() -> None:
    t, _ = tenants(policy="drr", share="transfer")
    assert t.decide("flood", 32.0, True, 0.0)
    assert t.decide("calm", 4.0, False, 0.1)  # moved onto flood's account
    assert not t.decide("flood", 32.0, True, 0.2)  # flood repays
    t.refused("flood", "tenant_share")
    view = t.view([], 0.3)
    rows = {f["flow"]: f for f in view["flows"]}
    assert view["share"] == "transfer" and view["policy"] == "drr"
    assert rows["calm"]["admitted"] == 1 and rows["flood"]["admitted"] == 1
    assert rows["flood"]["rejected"] == {"tenant_share": 1}
    assert rows["calm"]["share"]["admitted_for_share"] == 1
