"""DeadlineEstimator: T_b = x_p^SLO - x_p^u(k_f) (TailGuard eq. (4)) and its cache."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from gateway.cdf import CdfBook
from gateway.deadlines import DeadlineEstimator, DeadlinePlan, SloUnreachable


def exp_quantiles_ms(mean_ms: float = 1.0, n: int = 4096) -> np.ndarray:
    """Exact exponential quantiles at Hazen positions."""
    return -np.log1p(-(np.arange(n) + 0.5) / n) * mean_ms


def make_estimator(
    k: int = 20, *, group: str | None = None, cache_size: int = 4096, **book_kw
) -> tuple[CdfBook, DeadlineEstimator]:
    """A book of k exponential (mean 1 ms) servers s0.. and an estimator over it."""
    book = CdfBook(**book_kw)
    for i in range(k):
        book.add_server(f"s{i}", exp_quantiles_ms(), group=group)
    return book, DeadlineEstimator(book, cache_size=cache_size)


def ids(*indices: int) -> list[str]:
    return [f"s{i}" for i in indices]


def test_budget_is_slo_minus_unloaded_latency() -> None:
    book, estimator = make_estimator(group="pool")
    chosen = ids(*range(10))
    plan = estimator.plan(chosen, 99.0, slo_ms=20.0)
    unloaded = -math.log1p(-(0.99 ** (1 / 10)))  # closed form for mean 1 ms
    # To the book's float32 samples (each within 6e-8 of itself, gateway.cdf.SAMPLE_DTYPE).
    assert plan.unloaded_ms == pytest.approx(unloaded, rel=6e-8)
    assert plan.budget_ms == pytest.approx(20.0 - unloaded, rel=6e-8)
    assert (plan.percentile, plan.slo_ms, plan.fanout, plan.estimate) == (
        99.0,
        20.0,
        10,
        "empirical",
    )
    assert plan.unloaded_ms == book.solve(chosen, 99.0).unloaded_ms


def test_larger_fanout_gets_a_smaller_budget() -> None:
    _, estimator = make_estimator()
    budgets = [estimator.plan(ids(*range(k)), 99.0, 30.0).budget_ms for k in (1, 5, 20)]
    assert budgets[0] > budgets[1] > budgets[2] > 0


def test_unreachable_slo_names_both_numbers() -> None:
    _, estimator = make_estimator()
    chosen = ids(*range(20))
    unloaded = estimator.plan(chosen, 99.0, 100.0).unloaded_ms
    with pytest.raises(SloUnreachable) as info:
        estimator.plan(chosen, 99.0, slo_ms=5.0)
    exc = info.value
    assert (exc.slo_ms, exc.unloaded_ms, exc.percentile, exc.fanout) == (5.0, unloaded, 99.0, 20)
    assert "5 ms" in str(exc) and f"{unloaded:.6g} ms" in str(exc)
    with pytest.raises(SloUnreachable):
        estimator.plan(chosen, 99.0, slo_ms=unloaded)  # equal is not enough: no budget left
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and again.fanout == 20


def test_cache_counts_hits_for_the_same_composition_in_any_order() -> None:
    _, estimator = make_estimator()
    first = estimator.plan(ids(0, 1, 2), 99.0, 50.0)
    assert (estimator.cache_hits, estimator.cache_misses) == (0, 1)
    again = estimator.plan(ids(2, 0, 1), 99.0, 50.0)
    assert again == first
    other_slo = estimator.plan(ids(1, 2, 0), 99.0, 60.0)  # same x_p^u, another budget
    assert other_slo.unloaded_ms == first.unloaded_ms and other_slo.budget_ms == 60.0 - (
        first.unloaded_ms
    )
    assert (estimator.cache_hits, estimator.cache_misses) == (2, 1)
    estimator.plan(ids(0, 1, 2), 99.9, 50.0)  # another percentile is another entry
    estimator.plan(ids(0, 1, 3), 99.0, 50.0)  # another multiset too
    assert (estimator.cache_hits, estimator.cache_misses) == (2, 3)


def test_cache_serves_the_old_number_until_a_refresh_then_a_new_one() -> None:
    book, estimator = make_estimator(refresh_every=64)
    chosen = ids(0, 1, 2, 3)
    before = estimator.plan(chosen, 99.0, 50.0)
    slow = np.random.default_rng(0).exponential(3.0, 4096)
    for value in slow[:63]:
        book.observe("s0", float(value))
    assert estimator.plan(chosen, 99.0, 50.0) == before
    assert estimator.cache_hits == 1
    for value in slow[63:]:
        book.observe("s0", float(value))
    after = estimator.plan(chosen, 99.0, 50.0)
    assert estimator.cache_misses == 2
    assert after.unloaded_ms > before.unloaded_ms * 1.5


def test_cache_is_a_bounded_lru() -> None:
    _, estimator = make_estimator(cache_size=2)
    a, b, c = ids(0), ids(0, 1), ids(0, 1, 2)
    for chosen in (a, b, a, c):  # c evicts b, the least recently used
        estimator.plan(chosen, 99.0, 50.0)
    assert (estimator.cache_hits, estimator.cache_misses) == (1, 3)
    estimator.plan(a, 99.0, 50.0)
    assert estimator.cache_hits == 2
    estimator.plan(b, 99.0, 50.0)
    assert estimator.cache_misses == 4


def test_registration_changes_invalidate_the_cache() -> None:
    book, estimator = make_estimator()
    estimator.plan(ids(0, 1), 99.0, 50.0)
    book.add_server("s1", exp_quantiles_ms(5.0))  # re-added with a slower prior
    plan = estimator.plan(ids(0, 1), 99.0, 50.0)
    assert estimator.cache_misses == 2
    assert plan.unloaded_ms > 5.0 * math.log(100) * 0.99


@pytest.mark.parametrize("bad", [0, 100, -1, math.nan])
def test_bad_percentile_names_the_value(bad: float) -> None:
    _, estimator = make_estimator()
    with pytest.raises(ValueError, match=rf"got {bad!r}"):
        estimator.plan(ids(0, 1), bad, 50.0)


@pytest.mark.parametrize("bad", [0.0, -3.0, math.nan, math.inf])
def test_bad_slo_names_the_value(bad: float) -> None:
    _, estimator = make_estimator()
    with pytest.raises(ValueError, match=rf"slo_ms.*got {bad!r}"):
        estimator.plan(ids(0, 1), 99.0, bad)


def test_plan_is_a_plain_frozen_record() -> None:
    _, estimator = make_estimator()
    plan = estimator.plan(ids(0), 95.0, 10.0)
    assert isinstance(plan, DeadlinePlan)
    with pytest.raises(AttributeError):
        plan.budget_ms = 1.0  # type: ignore[misc]
