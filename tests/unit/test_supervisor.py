"""Restart policy of `tailgate up`: backoff, jitter, cap, stable reset, start limit, phases."""

from __future__ import annotations

import random
import re
import signal
from typing import Any

import pytest

from deploy.supervisor import (
    Action,
    Phase,
    RestartBackoff,
    RestartDecision,
    RestartPolicy,
    describe_exit,
    is_clean_exit,
)

SIGKILLED = -int(signal.SIGKILL)


class FakeClock:
    """Time that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        """Move on by `seconds`; returns the new time."""
        self.now += seconds
        return self.now


class FixedRandom(random.Random):
    """An rng whose random() always returns `value`."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def make_backoff(
    rng: random.Random | None = None, **policy: Any
) -> tuple[RestartBackoff, FakeClock]:
    """A backoff started at the fake clock's time (jitter-free unless an rng is given)."""
    if rng is None:
        policy.setdefault("jitter", 0.0)
        rng = random.Random(0)
    clock = FakeClock()
    backoff = RestartBackoff(RestartPolicy(**policy), rng)
    backoff.started(clock.now)
    return backoff, clock


def crash_after(
    backoff: RestartBackoff, clock: FakeClock, uptime_s: float, returncode: int = SIGKILLED
) -> RestartDecision:
    """The child dies `uptime_s` after its start; it is restarted exactly when decided."""
    decision = backoff.decide(returncode, clock.advance(uptime_s), Phase.RUNNING)
    if decision.action is Action.RESTART:
        backoff.started(clock.advance(decision.delay_s))
    return decision


def test_delays_double_from_half_a_second_up_to_the_cap() -> None:
    backoff, clock = make_backoff(start_limit_burst=100)
    got = [crash_after(backoff, clock, 1.0) for _ in range(9)]
    assert [d.delay_s for d in got] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [d.restart for d in got] == list(range(1, 10))
    assert [d.failures for d in got] == list(range(1, 10))
    assert all(d.action is Action.RESTART and not d.limited for d in got)
    assert got[0].status == "killed by SIGKILL"


def test_seeded_jitter_gives_exact_delays_within_20_percent() -> None:
    backoff, clock = make_backoff(random.Random(7))
    got = [crash_after(backoff, clock, 0.1).delay_s for _ in range(5)]
    assert got == [
        0.4647665529666325,
        0.8603396695698008,
        2.120747578431883,
        3.3158980586680684,
        8.114822413781406,
    ]
    # the same seed, the same delays: a run can be replayed
    again, clock = make_backoff(random.Random(7))
    assert [crash_after(again, clock, 0.1).delay_s for _ in range(5)] == got


@pytest.mark.parametrize(("u", "first_s", "capped_s"), [(0.0, 0.4, 24.0), (0.5, 0.5, 30.0)])
def test_jitter_scales_each_delay_by_at_most_20_percent(
    u: float, first_s: float, capped_s: float
) -> None:
    backoff, clock = make_backoff(FixedRandom(u), start_limit_burst=100)
    got = [crash_after(backoff, clock, 1.0).delay_s for _ in range(8)]
    assert got[0] == pytest.approx(first_s, abs=1e-12)
    assert got[-1] == pytest.approx(capped_s, abs=1e-12)


def test_the_largest_delay_is_the_cap_plus_20_percent() -> None:
    backoff, clock = make_backoff(FixedRandom(1.0), start_limit_burst=100)
    got = [crash_after(backoff, clock, 1.0).delay_s for _ in range(10)]
    assert max(got) == pytest.approx(36.0, abs=1e-12)


def test_ten_seconds_up_resets_the_backoff() -> None:
    backoff, clock = make_backoff(start_limit_burst=100)
    assert [crash_after(backoff, clock, 1.0).delay_s for _ in range(3)] == [0.5, 1.0, 2.0]
    # 9.99 s up is not stable yet: the backoff keeps growing
    assert crash_after(backoff, clock, 9.99).delay_s == 4.0
    # 10 s up is: the next failure starts over, the restart count does not
    reset = crash_after(backoff, clock, 10.0)
    assert (reset.delay_s, reset.failures, reset.restart) == (0.5, 1, 5)
    assert crash_after(backoff, clock, 1.0).delay_s == 1.0


def test_more_than_5_failures_in_60_s_restart_at_the_cap_and_say_so() -> None:
    backoff, clock = make_backoff()
    # it stays up 11 s each time, so the stable reset alone would restart it every 0.5 s
    got = [crash_after(backoff, clock, 11.0) for _ in range(6)]
    assert [d.delay_s for d in got[:5]] == [0.5] * 5
    assert not any(d.limited for d in got[:5])
    # the sixth failure within 60 s (at 5 * 11.5 + 11 = 68.5 s after the first start,
    # 57.5 s after the first failure) hits the start limit: the capped delay, flagged
    assert (got[5].limited, got[5].delay_s, got[5].recent_failures) == (True, 30.0, 6)
    assert got[5].action is Action.RESTART  # it keeps being retried, never given up
    # the 30 s wait lets the first failures age out of the window: limited no more
    calm = crash_after(backoff, clock, 11.0)
    assert (calm.limited, calm.delay_s, calm.recent_failures) == (False, 0.5, 3)


def test_a_fast_crash_loop_hits_the_start_limit_at_the_sixth_failure() -> None:
    backoff, clock = make_backoff()
    got = [crash_after(backoff, clock, 0.2) for _ in range(7)]
    assert [d.limited for d in got] == [False] * 5 + [True, True]
    assert [d.delay_s for d in got] == [0.5, 1.0, 2.0, 4.0, 8.0, 30.0, 30.0]


def test_a_long_crash_loop_neither_overflows_nor_grows_past_the_cap() -> None:
    backoff, clock = make_backoff(random.Random(3))
    got = [crash_after(backoff, clock, 0.0) for _ in range(2000)]
    assert got[-1].restart == 2000 and got[-1].failures == 2000
    assert all(d.delay_s <= 36.0 for d in got)
    assert min(d.delay_s for d in got[10:]) >= 24.0


def test_a_start_that_failed_counts_as_a_failure_without_a_stable_reset() -> None:
    backoff, clock = make_backoff()
    first = backoff.decide(SIGKILLED, clock.advance(1.0), Phase.RUNNING)
    # its restart could not spawn (fork failed): no start, so no uptime to reset on
    failed = backoff.decide(None, clock.advance(100.0), Phase.RUNNING)
    assert first.delay_s == 0.5
    assert (failed.action, failed.status, failed.delay_s) == (
        Action.RESTART,
        "could not be started",
        1.0,
    )


@pytest.mark.parametrize("returncode", [1, 2, 70, SIGKILLED, -int(signal.SIGSEGV)])
def test_a_failure_while_running_is_restarted(returncode: int) -> None:
    backoff, clock = make_backoff()
    assert crash_after(backoff, clock, 1.0, returncode).action is Action.RESTART


@pytest.mark.parametrize(
    "returncode",
    [0, -int(signal.SIGTERM), -int(signal.SIGINT), -int(signal.SIGHUP), -int(signal.SIGPIPE)],
)
def test_a_clean_exit_while_running_stays_down(returncode: int) -> None:
    backoff, clock = make_backoff()
    decision = crash_after(backoff, clock, 1.0, returncode)
    assert decision.action is Action.STAY_DOWN
    assert backoff.restarts == 0 and backoff.failures == 0


@pytest.mark.parametrize("returncode", [0, 2, SIGKILLED])
def test_any_exit_during_start_up_is_fatal_and_none_while_stopping_counts(
    returncode: int,
) -> None:
    backoff, clock = make_backoff()
    fatal = backoff.decide(returncode, clock.advance(0.3), Phase.STARTING)
    assert fatal.action is Action.FATAL and fatal.status == describe_exit(returncode)
    ignored = backoff.decide(returncode, clock.advance(0.3), Phase.STOPPING)
    assert ignored.action is Action.IGNORE
    assert backoff.restarts == 0 and backoff.failures == 0
    # nothing of that shaped the backoff: the first failure while running waits 0.5 s
    assert crash_after(backoff, clock, 1.0).delay_s == 0.5


def test_exit_statuses_in_words() -> None:
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(2) == "exit code 2"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(None) == "could not be started"
    assert is_clean_exit(0) and is_clean_exit(-15)
    assert not is_clean_exit(1) and not is_clean_exit(-9) and not is_clean_exit(None)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("initial_delay_s", 0.0, "initial_delay_s: must be > 0 and <= max_delay_s (30.0), got 0.0"),
        ("initial_delay_s", 31.0, "initial_delay_s: must be > 0 and <= max_delay_s"),
        ("multiplier", 0.5, "multiplier: must be >= 1, got 0.5"),
        ("jitter", 1.0, "jitter: must be in [0, 1), got 1.0"),
        ("stable_after_s", -1.0, "stable_after_s: must be >= 0, got -1.0"),
        ("start_limit_burst", 0, "start_limit_burst: must be >= 1, got 0"),
        ("start_limit_interval_s", 0.0, "start_limit_interval_s: must be > 0, got 0.0"),
    ],
)
def test_a_bad_policy_names_the_field_and_value(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RestartPolicy(**{field: value})
