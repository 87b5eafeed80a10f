"""The PARD experiments' derived figures: worst windows, targets and scaled capacity."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from loadtests.sim.pard_experiments import capacity_per_second, plan_setup
from loadtests.sim.pard_report import TARGETS, target_row, transient
from loadtests.sim.pard_runs import RunDigest
from loadtests.sim.traces import Trace
from onnx_models.spec import PIPELINES_DIR


def _digest(policy: str = "pard", **kw: object) -> RunDigest:
    base: dict[str, object] = {
        "trace": "bursty",
        "policy": policy,
        "seed": 1,
        "arrived": 100,
        "on_time": 90,
        "late": 0,
        "dropped": 10,
        "goodput_rps": 9.0,
        "goodput_overload_rps": 20.0,
        "overload_s": 2,
        "drop_rate": 0.1,
        "invalid_rate": 0.05,
        "trace_cv": 0.3,
        "wall_s": 0.1,
    }
    return RunDigest(**(base | kw))  # type: ignore[arg-type]


def test_transient_worst_windows_by_hand() -> None:
    run = _digest(
        arrived_per_s=[10, 10, 10, 10],
        lost_per_s=[0, 10, 0, 0],
        timeline=[(1.0, 10.0, 10.0), (2.0, 10.0, 0.0), (3.0, 10.0, 10.0), (4.0, 10.0, 10.0)],
    )
    assert transient(run, 1) == (1.0, 0.0, 1.0)
    assert transient(run, 2) == (0.5, 0.5, 0.5)
    worst, least, there = transient(run, 4)
    assert worst == pytest.approx(0.25) and least == pytest.approx(0.75) and there == worst
    assert all(math.isnan(x) for x in transient(run, 5))  # longer than the run


def test_transient_skips_windows_without_arrivals() -> None:
    run = _digest(
        arrived_per_s=[0, 0, 4],
        lost_per_s=[0, 0, 1],
        timeline=[(1.0, 0.0, 0.0), (2.0, 0.0, 0.0), (3.0, 4.0, 3.0)],
    )
    assert transient(run, 1) == (0.25, 0.75, 0.25)


def test_target_row_takes_the_better_baseline_for_each_figure() -> None:
    by = {
        ("bursty", "pard"): _digest(goodput_overload_rps=120.0, drop_rate=0.02, invalid_rate=0.01),
        ("bursty", "nexus"): _digest(
            "nexus", goodput_overload_rps=100.0, drop_rate=0.05, invalid_rate=0.03
        ),
        ("bursty", "clipper++"): _digest(
            "clipper++", goodput_overload_rps=90.0, drop_rate=0.04, invalid_rate=0.02
        ),
    }
    row = target_row(by, "bursty")
    assert row["best_baseline_goodput_rps"] == 100.0 and row["goodput_ratio"] == 1.2
    assert row["best_baseline_drop_rate"] == 0.04 and row["drop_ratio"] == pytest.approx(2.0)
    assert row["invalid_ratio"] == pytest.approx(2.0)
    assert row["goodput_over"] == "overload"
    assert row["meets"] is True and TARGETS["goodput"] == 1.16
    by[("bursty", "pard")] = replace(by[("bursty", "pard")], goodput_overload_rps=110.0)
    assert target_row(by, "bursty")["meets"] is False  # 1.10x < 1.16x
    # no overload periods: the whole run's goodput is compared instead
    by = {k: replace(v, goodput_overload_rps=math.nan) for k, v in by.items()}
    assert target_row(by, "bursty")["goodput_over"] == "whole run"
    # and with nothing dropped or late either, the targets do not apply
    by[("bursty", "pard")] = replace(by[("bursty", "pard")], dropped=0, late=0)
    assert target_row(by, "bursty")["meets"] is None


def _setup(**kw: object):
    return plan_setup(
        PIPELINES_DIR / "traffic.json", PIPELINES_DIR / "traffic.profile.json", None, **kw
    )


def test_plan_setup_with_scaling_starts_at_the_mean_rate_in_a_cluster_twice_its_size() -> None:
    fixed, scaled = _setup(), _setup(scaling=True)
    assert fixed.scaling is None and fixed.duration_s == 300.0
    assert scaled.rate_rps == fixed.rate_rps  # the rate only sets the scale
    cfg = scaled.scaling
    assert cfg is not None
    for m, rps in scaled.worker_rps.items():
        assert scaled.workers[m] == math.ceil(scaled.rate_rps / rps * cfg.headroom)
    assert cfg.total_workers == math.ceil(2 * sum(scaled.workers.values()))
    assert cfg.max_workers == cfg.total_workers


def test_plan_setup_slo_scale_and_rate() -> None:
    base = _setup(scaling=True)
    tight = _setup(scaling=True, slo_scale=0.8, rate_rps=base.rate_rps)
    assert tight.slo_s == pytest.approx(0.32) and tight.spec_slo_s == pytest.approx(0.32)
    assert tight.rate_rps == base.rate_rps
    assert all(tight.max_batch[m] <= base.max_batch[m] for m in base.max_batch)
    with pytest.raises(ValueError, match="slo_scale: must be a finite number > 0"):
        _setup(slo_scale=0.0)
    with pytest.raises(ValueError, match="rate_rps: must be a finite number > 0"):
        _setup(rate_rps=-1.0)
    with pytest.raises(ValueError, match="requests: must be an int >= 1"):
        plan_setup(PIPELINES_DIR / "traffic.json", PIPELINES_DIR / "traffic.profile.json", 0)


def _step_trace(low: float, high: float, seconds: int, at: int) -> Trace:
    curve = np.array([low] * at + [high] * (seconds - at))
    arrivals = np.concatenate(
        [np.linspace(s, s + 1, int(r), endpoint=False) for s, r in enumerate(curve)]
    )
    return Trace("step", arrivals, float(seconds), float(curve.mean()), curve)


def test_capacity_follows_a_step_after_the_cold_start_and_stops_at_the_cluster() -> None:
    setup = _setup(scaling=True)
    cfg = setup.scaling
    assert cfg is not None
    first = min(setup.workers[m] * setup.worker_rps[m] for m in setup.workers)
    trace = _step_trace(setup.rate_rps, 3 * setup.rate_rps, 40, 10)
    cap = capacity_per_second(setup, trace)
    assert len(cap) == 40
    assert cap[:10] == pytest.approx([first] * 10)
    # nothing new serves before the cold start has passed after the step
    assert cap[10 + math.floor(cfg.cold_start_s) - 1] == pytest.approx(first)
    assert cap[-1] > 2 * setup.rate_rps  # it caught up with most of the step
    cluster = cfg.total_workers
    assert cluster is not None
    assert max(cap) <= cluster * max(setup.worker_rps.values())
    fixed = capacity_per_second(replace(setup, scaling=None), trace)
    assert (fixed == setup.capacity_rps).all()


def test_capacity_of_an_unscaled_setup_is_the_planned_one(tmp_path: Path) -> None:
    setup = _setup()
    trace = _step_trace(10.0, 10.0, 5, 0)
    assert capacity_per_second(setup, trace).tolist() == [setup.capacity_rps] * 5
