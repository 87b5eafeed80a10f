"""x_p^u from the paper's model: a CDF book primed with the quantile table and its tail."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gateway.cdf import CdfBook
from gateway.table_cdf import ConditionalTail, TableCdf, prior_of
from taskserver.service_time import ExponentialServiceTime, QuantileFileServiceTime

APPS = ("masstree", "shore", "xapian")
KS = (*range(1, 101), *range(110, 1001, 10))


def _dist(tailbench_dir: Path, app: str) -> QuantileFileServiceTime:
    return QuantileFileServiceTime.from_file(tailbench_dir / f"{app}_quantiles.txt")


@pytest.mark.parametrize("app", APPS)
def test_a_primed_row_solves_x_p_u_as_the_model_does_for_every_fanout(
    tailbench_dir: Path, app: str
) -> None:
    """Within 0.5% of F^-1((p/100)^(1/k)) for k = 1..1000, through the closed form (one shared
    row) and through the grid solver (as many rows, one per server, as the fanout)."""
    dist = _dist(tailbench_dir, app)
    shared, per_server = CdfBook(), CdfBook()
    prior = prior_of(dist)
    assert isinstance(prior, TableCdf)
    for i in range(1000):
        shared.add_server(f"s{i}", prior, group="all")
        per_server.add_server(f"s{i}", prior)
    worst = 0.0
    for p in (99.0, 95.0):
        for k in KS:
            exact = dist.quantile((p / 100) ** (1 / k))
            ids = [f"s{i}" for i in range(k)]
            closed = shared.solve(ids, p)
            grid = per_server.solve(ids, p)
            assert closed.unloaded_ms == pytest.approx(exact, rel=1e-9), (p, k)
            assert grid.unloaded_ms == pytest.approx(exact, rel=0.005), (p, k)
            worst = max(worst, abs(grid.unloaded_ms / exact - 1))
            beyond = exact > dist.quantile(0.9999)
            assert closed.estimate == ("tail-model" if beyond else "empirical")
    assert worst < 0.005


def test_the_old_prior_of_samples_missed_the_tail(tailbench_dir: Path) -> None:
    # What a book primed with 10,000 mid-point quantiles solved (the simulator's former
    # budgets): x_99^u(100) and x_99^u(1000) off by more than the 0.5% the model achieves.
    dist = _dist(tailbench_dir, "masstree")
    book = CdfBook(window_size=10_000, refresh_every=1 << 30)
    book.add_server("s", dist.quantiles(10_000), group="g")
    for k in (100, 1000):
        exact = dist.quantile(0.99 ** (1 / k))
        got = book.solve(["s"] * k, 99.0).unloaded_ms
        assert abs(got / exact - 1) > 0.005, k


@pytest.mark.parametrize("app", APPS)
def test_table_cdf_is_the_distribution(tailbench_dir: Path, app: str) -> None:
    dist = _dist(tailbench_dir, app)
    cdf = TableCdf.from_table(dist.table_ms, dist.scaled_tail_mean_ms, shift_ms=0.25)
    for u in (0.0, 0.013, 0.5, 0.99, 0.9999, 0.99995, 1 - 1e-7):
        x = cdf.quantile(u)
        assert x == pytest.approx(dist.quantile(u) + 0.25, rel=1e-12)
        if 0.0 < u:  # the quantile function: F(x-) <= u <= F(x) (F jumps at ties)
            assert float(cdf.cdf(x * (1 - 1e-12))) <= u + 1e-12 <= float(cdf.cdf(x)) + 2e-12
    assert cdf.mean_ms() == pytest.approx(dist.mean_ms + 0.25, rel=1e-9)
    # Ties in a table are jumps of F at their value: [1, 2, 2, 2, 3] at 0, .2, .4, .6, .8.
    ties = TableCdf.from_table([1.0, 2.0, 2.0, 2.0, 3.0], 0.5)
    assert float(ties.cdf(2.0)) == pytest.approx(0.6)
    assert float(ties.cdf(2.0 - 1e-9)) == pytest.approx(0.2, abs=1e-8)
    assert ties.quantile(0.3) == ties.quantile(0.6) == 2.0
    assert ties.quantile(0.7) == pytest.approx(2.5)


def test_mean_excess_matches_numerical_integration(tailbench_dir: Path) -> None:
    dist = _dist(tailbench_dir, "shore")
    cdf = TableCdf.from_table(dist.table_ms, dist.scaled_tail_mean_ms)
    for x in (0.05, 0.3, 1.0, 2.5, 2.7778, 4.0):
        grid = np.linspace(x, 60.0, 400_001)
        s = np.exp(cdf.log_survival(grid))
        numeric = float(np.sum((s[1:] + s[:-1]) / 2 * np.diff(grid))) / float(s[0])
        assert cdf.mean_excess_ms(x) == pytest.approx(numeric, rel=1e-3), x


def test_a_window_that_still_holds_the_prior_keeps_its_tail(tailbench_dir: Path) -> None:
    """Online samples replace the prior slot by slot; until they have, the model's shape
    extends the window beyond its largest sample, so x_p^u(1000) does not jump to a GPD
    fitted on the table's top 5% at the first refresh."""
    dist = _dist(tailbench_dir, "masstree")
    book = CdfBook(window_size=4096, refresh_every=64)
    book.add_server("s", prior_of(dist))
    exact = dist.quantile(0.99 ** (1 / 1000))
    rng = np.random.default_rng(3)
    for x in rng.choice(np.asarray(dist.quantiles(10_000)), size=64):
        book.observe("s", float(x))  # one refresh: a window of prior + online samples
    cdf = book.cdf_of("s")
    assert isinstance(cdf.tail, ConditionalTail)
    got = book.solve(["s"] * 1000, 99.0)
    assert got.estimate == "tail-model"
    assert got.unloaded_ms == pytest.approx(exact, rel=0.02)
    for x in rng.choice(np.asarray(dist.quantiles(10_000)), size=4096):
        book.observe("s", float(x))  # the prior is gone: the tail is fitted on the samples
    assert not isinstance(book.cdf_of("s").tail, ConditionalTail)


def test_other_laws_prime_with_samples() -> None:
    prior = prior_of(ExponentialServiceTime(2.0), shift_ms=0.5, points=100)
    assert isinstance(prior, np.ndarray) and prior.size == 100
    assert prior.min() > 0.5 and math.isfinite(prior.max())
