"""The retry policy (exponential, capped, full jitter) and the log of a retried operation."""

from __future__ import annotations

import random

import pytest

from taskserver.backoff import Backoff, RetryLog


class _Extremes(random.Random):
    """uniform() at its upper end (or lower, with low=True): the bounds, exactly."""

    def __init__(self, low: bool = False) -> None:
        super().__init__(0)
        self.low = low

    def uniform(self, a: float, b: float) -> float:
        return a if self.low else b


def test_the_bound_doubles_from_base_up_to_the_cap_and_starts_over_on_success() -> None:
    b = Backoff(0.25, 5.0, _Extremes())
    assert [b.failed() for _ in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.failures == 7
    b.reset()
    assert b.failed() == 0.25
    assert Backoff(0.25, 5.0, _Extremes(low=True)).failed() == 0.0  # full jitter: from 0
    # a long outage does not overflow
    assert Backoff(0.1, 30.0, _Extremes()).bound_s(10_000) == 30.0


def test_full_jitter_spreads_the_delays_of_processes_that_fail_together() -> None:
    delays = []
    for seed in range(200):
        b = Backoff(0.25, 5.0, random.Random(seed))
        for _ in range(5):
            last = b.failed()
        delays.append(last)
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert len({round(d, 3) for d in delays}) > 150  # not in lockstep
    assert 1.5 < sum(delays) / len(delays) < 2.5  # uniform on [0, 4]: mean 2


@pytest.mark.parametrize(
    ("base_s", "cap_s", "factor", "message"),
    [
        (0.0, 1.0, 2.0, "base_s: must be > 0 and <= cap_s (1.0), got 0.0"),
        (2.0, 1.0, 2.0, "base_s: must be > 0 and <= cap_s (1.0), got 2.0"),
        (0.5, 1.0, 0.5, "factor: must be >= 1, got 0.5"),
    ],
)
def test_bad_numbers_are_named(base_s: float, cap_s: float, factor: float, message: str) -> None:
    with pytest.raises(ValueError) as err:
        Backoff(base_s, cap_s, random.Random(0), factor=factor)
    assert str(err.value) == message


def test_a_retried_failure_is_logged_once_then_at_most_once_a_minute() -> None:
    log = RetryLog("registration at http://gw")
    lines = []
    # A try every 0.5 s for five minutes, always the same error.
    for i in range(600):
        line = log.failed("connection refused", i * 0.5, next_s=0.5)
        if line is not None:
            lines.append((i * 0.5, line))
    assert [t for t, _ in lines] == [0.0, 60.0, 120.0, 180.0, 240.0]
    assert lines[0][1] == "registration at http://gw failed: connection refused (next try in 0.5 s)"
    assert lines[1][1] == (
        "registration at http://gw still failing after 121 tries over 60 s: connection refused "
        "(next try in 0.5 s)"
    )
    assert log.failing and log.failures == 600


def test_a_new_error_is_logged_at_once_and_the_recovery_once() -> None:
    log = RetryLog("link", every_s=60.0)
    assert log.failed("refused", 0.0) == "link failed: refused"
    assert log.failed("refused", 1.0) is None
    assert log.failed("timed out", 2.0) == "link failed after 3 tries: timed out"
    assert log.failed("timed out", 3.0) is None
    assert log.succeeded(4.5) == "link succeeded after 4 failed tries over 4.5 s"
    assert log.succeeded(5.0) is None  # no failure since: nothing to say
    assert not log.failing
    # the next outage starts over: its first failure is logged again
    assert log.failed("refused", 10.0) == "link failed: refused"
    assert log.succeeded(11.0) == "link succeeded after 1 failed try over 1.0 s"
