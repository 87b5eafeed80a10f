"""LatencyCdf snapshots and the CdfBook x_p^u solver (TailGuard eq. (1)-(2))."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gateway import cdf as cdf_mod
from gateway.cdf import CdfBook, LatencyCdf

APPS = ("masstree", "shore", "xapian")


def exp_quantiles_ms(mean_ms: float = 2.0, n: int = 10_000) -> np.ndarray:
    """Exact exponential quantiles at Hazen positions: a noise-free exponential prior."""
    return -np.log1p(-(np.arange(n) + 0.5) / n) * mean_ms


def exp_unloaded_ms(mean_ms: float, k: int, percentile: float) -> float:
    """Closed form x_p^u(k) on k homogeneous exponential servers: F(x)^k = p/100."""
    return -mean_ms * math.log1p(-((percentile / 100.0) ** (1.0 / k)))


def make_book(prior_ms: np.ndarray, k: int, *, group: str | None = "pool", **kw) -> CdfBook:
    """A book of servers s0..s{k-1} sharing one group row, or each with its own row."""
    book = CdfBook(**kw)
    for i in range(k):
        book.add_server(f"s{i}", prior_ms if (group is None or i == 0) else None, group=group)
    return book


def ids(k: int) -> list[str]:
    return [f"s{i}" for i in range(k)]


def bisect_unloaded_ms(cdfs: Sequence[LatencyCdf], counts: Sequence[int], p: float) -> float:
    """Reference x_p^u: bisection in log x on sum_i c_i log F_i(x) = log(p/100), to 1e-10."""
    target = math.log(p / 100.0)

    def total(x: float) -> float:
        return sum(c * float(f.log_cdf(x)) for c, f in zip(counts, cdfs, strict=True))

    lo = min(f.min_ms for f in cdfs) / 2.0
    hi = max(f.quantile(1.0 - 1e-12) for f in cdfs) * 4.0
    assert total(lo) < target <= total(hi)
    while hi - lo > 1e-10 * hi:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if total(mid) < target else (lo, mid)
    return hi


# ----- LatencyCdf ------------------------------------------------------------------------


def test_cdf_is_monotone_in_unit_interval_and_inverts_quantile() -> None:
    cdf = LatencyCdf.from_samples(np.random.default_rng(0).lognormal(0.0, 0.7, 4096))
    xs = np.geomspace(cdf.min_ms / 10, cdf.quantile(1 - 1e-12) * 10, 5000)
    f = cdf.cdf(xs)
    assert np.all(np.diff(f) >= 0) and f[0] == 0.0 and f[-1] <= 1.0
    for q in (0.001, 0.1, 0.5, 0.9, 0.99, 0.9999, 1 - 1e-5, 1 - 1e-9):
        assert float(cdf.cdf(cdf.quantile(q))) == pytest.approx(q, rel=1e-9)


@pytest.mark.parametrize("n", [1, 3, 200, 4096])
def test_quantiles_are_quantile_level_by_level(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(20):
        cdf = LatencyCdf.from_samples(rng.lognormal(0.0, rng.uniform(0.1, 1.5), n))
        qs = [0.0, 1e-9, *rng.uniform(0.0, 1.0, 8).tolist(), 0.5, 0.99, 0.999, 1 - 1e-7, 1.0]
        assert cdf.quantiles(qs) == [cdf.quantile(q) for q in qs]
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="q must be in"):
            cdf.quantiles([0.5, bad])


def test_log_cdf_stays_finite_and_accurate_near_one() -> None:
    cdf = LatencyCdf.from_samples(exp_quantiles_ms(2.0))
    x = cdf.quantile(1 - 1e-12)
    assert float(cdf.log_cdf(x)) == pytest.approx(-1e-12, rel=1e-6)
    assert np.all(np.isfinite(cdf.log_cdf(np.geomspace(cdf.min_ms, 1e4, 100))))
    assert float(cdf.log_cdf(cdf.min_ms / 2)) == -math.inf  # F = 0 below the data


def test_tail_joins_the_body_continuously() -> None:
    cdf = LatencyCdf.from_samples(np.random.default_rng(1).lognormal(0.0, 1.0, 4096))
    u = cdf.threshold_ms
    assert u == cdf.max_ms and cdf.tail is not None
    below, above = cdf.cdf(np.array([u * (1 - 1e-9), u * (1 + 1e-9)]))
    assert above - below == pytest.approx(0.0, abs=1e-9)
    assert float(cdf.quantile(0.99999)) > u


def test_exponential_prior_gives_the_exponential_back() -> None:
    cdf = LatencyCdf.from_samples(exp_quantiles_ms(2.0))
    assert cdf.mean_ms() == pytest.approx(2.0, rel=1e-3)
    for q in (0.5, 0.99, 0.9999, 1 - 1e-6):
        assert cdf.quantile(q) == pytest.approx(-2.0 * math.log1p(-q), rel=2e-3)


def test_small_sample_has_no_tail_and_stops_at_its_max() -> None:
    samples = np.random.default_rng(2).exponential(1.0, 200)
    cdf = LatencyCdf.from_samples(samples)
    assert cdf.tail is None and cdf.threshold_ms == math.inf
    assert cdf.quantile(1 - 1e-9) == samples.max()
    assert float(cdf.cdf(samples.max() * 1.01)) == 1.0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, -0.5], [math.inf]])
def test_bad_samples_are_rejected(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="samples_ms"):
        LatencyCdf.from_samples(bad)


# ----- homogeneous closed forms ------------------------------------------------------------


@pytest.mark.parametrize("percentile", [99.0, 95.0])
@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_exponential_servers_match_the_closed_form(k: int, percentile: float) -> None:
    # The prior is exact exponential quantiles (mean 2 ms, n = 10^4), so inside the data the
    # body is exact to the window's float32 (each sample within 6e-8 of itself; measured
    # <= 8.4e-9; in float64 the interpolation's error was <= 2e-14). k = 1000 at p99
    # needs F = 0.99999, beyond the largest sample (F = 0.99995): the GPD fitted to the top
    # 5% answers, off by its scale estimate (sigma 2.0016 for 2): measured +1.1e-4.
    book = make_book(exp_quantiles_ms(2.0), k, window_size=10_000)
    solution = book.solve(ids(k), percentile)
    exact = exp_unloaded_ms(2.0, k, percentile)
    tol = 5e-4 if solution.estimate == "tail-model" else 6e-8
    assert solution.unloaded_ms == pytest.approx(exact, rel=tol)
    assert solution.per_task_quantile == pytest.approx((percentile / 100.0) ** (1.0 / k))


@pytest.mark.parametrize("k", [2, 10, 100])
def test_distinct_rows_of_one_prior_match_the_closed_form(k: int) -> None:
    # Each server has its own row (grid solver, not the closed form): measured <= 4.1e-5.
    book = make_book(exp_quantiles_ms(2.0, 4096), k, group=None)
    solution = book.solve(ids(k), 99.0)
    assert solution.unloaded_ms == pytest.approx(exp_unloaded_ms(2.0, k, 99.0), rel=2e-4)


def test_repeated_servers_count_as_fanout() -> None:
    # 1000 tasks on 10 distinct rows (100 each): the gemv weights each row by its count.
    # Measured +0.043% (the GPD fitted on 4096 quantiles, beyond the largest of them).
    book = make_book(exp_quantiles_ms(2.0, 4096), 10, group=None)
    solution = book.solve(ids(10) * 100, 99.0)
    assert solution.unloaded_ms == pytest.approx(exp_unloaded_ms(2.0, 1000, 99.0), rel=1e-3)
    assert solution.estimate == "tail-model"


# ----- Tailbench ---------------------------------------------------------------------------

# x_99^u(k) from the quantile tables used as priors (window = the 10^4-entry table), vs line
# k of *_unloaded_p99_by_fanout.txt. Measured relative errors:
#
#   k       masstree   shore     xapian
#   1       -0.33%     +1.24%    +0.13%
#   10      +0.17%     -0.02%    -0.17%
#   100     -5.48%     -1.94%    -1.25%
#
# masstree k = 100 needs F = 0.9999, between the top two table entries (0.4266, 0.4811 ms),
# where the reference (a Monte Carlo run of the authors' simulator) sits 4% above the exact
# value of that simulator's own law (see the k = 1000 test): 6% there, measured + margin.
TAILBENCH_TOL = {1: 0.015, 10: 0.0025, 100: 0.025}
TAILBENCH_TOL_EXCEPTIONS = {("masstree", 100): 0.06}


def load_tailbench(tailbench_dir: Path, app: str) -> tuple[np.ndarray, np.ndarray]:
    prior = np.loadtxt(tailbench_dir / f"{app}_quantiles.txt")
    reference = np.loadtxt(tailbench_dir / f"{app}_unloaded_p99_by_fanout.txt")
    return prior, reference


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("k", sorted(TAILBENCH_TOL))
def test_tailbench_unloaded_p99_matches_the_published_curve(
    tailbench_dir: Path, app: str, k: int
) -> None:
    prior, reference = load_tailbench(tailbench_dir, app)
    book = make_book(prior, k, window_size=prior.size)
    solution = book.solve(ids(k), 99.0)
    tol = TAILBENCH_TOL_EXCEPTIONS.get((app, k), TAILBENCH_TOL[k])
    assert solution.unloaded_ms == pytest.approx(reference[k - 1], rel=tol)


def reference_law(table: np.ndarray, n: int) -> np.ndarray:
    """n exact quantiles of the law behind the reference files.

    The authors' simulator reads the table as bins centred on its entries and draws the top
    bin as the last entry plus an exponential of mean last/2: a tail the data do not show,
    which only fanouts beyond the table's resolution (k = 1000 needs F = 0.99999) feel.
    """
    m = table.size
    u = (np.arange(n) + 0.5) / n
    x = np.interp(u * m - 0.5, np.arange(m), table)
    top = u >= (m - 1) / m
    x[top] = table[-1] - table[-1] / 2.0 * np.log1p(-(u[top] - (m - 1) / m) * m)
    return x


@pytest.mark.parametrize("app", APPS)
def test_tailbench_k1000_matches_given_the_references_tail(tailbench_dir: Path, app: str) -> None:
    # Eq. (1)-(2) at F = 0.99999 reproduce the reference once the CDF has the same tail as
    # the simulator that produced it. Measured: -1.45% / -1.41% / -1.34%.
    table, reference = load_tailbench(tailbench_dir, app)
    law = reference_law(table, 1_000_000)
    book = make_book(law, 1000, window_size=law.size)
    solution = book.solve(ids(1000), 99.0)
    assert solution.estimate == "empirical"  # 10 samples lie beyond F = 0.99999
    assert solution.unloaded_ms == pytest.approx(reference[999], rel=0.025)


@pytest.mark.parametrize("app", APPS)
def test_tailbench_k1000_from_the_table_alone_uses_the_fitted_tail(
    tailbench_dir: Path, app: str
) -> None:
    # From the 10^4-entry table alone, F = 0.99999 lies beyond the data and the POT tail
    # (GPD on the top 5%) extrapolates. It sees thinner tails than the reference's assumed
    # exponential: measured -46.7% (masstree), -22.3% (shore), -46.6% (xapian) vs the file.
    # The estimate is reported as "tail-model" so callers know it is an extrapolation.
    table, reference = load_tailbench(tailbench_dir, app)
    book = make_book(table, 1000, window_size=table.size)
    solution = book.solve(ids(1000), 99.0)
    assert solution.estimate == "tail-model"
    assert table.max() < solution.unloaded_ms < reference[999]


@pytest.mark.parametrize("app", APPS)
def test_tailbench_shared_and_distinct_rows_agree(tailbench_dir: Path, app: str) -> None:
    # Same prior in one group row (closed form) or 100 own rows (grid): measured <= 2.1e-5.
    prior, _ = load_tailbench(tailbench_dir, app)
    shared = make_book(prior, 100, window_size=prior.size)
    distinct = make_book(prior, 100, group=None, window_size=prior.size)
    for k in (2, 10, 100):
        expected = shared.solve(ids(k), 99.0)
        got = distinct.solve(ids(k), 99.0)
        assert got.unloaded_ms == pytest.approx(expected.unloaded_ms, rel=1e-4)
        assert got.estimate == expected.estimate


@pytest.mark.parametrize("app", APPS)
def test_tailbench_large_fanout_needs_the_tail_model(tailbench_dir: Path, app: str) -> None:
    prior, _ = load_tailbench(tailbench_dir, app)
    book = make_book(prior, 1000, window_size=prior.size)
    small, large = book.solve(ids(1), 99.0), book.solve(ids(1000), 99.0)
    assert small.estimate == "empirical"
    assert large.estimate == "tail-model"
    assert large.unloaded_ms > prior.max()


# ----- heterogeneous servers ---------------------------------------------------------------


def test_two_different_servers_solve_the_product_equation() -> None:
    book = CdfBook()
    rng = np.random.default_rng(5)
    book.add_server("fast", rng.lognormal(0.0, 0.5, 4096))
    book.add_server("slow", rng.lognormal(1.0, 0.8, 4096))
    f1, f2 = book.cdf_of("fast"), book.cdf_of("slow")
    for percentile in (90.0, 99.0, 99.9):
        x = book.solve(["fast", "slow"], percentile).unloaded_ms
        # TailGuard eq. (1)-(2): F1(x) F2(x) = p/100. Measured: 1.7e-4 off at p90 (x off by
        # 0.02%, where the density is high), < 1e-8 at p99 and p99.9.
        assert float(f1.cdf(x) * f2.cdf(x)) == pytest.approx(percentile / 100, abs=5e-4)
        assert float(f1.cdf(x * 0.995) * f2.cdf(x * 0.995)) < percentile / 100
        assert float(f1.cdf(x * 1.005) * f2.cdf(x * 1.005)) > percentile / 100


def test_group_of_ten_equals_ten_rows_of_the_same_prior() -> None:
    prior = np.random.default_rng(6).lognormal(0.0, 0.6, 4096)
    grouped = make_book(prior, 10)
    distinct = make_book(prior, 10, group=None)
    for percentile in (95.0, 99.0, 99.9):
        a = grouped.solve(ids(10), percentile)
        b = distinct.solve(ids(10), percentile)
        assert b.unloaded_ms == pytest.approx(a.unloaded_ms, rel=1e-4)  # measured <= 3.2e-7
    # Rows of one prior share its snapshot's slot until they learn: the same multiset of
    # rows, so the same key (and one cached x_p^u) as the group's.
    assert grouped.composition_key(ids(10)) == distinct.composition_key(ids(10))
    distinct.observe_many("s3", [0.5] * 64)  # s3's first refresh: a snapshot of its own
    grouped.observe_many("s3", [0.5] * 64)  # the group's row: every member's snapshot
    assert grouped.composition_key(ids(10)) != distinct.composition_key(ids(10))
    assert distinct.row_key("s3") != distinct.row_key("s4") == distinct.row_key("s0")
    assert grouped.row_key("s3") == grouped.row_key("s4")


def test_solver_matches_precise_bisection_on_random_rows() -> None:
    # 50 lognormal rows with different parameters and sample counts (some too small for a
    # tail), random multisets of k = 1..1000 servers. Measured max error 0.17% (kinks of the
    # empirical CDFs inside one fine grid step of ~0.36%); the product target is 0.5%.
    rng = np.random.default_rng(7)
    book = CdfBook()
    for r in range(50):
        n = int(rng.choice([300, 1000, 4096]))
        book.add_server(f"r{r}", rng.lognormal(rng.uniform(-1, 2), rng.uniform(0.2, 1.2), n))
    cdfs = [book.cdf_of(f"r{r}") for r in range(50)]
    worst = 0.0
    for _ in range(80):
        k = int(rng.choice([1, 2, 3, 10, 30, 100, 300, 1000]))
        percentile = float(rng.choice([50.0, 90.0, 99.0, 99.9]))
        picks = rng.integers(0, 50, k)
        rows, counts = np.unique(picks, return_counts=True)
        got = book.solve([f"r{i}" for i in picks], percentile).unloaded_ms
        exact = bisect_unloaded_ms([cdfs[i] for i in rows], counts.tolist(), percentile)
        worst = max(worst, abs(got / exact - 1.0))
    assert worst <= 0.005


def test_row_outside_the_grid_rebuilds_it() -> None:
    book = CdfBook()
    book.add_server("a", exp_quantiles_ms(1.0, 4096))
    version = book.version
    book.add_server("huge", exp_quantiles_ms(5_000.0, 4096))  # far above the first grid
    book.add_server("tiny", exp_quantiles_ms(0.001, 4096))  # far below it
    assert book.version == version + 2
    for chosen in (["a", "tiny"], ["a", "huge"], ["a", "huge", "tiny"]):
        got = book.solve(chosen, 99.0).unloaded_ms
        exact = bisect_unloaded_ms([book.cdf_of(s) for s in chosen], [1] * len(chosen), 99.0)
        assert got == pytest.approx(exact, rel=1e-4)  # measured <= 6e-6


def test_fanout_beyond_the_grid_falls_back_to_the_exact_cdfs() -> None:
    book = CdfBook()
    book.add_server("a", exp_quantiles_ms(1.0, 4096))
    book.add_server("b", exp_quantiles_ms(1.5, 4096))
    chosen = ["a", "b"] * 500_000  # k = 10^6 at p99.99: per-task survival 1e-10
    got = book.solve(chosen, 99.99)
    exact = bisect_unloaded_ms([book.cdf_of("a"), book.cdf_of("b")], [500_000] * 2, 99.99)
    assert got.unloaded_ms == pytest.approx(exact, rel=1e-6)
    assert got.estimate == "tail-model"


# ----- online updates ----------------------------------------------------------------------


def test_slower_samples_move_the_solution_up_after_each_refresh() -> None:
    book = CdfBook(window_size=4096, refresh_every=64)
    book.add_server("a", exp_quantiles_ms(1.0, 4096))
    book.add_server("b", exp_quantiles_ms(1.0, 4096))
    before = book.solve(["a", "b"], 99.0).unloaded_ms
    slower = np.random.default_rng(8).exponential(2.0, 4096)
    version = book.version
    for value in slower[:63]:
        book.observe("a", float(value))
    assert book.version == version  # not yet: snapshots refresh every 64 samples
    book.observe("a", float(slower[63]))
    assert book.version == version + 1
    assert book.samples_seen("a") == 64 and book.samples_seen("b") == 0
    for value in slower[64:]:
        book.observe("a", float(value))
    after = book.solve(["a", "b"], 99.0).unloaded_ms
    assert after > before * 1.5
    # After a full window the prior is gone: "a" alone is the slower exponential.
    assert book.solve(["a"], 99.0).unloaded_ms == pytest.approx(2.0 * math.log(100), rel=0.1)


def test_prior_is_pushed_out_evenly() -> None:
    # Replacing a quarter of a 1-ms prior with 3-ms samples moves the median as a 75/25
    # mixture would: the slots overwritten first span the prior's quantiles evenly.
    book = CdfBook(window_size=4096, refresh_every=1024)
    book.add_server("a", exp_quantiles_ms(1.0, 4096))
    for value in exp_quantiles_ms(3.0, 1024):
        book.observe("a", float(value))
    xs = np.array([0.5, 1.0, 3.0])
    mixture = 0.75 * -np.expm1(-xs) + 0.25 * -np.expm1(-xs / 3.0)
    np.testing.assert_allclose(book.cdf_of("a").cdf(xs), mixture, atol=5e-3)


def test_group_members_feed_one_row() -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 3, refresh_every=10)
    for i in range(30):
        book.observe(f"s{i % 3}", 5.0)
    assert book.samples_seen("s0") == book.samples_seen("s2") == 30
    assert book.cdf_of("s0") is book.cdf_of("s1")


def test_unknown_server_results_are_ignored_and_bad_values_rejected() -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 1)
    version = book.version
    book.observe("gone", 1.0)
    assert book.version == version
    # 1e39 is finite, but past float32 (the window's type): refused, not stored as inf.
    for bad in (-1.0, math.nan, math.inf, 1e39):
        with pytest.raises(ValueError, match="post_queue_ms"):
            book.observe("s0", bad)
        with pytest.raises(ValueError, match="post_queue_ms"):
            book.observe_many("s0", [1.0, bad, 2.0])
    assert book.version == version and book.samples_seen("s0") == 0
    book.observe_many("s0", [cdf_mod.MAX_SAMPLE_MS, 1.0])  # the largest a window holds
    assert book.samples_seen("s0") == 2
    with pytest.raises(ValueError, match="prior_ms: samples must be finite and at most"):
        CdfBook().add_server("big", [1.0, 1e39])


def test_busy_rows_hold_their_samples_in_float32() -> None:
    # The memory of a server that takes traffic: its window and the sorted copy its snapshot
    # shares as knots are float32, half of float64's bytes (what the dtype is there for).
    book = make_book(exp_quantiles_ms(1.0, 512), 2, window_size=512, group=None)
    book.observe_many("s0", np.random.default_rng(3).exponential(1.0, 64).tolist())
    row = book._row_of("s0")
    assert row.window.dtype == row.sorted.dtype == np.float32
    assert row.window.nbytes == 512 * 4
    assert np.shares_memory(book.cdf_of("s0")._knots_ms, row.sorted)  # shared, not a copy


@pytest.mark.parametrize("tied", [False, True])
def test_quantiles_over_bracketing_pairs_are_np_interps(tied: bool) -> None:
    # quantile and quantiles interpolate over the pair around each level alone (no float64
    # copy of the float32 knots a call): np.interp over the whole body, to its last bits.
    rng = np.random.default_rng(11)
    samples = rng.lognormal(0.0, 0.7, 2000).astype(np.float32)
    if tied:
        samples = np.round(samples, 1)  # runs of equal values: the tie path's knots
    cdf = LatencyCdf.from_samples(samples)
    knots = cdf._knots_ms.astype(np.float64)
    levels = [0.0, 1e-4, 0.1, 0.5, 0.9, 0.99, 0.999, 1 - 1e-9, 1.0]
    # the levels of the knots themselves, where a bracket's ends meet
    levels += (-np.expm1(-cdf._neg_log_sf[[0, 1, 7, -2, -1]])).tolist()
    for q in levels:
        level = -math.log1p(-q) if q < 1.0 else math.inf
        if cdf._neg_log_sf[0] < level <= cdf._neg_log_sf[-1]:
            expected = float(np.interp(level, cdf._neg_log_sf, knots))
            assert cdf.quantile(q) == pytest.approx(expected, rel=1e-15, abs=0.0)
    assert cdf.quantiles(levels) == pytest.approx([cdf.quantile(q) for q in levels], rel=1e-15)


# ----- registration ------------------------------------------------------------------------


def test_group_row_lives_while_a_member_remains() -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 2)
    book.remove_server("s0")
    assert not book.has_server("s0") and book.has_server("s1")
    book.add_server("s2", group="pool")  # the group still exists: no prior needed
    assert book.cdf_of("s2") is book.cdf_of("s1")
    book.remove_server("s1")
    book.remove_server("s2")
    with pytest.raises(ValueError, match="prior_ms"):
        book.add_server("s3", group="pool")  # the group is gone with its last member


def test_readding_a_server_replaces_its_row() -> None:
    book = CdfBook()
    book.add_server("a", exp_quantiles_ms(1.0, 1000))
    fast = book.solve(["a"], 99.0).unloaded_ms
    book.add_server("a", exp_quantiles_ms(4.0, 1000))
    assert book.solve(["a"], 99.0).unloaded_ms == pytest.approx(4 * fast)
    with pytest.raises(KeyError, match="nobody"):
        book.remove_server("nobody")


def test_first_registration_needs_a_prior() -> None:
    with pytest.raises(ValueError, match="prior_ms"):
        CdfBook().add_server("a")


def test_composition_key_names_the_multiset_of_rows() -> None:
    book = CdfBook()
    for i in range(3):  # three priors: three rows of their own
        book.add_server(f"s{i}", exp_quantiles_ms(1.0 + i, 1000))
    assert book.composition_key(["s0", "s1"]) == book.composition_key(["s1", "s0"])
    assert book.composition_key(["s0", "s1"]) != book.composition_key(["s0", "s0"])
    grouped = make_book(exp_quantiles_ms(1.0, 1000), 3)
    assert grouped.composition_key(["s0", "s1"]) == grouped.composition_key(["s2", "s0"])


def test_composition_maps_once_and_goes_stale_with_the_version() -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 3, group=None)
    composition = book.composition(["s0", "s1", "s1"])
    assert composition.key == book.composition_key(["s1", "s0", "s1"])
    direct = book.solve(["s0", "s1", "s1"], 99.0)
    assert book.solve_composition(composition, 99.0) == direct
    book.add_server("s9", exp_quantiles_ms(2.0, 1000))
    with pytest.raises(ValueError, match="stale"):
        book.solve_composition(composition, 99.0)


# ----- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 100, -1, math.nan, 100.5, math.inf])
def test_bad_percentile_names_the_value(bad: float) -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 2)
    with pytest.raises(ValueError, match=rf"got {bad!r}"):
        book.solve(ids(2), bad)


def test_empty_or_unknown_servers_are_clear_errors() -> None:
    book = make_book(exp_quantiles_ms(1.0, 1000), 2)
    with pytest.raises(ValueError, match="empty"):
        book.solve([], 99.0)
    with pytest.raises(KeyError, match="ghost"):
        book.solve(["s0", "ghost"], 99.0)
    with pytest.raises(KeyError, match="ghost"):
        book.composition_key(["ghost"])


def test_servers_of_one_prior_share_a_slot_until_their_first_refresh() -> None:
    prior = np.random.default_rng(3).lognormal(0.0, 0.5, 256)
    book = CdfBook(window_size=256, refresh_every=16)
    for i in range(100):
        book.add_server(f"s{i}", prior)
    assert len({book.row_key(f"s{i}") for i in range(100)}) == 1  # one slot, not 100
    before = book.solve(ids(100), 99.0)
    book.observe_many("s5", [9.0] * 10)  # fewer than a refresh: kept, no window of its own
    assert book.samples_seen("s5") == 10 and book.row_key("s5") == book.row_key("s6")
    assert book.solve(ids(100), 99.0) == before
    book.observe_many("s5", [9.0] * 10)  # its first refresh: a snapshot and slot of its own
    assert book.row_key("s5") != book.row_key("s6") == book.row_key("s0")
    assert book.cdf_of("s5").n == 256 and book.cdf_of("s6") is book.cdf_of("s0")
    assert book.solve(ids(100), 99.0).unloaded_ms > before.unloaded_ms  # s5 slowed down
    window = book._row_of("s5").window
    assert np.count_nonzero(window == 9.0) == 20
    for i in range(100):
        if i != 5:
            book.remove_server(f"s{i}")
    # The prior's slot is free again, and s5 alone still answers.
    assert book.solve(["s5"], 99.0).unloaded_ms == pytest.approx(9.0)
    book.add_server("t", prior)
    assert book.row_key("t") != book.row_key("s5")


def test_servers_of_pools_registering_in_turn_share_their_pools_slot() -> None:
    # Two pools' servers registering interleaved (as they do at a gateway's start) hold one
    # window and one slot per pool, not one each.
    rng = np.random.default_rng(4)
    priors = [rng.lognormal(0.0, 0.5, 256), rng.lognormal(1.0, 0.5, 256)]
    book = CdfBook(window_size=256, refresh_every=16)
    for i in range(200):
        book.add_server(f"s{i}", priors[i % 2])
    for parity in (0, 1):
        members = [f"s{i}" for i in range(parity, 200, 2)]
        assert len({book.row_key(s) for s in members}) == 1
        assert len({id(book._row_of(s).window) for s in members}) == 1
    assert book.row_key("s0") != book.row_key("s1")
    assert book.cdf_of("s0").n == book.cdf_of("s1").n == 256
    assert book.cdf_of("s1").quantile(0.5) > book.cdf_of("s0").quantile(0.5)
    # More priors in turn than the book keeps: each row seeds its own, and every row's
    # window still holds its own prior.
    many = [rng.lognormal(0.0, 0.1 + j / 100, 256) for j in range(cdf_mod.SEEDED_PRIORS + 1)]
    for i in range(2 * len(many)):
        book.add_server(f"m{i}", many[i % len(many)])
    assert len({book.row_key(f"m{i}") for i in range(2 * len(many))}) == 2 * len(many)
    for i in range(2 * len(many)):
        np.testing.assert_array_equal(
            np.sort(book._row_of(f"m{i}").window),
            np.sort(many[i % len(many)]).astype(cdf_mod.SAMPLE_DTYPE),
        )
    assert len(book._seeded) == cdf_mod.SEEDED_PRIORS


@pytest.mark.parametrize("refresh_every", [1, 5, 16, 40, 200])
def test_a_refresh_keeps_the_window_sorted_as_a_full_sort_would(refresh_every: int) -> None:
    # The incremental re-sort (old order minus the overwritten samples, merged with the
    # new ones) must give exactly np.sort of the window, through wrap-arounds, ties, frames
    # larger than half the window and single samples alike.
    rng = np.random.default_rng(refresh_every)
    book = CdfBook(window_size=64, refresh_every=refresh_every)
    book.add_server("a", rng.exponential(1.0, 40))  # the window starts part filled
    row = book._row_of("a")
    checked = 0
    for _ in range(400):
        n = int(rng.choice([1, 2, 3, 7, 20, 40]))
        values = np.round(rng.exponential(1.0, n), 1)  # rounded: ties are common
        if n == 1:
            book.observe("a", float(values[0]))
        else:
            book.observe_many("a", values.tolist())
        if row.pending == 0:  # it refreshed
            assert row.sorted is not None
            np.testing.assert_array_equal(row.sorted, np.sort(row.window[: row.filled]))
            cdf = book.cdf_of("a")
            ref = LatencyCdf.from_samples(row.window[: row.filled])
            xs = np.linspace(0.0, 8.0, 33)
            np.testing.assert_allclose(cdf.log_survival(xs), ref.log_survival(xs), rtol=1e-12)
            assert cdf.mean_ms() == pytest.approx(ref.mean_ms(), rel=1e-12)
            checked += 1
    assert checked > 10


def test_samples_without_ties_give_the_same_snapshot_either_way() -> None:
    # The no-ties path reads the levels cached for n; the general path derives them.
    x = np.random.default_rng(5).lognormal(0.0, 0.8, 2000)
    given = np.sort(x)
    fast = LatencyCdf.from_samples(given, presorted=True)
    assert fast.n == 2000 and given.flags.writeable  # the caller's array is left as it was
    xs = np.geomspace(0.05, 50.0, 200)
    again = LatencyCdf.from_samples(x)  # unsorted input, no ties
    np.testing.assert_array_equal(again.log_survival(xs), fast.log_survival(xs))
    assert again.mean_ms() == fast.mean_ms()
    # The shortcut agrees with the general formulas (runs of one sample each) to rounding.
    xs_sorted = np.sort(x)
    survival = (2000 - np.cumsum(np.ones(2000)) + 0.5) / 2000
    np.testing.assert_allclose(fast._neg_log_sf, -np.log(survival), rtol=1e-15)
    body = float(xs_sorted[0]) + float(
        np.dot(np.diff(xs_sorted), (survival[:-1] - survival[1:]) / np.diff(-np.log(survival)))
    )
    assert fast.tail is not None
    assert fast.mean_ms() == pytest.approx(body + survival[-1] * fast.tail.mean_excess_ms())


def test_the_grid_holds_log_f_of_each_snapshot_kind(tailbench_dir: Path) -> None:
    # _fill computes log F only from the row's smallest sample on, one branch per point:
    # the matrices must hold what log_cdf gives on the whole grid.
    from gateway.cdf import LOG_FLOOR
    from gateway.table_cdf import TableCdf

    rng = np.random.default_rng(9)
    table = TableCdf.from_table(np.loadtxt(tailbench_dir / "xapian_quantiles.txt"), 1.0)
    book = CdfBook(window_size=512, refresh_every=64)
    book.add_server("tail", rng.lognormal(0.0, 1.0, 512))  # a fitted GPD tail
    book.add_server("bounded", rng.uniform(1.0, 2.0, 20))  # too few samples for a tail
    book.add_server("table", table)
    book.observe_many("tail", rng.lognormal(0.5, 1.0, 64).tolist())  # a refresh
    grid = book._grid_ms
    for sid in ("tail", "bounded", "table"):
        slot = book.row_key(sid)
        want = np.maximum(book.cdf_of(sid).log_cdf(grid), LOG_FLOOR).astype(np.float32)
        got = np.concatenate([book._blocks[c, :-1, slot] for c in range(book._blocks.shape[0])])
        np.testing.assert_allclose(got, want[:-1], rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(book._coarse[:, slot], want[:: grid.size // 128], rtol=1e-6)
