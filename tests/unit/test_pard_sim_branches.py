"""The PARD pipeline simulator with request-specific paths (``branches``): shares, merges
that wait only for the branches taken, drops, and the shipped dag_dynamic pipeline."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from loadtests.sim.pipeline import (
    DROPPED,
    ON_TIME,
    PipelineModel,
    PipelineRun,
    SimConfig,
    simulate_pipeline,
)
from onnx_models.spec import PIPELINES_DIR
from tests.unit.test_pard_sim import ConstProfile
from tests.unit.test_pipeline_branches import binomial_bound

SUBS = {"A": ["B", "C"], "B": ["D"], "C": ["D"]}


def branchy(
    branches: Mapping[str, Mapping[str, float]],
    *,
    c_ms: float = 150.0,
    slo_s: float = 0.4,
    subs: Mapping[str, list[str]] = SUBS,
) -> PipelineModel:
    """A -> {B, C} -> D (A 10 ms, B 50 ms, C `c_ms`, D 10 ms, whatever the batch size)."""
    ms = {"A": 10.0, "B": 50.0, "C": c_ms, "D": 10.0}
    modules = {*subs, *(s for v in subs.values() for s in v)}
    sizes = dict.fromkeys(modules, (1, 2, 4))
    return PipelineModel("p", subs, slo_s, ConstProfile(ms), sizes, branches=branches)


def run(model: PipelineModel, arrivals: np.ndarray, dropper: str, **kw: object) -> PipelineRun:
    cfg = SimConfig(max_batch=dict.fromkeys(model.modules, 4), duration_cv=0.0, **kw)  # type: ignore[arg-type]
    return simulate_pipeline(model, arrivals, dropper, cfg)


def items(out: PipelineRun, module_id: str) -> int:
    """Requests that ran on a module."""
    return sum(b.size for b in out.batches if b.module_id == module_id)


@pytest.mark.parametrize(
    ("branches", "shares"),
    [({"A": {"C": 0.6}}, {"B": 1.0, "C": 0.6}), ({"A": {"B": 0.25}}, {"B": 0.25, "C": 1.0})],
)
def test_the_fraction_of_requests_on_each_branch_is_its_share(
    branches: Mapping[str, Mapping[str, float]], shares: Mapping[str, float]
) -> None:
    n = 2000
    arrivals = np.arange(n) * 0.2  # one at a time: no queue, every request on time
    out = run(branchy(branches), arrivals, "none")
    assert (out.outcome == ON_TIME).all() and out.summary.in_flight == 0
    assert items(out, "A") == items(out, "D") == n  # every request reaches the merge once
    for module_id, share in shares.items():
        fraction = items(out, module_id) / n
        assert abs(fraction - share) <= binomial_bound(n, share), (module_id, fraction)
    # A request's latency is A + its slowest branch + D: 0.17 s with C, else 0.07 s (B alone).
    slow = np.isclose(out.latency_s, 0.17)
    assert (slow | np.isclose(out.latency_s, 0.07)).all()
    assert slow.sum() == items(out, "C")


def test_a_merge_does_not_wait_for_a_branch_the_request_skipped() -> None:
    # C takes 1 s a batch and requests come every 0.1 s, so those that take C wait seconds;
    # a request that skips C leaves D at most one D batch (10 ms) after its B branch is done.
    n = 200
    out = run(branchy({"A": {"C": 0.5}}, c_ms=1000.0, slo_s=100.0), np.arange(n) * 0.1, "none")
    assert (out.outcome == ON_TIME).all()
    latency = out.latency_s
    fast = latency < 0.1
    assert 0 < fast.sum() < n and fast.sum() == n - items(out, "C")
    assert ((latency[fast] > 0.07 - 1e-9) & (latency[fast] < 0.08 + 1e-9)).all()
    assert latency[~fast].min() > 1.0 and latency[~fast].max() > 5.0


def test_a_drop_in_a_taken_branch_drops_the_request_and_skippers_complete() -> None:
    # SLO 0.1 s: PARD-back (preceding and current modules only) lets every request past A
    # (10 ms) and drops it at C (10 + 150 ms); those that skip C meet the SLO at 70 ms.
    n = 400
    out = run(branchy({"A": {"C": 0.6}}, slo_s=0.1), np.arange(n) * 0.2, "back")
    dropped = out.outcome == DROPPED
    assert set(out.dropped_at) == {None, "C"}
    assert dropped.sum() == items(out, "A") - items(out, "D")  # no request that took C ends
    assert (out.outcome[~dropped] == ON_TIME).all()
    assert out.latency_s[~dropped] == pytest.approx(np.full((~dropped).sum(), 0.07))
    assert abs(dropped.mean() - 0.6) <= binomial_bound(n, 0.6)
    assert out.summary.invalid_rate > 0  # their B branch ran for nothing


def test_a_sink_that_a_request_skips_is_not_waited_for() -> None:
    # A -> {B, C}, both sinks: a request that skips C completes when B is done.
    out = run(branchy({"A": {"C": 0.5}}, subs={"A": ["B", "C"]}), np.arange(300) * 0.2, "pard")
    assert (out.outcome == ON_TIME).all() and out.summary.in_flight == 0
    latency = out.latency_s
    assert sorted(set(np.round(latency, 6))) == [0.06, 0.16]
    assert np.isclose(latency, 0.16).sum() == items(out, "C")


def test_every_policy_sees_the_same_routes() -> None:
    model = branchy({"A": {"C": 0.6}})
    arrivals = np.arange(300) * 0.2
    reached = {d: items(run(model, arrivals, d), "C") for d in ("none", "pard", "nexus")}
    assert len(set(reached.values())) == 1, reached
    other_seed = items(run(model, arrivals, "none", seed=7), "C")
    assert other_seed != reached["none"]  # the draw is seeded per run


def test_bad_branches_are_refused() -> None:
    with pytest.raises(ValueError, match=r"module A branches\['C'\]: must be a share in \(0, 1\)"):
        branchy({"A": {"C": 1.2}})
    with pytest.raises(ValueError, match=r"module A branches: names every sub"):
        branchy({"A": {"B": 0.5, "C": 0.5}})
    with pytest.raises(ValueError, match=r"module B branches: only a module with several subs"):
        branchy({"B": {"D": 0.5}})


def test_the_shipped_dynamic_dag_plans_and_runs() -> None:
    from loadtests.sim.pard_experiments import plan_setup

    setup = plan_setup(
        PIPELINES_DIR / "dag_dynamic.json", PIPELINES_DIR / "dag_dynamic.profile.json", 1000
    )
    assert setup.pipeline == "dag_dynamic" and setup.slo_s == pytest.approx(0.42)
    arrivals = np.sort(np.random.default_rng(5).uniform(0, 2.0, size=600))
    out = simulate_pipeline(setup.model, arrivals, "none", setup.config())
    assert (out.outcome > 0).all() and items(out, "2") == items(out, "4") == 600
    assert abs(items(out, "3") / 600 - 0.6) <= binomial_bound(600, 0.6)
    pard = simulate_pipeline(setup.model, arrivals, "pard", setup.config())
    assert (pard.outcome > 0).all() and pard.summary.arrived == 600


def test_the_dynamic_dag_profile_is_dags_measurement() -> None:
    from onnx_models.profile import load_profile

    dag = load_profile(PIPELINES_DIR / "dag.profile.json")
    dynamic = load_profile(PIPELINES_DIR / "dag_dynamic.profile.json")
    assert (dag.pipeline, dynamic.pipeline) == ("dag", "dag_dynamic")
    assert dynamic.modules == dag.modules and dynamic.environment == dag.environment
    note = Path(PIPELINES_DIR / "dag_dynamic.profile.json").read_text(encoding="utf-8")
    assert "dag.profile.json's" in note  # says where its numbers come from
