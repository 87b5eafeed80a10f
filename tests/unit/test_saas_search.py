"""The SaaS max-rate search: the bisection's probes and answer, the summary over seeds."""

from __future__ import annotations

import pytest

from loadtests.saas_search import (
    PolicySummary,
    RateBisection,
    SeedResult,
    ranking_line,
    summarise,
)


def search(capacity: float, **kw: float) -> RateBisection:
    """Bisect against a testbed that passes every rate up to `capacity`."""
    b = RateBisection(kw.get("low", 4.0), kw.get("high", 64.0), kw.get("resolution", 1.0),
                      int(kw.get("max_probes", 10)))  # fmt: skip
    while (rate := b.next_rate()) is not None:
        b.record(rate, rate <= capacity)
    return b


def test_bisection_probes_the_ends_then_halves_the_gap() -> None:
    b = search(23.0)
    assert [r for r, _ in b.probes][:4] == [4.0, 64.0, 34.0, 19.0]
    assert 22.0 <= b.best <= 23.0 and not b.capped
    assert len(b.probes) <= 10


def test_bisection_stops_at_the_probe_limit() -> None:
    b = search(23.0, max_probes=4)
    assert len(b.probes) == 4 and b.best == 19.0


def test_failing_the_low_end_or_passing_the_high_end_ends_at_once() -> None:
    below = search(2.0)
    assert below.probes == [(4.0, False)] and below.best == 0.0
    above = search(100.0)
    assert above.probes == [(4.0, True), (64.0, True)] and above.best == 64 and above.capped


def test_a_pass_above_a_failure_is_not_trusted() -> None:
    b = RateBisection(4.0, 64.0)
    for rate, met in ((4.0, True), (64.0, False), (34.0, False), (19.0, True), (26.5, False)):
        b.record(rate, met)
    b.record(40.0, True)  # noise: a pass above the lowest failure
    assert b.best == 19.0 and b.next_rate() == 22.75


def test_bad_bounds_are_named() -> None:
    with pytest.raises(ValueError, match="low/high: need 0 < low < high, got 8, 4"):
        RateBisection(8, 4)
    with pytest.raises(ValueError, match="max_probes: must be >= 2"):
        RateBisection(4, 8, max_probes=1)


def _policy(name: str, *rates: float) -> PolicySummary:
    return summarise(name, [SeedResult(i + 1, r, r / 100) for i, r in enumerate(rates)])


def test_summary_has_mean_spread_ci_and_utilisation() -> None:
    s = summarise("tf-edfq", [SeedResult(1, 30.0, 0.45), SeedResult(2, 32.0, 0.5),
                              SeedResult(3, 34.0, 0.49)])  # fmt: skip
    assert (s.mean, s.low, s.high) == (32.0, 30.0, 34.0)
    assert s.ci95 == pytest.approx(4.303 * 2.0 / 3**0.5)
    assert s.utilisation == pytest.approx(0.48)
    assert s.to_json()["per_seed"][1] == {
        "seed": 2, "rate": 32.0, "utilisation": 0.5, "capped": False,
    }  # fmt: skip
    assert "32.00" in s.line() and "30.00-34.00" in s.line()


def test_ranking_says_where_the_order_holds_beyond_the_spread() -> None:
    tg = _policy("tf-edfq", 30, 31, 32)
    t = _policy("t-edfq", 26, 27, 29)
    p = _policy("priq", 25, 26, 28)
    line = ranking_line([p, t, tg])
    assert line.startswith("ranking: tf-edfq 31.00 > t-edfq 27.33 ~ priq 26.33")
    assert line.endswith("tf-edfq is first beyond the spread; the rest overlap in places")
    close = ranking_line([_policy("fifo", 29, 31, 33), tg])
    assert close.endswith("fifo leads on the mean but not beyond the spread")
    apart = ranking_line([tg, _policy("fifo", 10, 11, 12)])
    assert apart.endswith("the whole ranking holds beyond the run-to-run spread")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "1,1"], "--seeds: need distinct seeds in 1..1000000"),
        (["--read-sample", "1.5"], "--read-sample: must be in [0, 1], got 1.5"),
        (["--agents-per-process", "0"], "--agents-per-process: must be 1..512, got 0"),
        (["--seeds", "a"], "--seeds: not a comma-separated list of integers"),
        (["--policies", "lifo"], "--policies: must be one of"),
        (["--low", "8", "--high", "4"], "low/high: need 0 < low < high, got 8.0, 4.0"),
    ],
)
def test_maxrate_options_are_checked_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from loadtests.saas_cli import main

    with pytest.raises(SystemExit) as info:
        main(["maxrate", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_one_seed_ranks_nothing_beyond_a_spread() -> None:
    line = ranking_line([_policy("tf-edfq", 40), _policy("fifo", 10)])
    assert line.startswith("ranking: tf-edfq 40.00 > fifo 10.00")
    assert line.endswith("one seed: no run-to-run spread measured, so nothing holds beyond it")
