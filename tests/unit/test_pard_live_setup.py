"""The live/sim comparison's setup: one rate rule, the same b_k and workers on both sides,
and its verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtests.pard_live import live_config, plan_live, sim_config
from loadtests.pard_live_report import Overhead, PolicyResult, SideDigest, Validity
from taskserver.pard import ScalingConfig


def test_the_rate_is_a_share_of_what_the_scaled_out_pipeline_serves() -> None:
    scaling = ScalingConfig(max_workers=4, total_workers=16)
    setup = plan_live("traffic", workers=scaling, load=0.5)
    mu = setup.worker_rps
    # each next worker to the module of least capacity, until the bottleneck is at its max
    assert setup.reach == {"1": 4, "2": 2, "3": 3}
    assert setup.capacity_rps == pytest.approx(4 * mu["1"])
    assert setup.rate_rps == pytest.approx(0.5 * setup.capacity_rps)
    capped = plan_live("traffic", workers=ScalingConfig(max_workers=4, total_workers=4))
    assert capped.reach == {"1": 2, "2": 1, "3": 1}
    assert capped.capacity_rps == pytest.approx(min(2 * mu["1"], mu["2"], mu["3"]))
    fixed = plan_live("traffic", workers=2, rate_rps=33.0)
    assert fixed.reach == {"1": 2, "2": 2, "3": 2} and fixed.rate_rps == 33.0
    assert fixed.load is None


def test_live_modules_batch_up_to_the_simulators_b_k_with_the_profiles_threads() -> None:
    scaling = ScalingConfig(max_workers=3, total_workers=6, cold_start_s=0.5)
    setup = plan_live("live", workers=scaling)
    config = live_config(setup, "pard@profile")
    model = setup.model
    for m in config.modules:
        b_k = setup.max_batch[m.id]
        simulated = (*(b for b in model.batch_sizes[m.id] if b < b_k), b_k)  # the sim's sizes
        assert m.batch_sizes == simulated
    assert config.slo_ms == pytest.approx(setup.slo_s * 1000.0)
    assert config.intra_op_threads == setup.profile.environment.intra_op_threads
    assert config.workers == scaling and config.dropper == "pard"
    assert config.pard.adapt_durations is False  # @profile: the paper's d_k, as the simulator
    assert live_config(setup, "pard").pard.adapt_durations is True
    sim = sim_config(setup)
    assert sim.max_batch == setup.max_batch and sim.scaling == scaling
    assert sim.workers == scaling.min_workers


def _side(side: str, on_time: int, dropped: int, requests: int = 1000) -> SideDigest:
    return SideDigest(
        side=side,
        policy="pard",
        requests=requests,
        on_time=on_time,
        late=0,
        dropped=dropped,
        failed=0,
        invalid_rate=0.0,
        seconds=10.0,
        per_second=[],
        workers=[(0.0, {"1": 1}), (5.0, {"1": 3})],
        drops_by_module={},
        mean_batch={},
    )


def _result(live: SideDigest, sim: SideDigest, lateness_s: float = 0.001) -> PolicyResult:
    validity = Validity(lateness_s, lateness_s, 0.004, 10.0, 5.0, 1.0, 16)
    overhead = Overhead(100, 0.001, 0.002, 0.01, 10.0, 1000, 0.0)
    return PolicyResult("pard", live, sim, validity, overhead, {})


def test_verdicts_judge_goodput_and_drop_rate_gaps_unless_the_driver_was_late() -> None:
    sim = _side("sim", on_time=900, dropped=100)
    assert _result(_side("live", 850, 150), sim).verdict(0.10) == "FAIL"  # drop rate +50%
    assert _result(_side("live", 895, 105), sim).verdict(0.10) == "PASS"
    assert _result(_side("live", 790, 210), sim).verdict(0.10) == "FAIL"  # goodput -12%
    assert _result(_side("live", 895, 105), sim, lateness_s=0.005).verdict(0.10) == "INVALID"
    # a drop rate near zero: within half a point passes whatever its relative gap
    near = _result(_side("live", 996, 4), _side("sim", 999, 1))
    assert near.gaps()[1] == pytest.approx(3.0) and near.verdict(0.10) == "PASS"
    assert math.isinf(_result(_side("live", 990, 10), _side("sim", 1000, 0)).gaps()[1])


def test_workers_over_time_are_a_step_function_over_the_trace() -> None:
    side = _side("live", 900, 100)
    assert side.workers_peak("1") == 3
    assert side.workers_mean("1") == pytest.approx((1 * 5 + 3 * 5) / 10)


def test_lateness_p99_by_second_groups_requests_by_their_arrival_second() -> None:
    from loadtests.pard_live import _p99_by_second

    arrivals = np.array([0.1, 0.2, 0.9, 2.5, 2.6])
    late = np.array([0.001, 0.002, 0.010, 0.004, 0.0])
    got = _p99_by_second(arrivals, late, 4.0)
    assert len(got) == 4
    assert got[0] == pytest.approx(np.percentile([0.001, 0.002, 0.010], 99))
    assert got[1] == 0.0 and got[3] == 0.0  # no arrivals in those seconds
    assert got[2] == pytest.approx(np.percentile([0.004, 0.0], 99))
