"""The pipeline simulator with run-time worker scaling: a step in rate, cold starts, scale-in."""

from __future__ import annotations

import numpy as np
import pytest

from loadtests.sim.pipeline import ON_TIME, PipelineModel, PipelineRun, SimConfig, simulate_pipeline
from taskserver.pard import ScalingConfig


class ConstProfile:
    """Every module takes 40 ms a batch, whatever its size: b = 4 gives 100 req/s a worker."""

    def duration_ms(self, module_id: str, batch: int) -> float:
        return 40.0


SCALING = ScalingConfig(
    max_workers=4, cold_start_s=2.0, hold_s=10.0, headroom=1.2, rate_window_s=2.0, period_s=0.5
)


def step_arrivals() -> np.ndarray:
    """60 req/s for 10 s, 240 req/s for 30 s, 60 req/s for 20 s, evenly spaced."""
    parts = [(0.0, 10.0, 60.0), (10.0, 40.0, 240.0), (40.0, 60.0, 60.0)]
    return np.concatenate([np.arange(a, b, 1.0 / r) for a, b, r in parts])


def simulate(scaling: ScalingConfig | None) -> PipelineRun:
    model = PipelineModel("p", {"A": ["B"]}, 0.4, ConstProfile(), {"A": (1, 2, 4), "B": (1, 2, 4)})
    cfg = SimConfig(max_batch={"A": 4, "B": 4}, duration_cv=0.0, scaling=scaling)
    return simulate_pipeline(model, step_arrivals(), "pard", cfg)


def lost_share(run: PipelineRun, start_s: float, end_s: float) -> float:
    """The share of requests sent in [start_s, end_s) that did not end on time."""
    sent = (run.arrivals_s >= start_s) & (run.arrivals_s < end_s)
    return float((run.outcome[sent] != ON_TIME).mean())


def test_a_step_in_rate_grows_the_workers_after_the_cold_start_and_drops_fall():
    run = simulate(SCALING)
    starts = [(d.now, d.of("A").start) for d in run.scaling if d.of("A").start]
    # mu = 4 / 0.04 s = 100 req/s. (8.5, 10.5]: 1.5 s at 60 + 0.5 s at 240 -> 105 req/s ->
    # ceil(1.26) = 2 workers; (9.5, 11.5]: 195 req/s -> ceil(2.34) = 3; 240 -> ceil(2.88) = 3
    # until the step down.
    assert starts[:2] == [(pytest.approx(10.5), 1), (pytest.approx(11.5), 1)]
    assert all(t > 40.0 for t, _ in starts[2:])
    new = [b for b in run.batches if b.module_id == "A" and b.worker >= 1]
    assert new, "the started workers never ran a batch"
    first_new = min(b.start_s for b in new)
    assert first_new >= 10.5 + SCALING.cold_start_s  # no batch before the cold start ends
    assert first_new == pytest.approx(12.5, abs=0.05)  # and it serves as soon as it may
    # one worker (100 req/s) against 240 req/s until the others serve: PARD drops
    assert lost_share(run, 10.0, 13.5) > 0.3
    # three workers (300 req/s): almost nothing lost once they serve
    assert lost_share(run, 16.0, 40.0) < 0.01
    assert lost_share(run, 40.0, 60.0) == 0.0


def test_the_workers_fall_back_after_the_hold_once_the_rate_falls():
    run = simulate(SCALING)
    ready = {round(d.now, 1): d.of("A").ready for d in run.scaling}
    assert ready[39.0] == 3
    assert ready[49.5] == 3  # the rate fell at 40 s: the 10 s hold keeps them
    assert ready[55.0] == 1
    stops = [d.now for d in run.scaling if d.of("A").stop]
    assert stops and 50.0 <= stops[0] <= 53.0


def test_fixed_workers_keep_dropping_through_the_step():
    run = simulate(None)
    assert not run.scaling
    assert {b.worker for b in run.batches} == {0}
    assert lost_share(run, 16.0, 40.0) > 0.5  # 100 req/s of 240 at best
