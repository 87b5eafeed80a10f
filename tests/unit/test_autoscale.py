"""Threshold autoscaling on the miss ratio (TailGuard §III.E) and vertical scaling steps."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest

from admission import (
    PolicyValueError,
    ScaleDecision,
    SwayamPolicy,
    ThresholdAutoscaler,
    vertical_step,
)
from gateway.autoscaling import AutoscalerLoop
from gateway.config import AutoscalingConfig, GatewayConfig, PoolConfig


def create_autoscaler(**kwargs: object) -> ThresholdAutoscaler:
    defaults: dict[str, object] = {
        "upper": 0.015,
        "lower": 0.005,
        "min_replicas": 1,
        "max_replicas": 4,
        "up_cooldown_s": 10.0,
        "down_cooldown_s": 30.0,
    }
    defaults.update(kwargs)
    return ThresholdAutoscaler(**defaults)  # type: ignore[arg-type]


def test_up_above_upper_down_below_lower_and_still_between() -> None:
    a = create_autoscaler()
    assert a.decide(0.02, 2, 0.0) == ScaleDecision(1, "above_upper", 3)
    b = create_autoscaler()
    assert b.decide(0.001, 2, 0.0) == ScaleDecision(-1, "below_lower", 1)
    c = create_autoscaler()
    assert c.decide(0.015, 2, 0.0) == ScaleDecision(0, "within_thresholds", 2)  # not above
    assert c.decide(0.005, 2, 1.0) == ScaleDecision(0, "within_thresholds", 2)  # not below


def test_cooldowns_hold_repeated_steps() -> None:
    a = create_autoscaler(max_replicas=10)
    assert a.decide(0.05, 1, 0.0).delta == 1
    assert a.decide(0.05, 2, 9.9) == ScaleDecision(0, "cooldown", 2)
    assert a.decide(0.05, 2, 10.0) == ScaleDecision(1, "above_upper", 3)
    # Down waits down_cooldown_s after any change, so the last step up is not undone at once.
    assert a.decide(0.0, 3, 39.9) == ScaleDecision(0, "cooldown", 3)
    assert a.decide(0.0, 3, 40.0) == ScaleDecision(-1, "below_lower", 2)
    # Up does not wait for a step down.
    assert a.decide(0.05, 2, 40.5) == ScaleDecision(1, "above_upper", 3)
    assert (a.last_up_s, a.last_change_s) == (40.5, 40.5)


def test_replicas_are_clamped_to_min_and_max() -> None:
    a = create_autoscaler(step=3)
    assert a.decide(0.05, 3, 0.0) == ScaleDecision(1, "above_upper", 4)  # step capped at max
    assert a.decide(0.05, 4, 100.0) == ScaleDecision(0, "at_max", 4)
    b = create_autoscaler(step=3, min_replicas=2)
    assert b.decide(0.0, 3, 0.0) == ScaleDecision(-1, "below_lower", 2)
    assert b.decide(0.0, 2, 100.0) == ScaleDecision(0, "at_min", 2)
    # Out of bounds (a replica crashed): back in at once, whatever the ratio or cooldown.
    assert b.decide(0.01, 0, 100.5) == ScaleDecision(2, "below_min", 2)
    assert b.decide(0.01, 6, 100.6) == ScaleDecision(-2, "above_max", 4)


def test_snapshot_lists_thresholds_and_a_bounded_history() -> None:
    a = create_autoscaler(history=2)
    a.decide(0.02, 1, 0.0)
    a.decide(0.01, 2, 5.0)
    a.decide(0.02, 2, 6.0)
    snap = a.snapshot(6.0)
    assert (snap["upper"], snap["lower"]) == (0.015, 0.005)
    assert (snap["min_replicas"], snap["max_replicas"]) == (1, 4)
    assert snap["decisions"] == [
        {
            "time": 5.0,
            "ratio": 0.01,
            "delta": 0,
            "reason": "within_thresholds",
            "replicas": 2,
            "last_time": 5.0,
            "repeats": 1,
        },
        {
            "time": 6.0,
            "ratio": 0.02,
            "delta": 0,
            "reason": "cooldown",
            "replicas": 2,
            "last_time": 6.0,
            "repeats": 1,
        },
    ]


def test_history_counts_a_run_of_equal_holds_in_one_entry() -> None:
    # One decision per second for a minute: the log keeps the changes, not 60 entries.
    a = create_autoscaler(up_cooldown_s=10.0)
    assert a.decide(0.02, 1, 0.0).delta == 1  # above_upper: a step of its own
    for t in range(1, 10):
        assert a.decide(0.02, 2, float(t)).reason == "cooldown"
    for t in range(10, 40):
        assert a.decide(0.01, 2, float(t)).reason == "within_thresholds"
    assert a.decide(0.02, 2, 40.0).delta == 1
    assert a.decide(0.02, 3, 41.0).reason == "cooldown"
    got = [
        (d["reason"], d["delta"], d["time"], d["last_time"], d["repeats"])
        for d in a.snapshot(41.0)["decisions"]
    ]
    assert got == [
        ("above_upper", 1, 0.0, 0.0, 1),
        ("cooldown", 0, 1.0, 9.0, 9),
        ("within_thresholds", 0, 10.0, 39.0, 30),
        ("above_upper", 1, 40.0, 40.0, 1),
        ("cooldown", 0, 41.0, 41.0, 1),
    ]
    # A repeat keeps its latest ratio; a changed replica count is a new entry.
    a.decide(0.03, 3, 42.0)
    assert a.snapshot(42.0)["decisions"][-1]["ratio"] == 0.03
    a.decide(0.03, 4, 43.0)
    assert [d["replicas"] for d in a.snapshot(43.0)["decisions"][-2:]] == [3, 4]


def test_steps_are_never_folded_together() -> None:
    a = create_autoscaler(up_cooldown_s=0.0, max_replicas=8)
    for t in range(3):
        a.decide(0.05, 1 + t, float(t))
    assert [(d["delta"], d["repeats"]) for d in a.snapshot(3.0)["decisions"]] == [(1, 1)] * 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lower": 0.02},  # not below upper
        {"upper": 1.5},
        {"min_replicas": 5},  # above max_replicas
        {"step": 0},
        {"up_cooldown_s": -1.0},
        {"max_replicas": 2.0},
        {"down_cooldown_s": 30.0, "max_down_cooldown_s": 20.0},  # below the base cooldown
    ],
)
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(PolicyValueError):
        create_autoscaler(**kwargs)


def test_vertical_step_makes_service_20_percent_faster_or_25_percent_slower() -> None:
    assert vertical_step(1.0, +1) == 0.8
    assert vertical_step(1.0, -1) == 1.25
    assert vertical_step(2.0, 0) == 2.0
    assert vertical_step(1.0, 2) == pytest.approx(0.64)
    assert vertical_step(vertical_step(1.0, 1), -1) == 1.0  # a step down undoes a step up
    with pytest.raises(PolicyValueError):
        vertical_step(0.0, 1)
    with pytest.raises(PolicyValueError):
        vertical_step(1.0, 0.5)  # type: ignore[arg-type]


def test_a_step_down_undone_at_once_doubles_the_down_cooldown_until_one_holds() -> None:
    a = create_autoscaler(max_replicas=10, up_cooldown_s=0.0, down_cooldown_s=10.0)
    assert a.decide(0.0, 3, 0.0).delta == -1  # down to 2
    assert a.decide(0.05, 2, 1.0).delta == 1  # undone within 10 s: flapping
    assert a.effective_down_cooldown_s == 20.0
    assert a.decide(0.0, 3, 15.0).reason == "cooldown"  # 14 s after the change, < 20 s
    assert a.decide(0.0, 3, 21.0).delta == -1
    assert a.decide(0.05, 2, 22.0).delta == 1  # flaps again: 40 s
    assert a.effective_down_cooldown_s == 40.0
    assert a.decide(0.0, 3, 62.0).delta == -1
    # This step down holds: the next one finds the cooldown back at its base.
    assert a.decide(0.0, 2, 102.0).delta == -1
    assert a.effective_down_cooldown_s == 10.0
    assert a.snapshot(102.0)["effective_down_cooldown_s"] == 10.0


def test_flap_backoff_is_capped() -> None:
    a = create_autoscaler(
        max_replicas=10, up_cooldown_s=0.0, down_cooldown_s=10.0, max_down_cooldown_s=15.0
    )
    t = 0.0
    for _ in range(3):
        assert a.decide(0.0, 3, t).delta == -1
        assert a.decide(0.05, 2, t + 1).delta == 1
        t += 100.0
    assert a.effective_down_cooldown_s == 15.0


def test_max_down_cooldown_below_the_base_is_refused_by_name() -> None:
    with pytest.raises(PolicyValueError, match=r"max_down_cooldown_s.*20\.0"):
        create_autoscaler(down_cooldown_s=30.0, max_down_cooldown_s=20.0)


def test_a_step_down_that_held_resets_the_down_cooldown_when_a_step_up_follows() -> None:
    a = create_autoscaler(max_replicas=10, up_cooldown_s=0.0, down_cooldown_s=10.0)
    assert a.decide(0.0, 3, 0.0).delta == -1
    assert a.decide(0.05, 2, 1.0).delta == 1  # flap: 20 s
    assert a.decide(0.0, 3, 21.0).delta == -1
    assert a.decide(0.05, 2, 22.0).delta == 1  # flap again: 40 s
    assert a.effective_down_cooldown_s == 40.0
    assert a.decide(0.0, 3, 62.0).delta == -1
    # The load rises 15 s later: the step down held a whole base cooldown, so this step up
    # is not a flap and the next step down waits only the base 10 s.
    assert a.decide(0.05, 2, 77.0).delta == 1
    assert a.effective_down_cooldown_s == 10.0
    assert a.decide(0.0, 3, 86.9).reason == "cooldown"
    assert a.decide(0.0, 3, 87.0).delta == -1


def test_only_the_step_up_right_after_a_step_down_counts_as_a_flap() -> None:
    a = create_autoscaler(max_replicas=10, up_cooldown_s=0.0, down_cooldown_s=10.0)
    assert a.decide(0.0, 3, 0.0).delta == -1
    assert a.decide(0.05, 2, 1.0).delta == 1  # flap: 20 s
    # Further steps up neither double the cooldown again nor reset it.
    assert a.decide(0.05, 3, 2.0).delta == 1
    assert a.decide(0.05, 4, 30.0).delta == 1
    assert a.effective_down_cooldown_s == 20.0


@pytest.mark.parametrize(("queueing", "dispatch"), [("central", "central"), ("server", "retry")])
def test_the_swayam_loop_models_the_queueing_of_its_pool(queueing: str, dispatch: str) -> None:
    scaling = AutoscalingConfig(policy="swayam", pool="edge")
    config = GatewayConfig(
        pools=[PoolConfig(name="default"), PoolConfig(name="edge", queueing=queueing)],
        autoscaling=scaling,
    )
    loop = AutoscalerLoop(SimpleNamespace(config=config), scaling, None, lambda: 0.0)  # type: ignore[arg-type]
    assert isinstance(loop.policy, SwayamPolicy)
    assert loop.policy.dispatch == dispatch


async def test_an_sla_violation_makes_the_swayam_loop_decide_at_once() -> None:
    scaling = AutoscalingConfig(policy="swayam", pool="edge", interval_s=30.0)
    config = GatewayConfig(pools=[PoolConfig(name="edge")], autoscaling=scaling)
    clock = [0.0]
    loop = AutoscalerLoop(SimpleNamespace(config=config), scaling, None, lambda: clock[0])  # type: ignore[arg-type]
    ticks: list[float] = []

    async def tick() -> None:
        ticks.append(clock[0])

    loop.tick = tick  # type: ignore[method-assign]
    loop.record_query(99.0, 100.0, 8, "edge")
    loop.record_query(99.0, 100.0, 8, "other")  # another pool's: not this loop's group
    assert loop._recent_groups(0.0) == [(99.0, 100.0, 8)]
    runner = asyncio.create_task(loop._run())
    try:
        await asyncio.sleep(0.01)
        assert ticks == []  # the period is 30 s
        loop.note_violation("other")
        await asyncio.sleep(0.01)
        assert ticks == []
        loop.note_violation("edge")
        await asyncio.sleep(0.05)
        assert len(ticks) == 1 and loop.policy.violations == 1
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    # Groups unseen for longer than the predictor's history are forgotten.
    assert loop._recent_groups(loop.policy.predictor.history_s + 1.0) == []  # type: ignore[union-attr]


async def test_swayam_scales_a_statefulset_in_past_the_prefix_after_the_idle_time() -> None:
    scaling = AutoscalingConfig(policy="swayam", pool="edge", idle_s=10.0, max_replicas=8)
    config = GatewayConfig(pools=[PoolConfig(name="edge")], autoscaling=scaling)

    class Sts:  # a StatefulSet: its pods cannot retire themselves
        self_retiring = False
        name = "k8s"
        n = 5

        async def replicas(self) -> int:
            return self.n

        async def scale_to(self, replicas: int) -> int:
            self.n = replicas
            return replicas

    clock = [0.0]
    service = SimpleNamespace(config=config, links={}, pool_members={"edge": []})
    sts = Sts()
    loop = AutoscalerLoop(service, scaling, sts, lambda: clock[0])  # type: ignore[arg-type]
    assert isinstance(loop.policy, SwayamPolicy)
    # No traffic: the prefix n shrinks to min_replicas (1), so 4 of the 5 pods get no task.
    for t in (0.0, 5.0, 9.0):
        clock[0] = t
        assert await loop.tick() is None and sts.n == 5  # not yet idle for 10 s
    clock[0] = 10.5
    action = await loop.tick()
    assert action is not None and action["reason"] == "passive_scale_in"
    assert (action["from"], action["to"], sts.n) == (5, 1, 1) == (5, loop.policy.in_use, 1)
    sts.self_retiring = True  # a local actuator: the servers leave by themselves
    sts.n = 5
    for t in (20.0, 40.0, 60.0):
        clock[0] = t
        assert await loop.tick() is None and sts.n == 5


async def test_a_decision_woken_early_adds_no_rate_sample() -> None:
    scaling = AutoscalingConfig(policy="swayam", pool="edge", interval_s=1.0)
    config = GatewayConfig(pools=[PoolConfig(name="edge")], autoscaling=scaling)

    class Fixed:
        self_retiring = True
        name = "fixed"

        async def replicas(self) -> int:
            return 1

        async def scale_to(self, replicas: int) -> int:
            return replicas

    clock = [0.0]
    service = SimpleNamespace(config=config, links={}, pool_members={"edge": []})
    loop = AutoscalerLoop(service, scaling, Fixed(), lambda: clock[0])  # type: ignore[arg-type]
    assert isinstance(loop.policy, SwayamPolicy)
    rates: list[float] = []
    loop._share_rate = lambda now, rate: rates.append(rate) or rate  # type: ignore[method-assign]
    loop.tasks_offered = 100
    clock[0] = 1.0
    await loop.tick()
    loop.tasks_offered += 5
    clock[0] = 1.1  # an SLA violation woke it 0.1 s later: 50/s over 0.1 s is noise
    await loop.tick()
    clock[0] = 2.0
    loop.tasks_offered += 45
    await loop.tick()
    assert rates == [100.0, 50.0]  # the second sample spans 1.0 -> 2.0 s
