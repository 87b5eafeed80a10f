"""mu, eps and the HBF/LBF switching of PARD §4.3 on a fake clock, with exact switch times."""

from __future__ import annotations

import pytest

from taskserver.pard import (
    AdaptivePriority,
    ArrivalRateMonitor,
    BudgetQueue,
    PipelineRequest,
    Priority,
    PriorityConfig,
    QueueOrder,
)

# Arrivals per 1 s bucket. With capacity 10 rps, smooth_buckets=2 and epsilon_buckets=3:
#   bucket  T_in  T_s    |T_in-T_s|  eps                       mu    band
#   0       10    10     0           0/10                      1.0   [1, 1]       keep LBF
#   1       10    10     0           0/20                      1.0   [1, 1]       keep LBF
#   2       20    15     5           5/40       = 0.125        2.0   > 1.125  ->  HBF at 3.0
#   3        9    14.5   5.5         10.5/39    = 0.2692       0.9   in band  ->  keep HBF
#   4        5    7      2           12.5/34    = 0.3676       0.5   < 0.6324 ->  LBF at 5.0
COUNTS = [10, 10, 20, 9, 5]
CONFIG = PriorityConfig(bucket_s=1.0, smooth_buckets=2, epsilon_buckets=3)


def drive(controller: AdaptivePriority, until_s: int) -> dict[float, Priority]:
    """Arrivals spread over each second; update() at every whole and half second."""
    seen: dict[float, Priority] = {}
    for second in range(until_s + 1):
        for t in (float(second), second + 0.5):
            seen[t] = controller.update(t)
            if t == second and second < len(COUNTS):
                n = COUNTS[second]
                for k in range(n):
                    controller.record_arrival(second + k / n)
    return seen


def test_epsilon_and_rates_by_hand() -> None:
    monitor = ArrivalRateMonitor(CONFIG)
    expected_eps = [0.0, 0.0, 5 / 40, 10.5 / 39, 12.5 / 34]
    for second, n in enumerate(COUNTS):
        for k in range(n):
            monitor.record_arrival(second + k / n)
        monitor.advance(second + 1.0)
        assert monitor.rate_rps == n
        assert monitor.epsilon == pytest.approx(expected_eps[second])
    assert monitor.smoothed_rps == pytest.approx(7.0)
    assert monitor.buckets_closed == 5


def test_delayed_transition_holds_priority_inside_the_band() -> None:
    controller = AdaptivePriority(CONFIG)
    controller.set_capacity_rps(10.0)
    seen = drive(controller, 6)
    assert [seen[t] for t in (1.0, 2.0, 2.5)] == [Priority.LBF] * 3
    assert seen[3.0] is Priority.HBF  # mu = 2.0 > 1.125
    assert seen[4.0] is Priority.HBF  # mu = 0.9, inside [0.731, 1.269]: delayed
    assert seen[4.5] is Priority.HBF
    assert seen[5.0] is Priority.LBF  # mu = 0.5 < 0.632
    assert controller.switch_count == 2
    assert controller.last_switch_s == 5.0


def test_instant_switching_flips_at_mu_one() -> None:
    controller = AdaptivePriority(CONFIG, instant=True)
    controller.set_capacity_rps(10.0)
    seen = drive(controller, 6)
    assert seen[2.0] is Priority.LBF  # mu = 1.0: LBF (mu <= 1, §4.3)
    assert seen[3.0] is Priority.HBF
    assert seen[4.0] is Priority.LBF  # mu = 0.9 switches at once
    assert controller.switch_count == 2
    assert controller.last_switch_s == 4.0


def test_idle_seconds_count_as_zero_rate_and_a_wide_band_delays_lbf() -> None:
    controller = AdaptivePriority(CONFIG)
    controller.set_capacity_rps(10.0)
    drive(controller, 3)  # HBF from 3.0; bucket 3 got 9 arrivals
    assert controller.update(4.0) is Priority.HBF  # mu = 0.9, in band
    # Buckets 4 and 5 are empty. At 6.0 the eps window holds T_in = [9, 0, 0] with deviations
    # [5.5, 4.5, 0]: eps = 10/9 > 1, so Th_LBF < 0 and even mu = 0 stays HBF (§4.3, uncapped).
    assert controller.update(6.0) is Priority.HBF
    assert controller.epsilon == pytest.approx(10 / 9)
    assert controller.load_factor == 0.0
    # At 7.0 the burst has left the window: T_in = [0, 0, 0], eps = 0, mu = 0 -> LBF.
    assert controller.update(7.0) is Priority.LBF
    assert controller.last_switch_s == 7.0


def test_no_capacity_keeps_the_initial_priority() -> None:
    controller = AdaptivePriority(PriorityConfig(initial=Priority.HBF))
    for k in range(100):
        controller.record_arrival(k / 100)
    assert controller.update(5.0) is Priority.HBF
    assert controller.load_factor is None


def test_budget_queue_follows_the_controller() -> None:
    queue = BudgetQueue(QueueOrder.ADAPTIVE, CONFIG)
    queue.set_capacity_rps(2.0)
    for k in range(10):  # 10 arrivals in bucket 0: mu = 5 once it closes
        queue.push(PipelineRequest(k, deadline_s=1.0 + k, slo_s=2.0, received_s=0.0), k / 10)
    assert queue.pop(0.95).request_id == 0  # bucket 0 still open: initial LBF, smallest budget
    assert queue.pop(1.0).request_id == 9  # HBF: largest budget
    assert queue.controller.load_factor == 5.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bucket_s", 0.0),
        ("bucket_s", float("inf")),
        ("smooth_buckets", 0),
        ("epsilon_buckets", 2.5),
    ],
)
def test_bad_settings_name_the_field_and_value(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field}.*{value!r}"):
        PriorityConfig(**{field: value})


def test_bad_capacity() -> None:
    with pytest.raises(ValueError, match=r"capacity_rps.*-1"):
        AdaptivePriority().set_capacity_rps(-1.0)
