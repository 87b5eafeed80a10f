"""Service-time distributions: means, scaling, quantile files and their tail."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from taskserver.service_time import (
    ConstantServiceTime,
    ExponentialServiceTime,
    LognormalServiceTime,
    QuantileFileServiceTime,
    ServiceSpec,
    make_distribution,
)

N_SAMPLES = 50_000


def empirical_mean(dist, seed: int = 7) -> float:
    rng = random.Random(seed)
    return math.fsum(dist.sample_ms(rng) for _ in range(N_SAMPLES)) / N_SAMPLES


@pytest.mark.parametrize(
    "dist",
    [
        ConstantServiceTime(2.5),
        ExponentialServiceTime(3.0),
        LognormalServiceTime(median_ms=1.0, sigma=0.5),
        QuantileFileServiceTime([1.0, 2.0, 3.0, 5.0, 8.0]),
    ],
    ids=repr,
)
def test_empirical_mean_matches_mean_ms(dist):
    assert empirical_mean(dist) == pytest.approx(dist.mean_ms, rel=0.03)


@pytest.mark.parametrize(
    "dist",
    [
        ExponentialServiceTime(3.0),
        LognormalServiceTime(median_ms=1.0, sigma=0.5),
        QuantileFileServiceTime([1.0, 2.0, 3.0, 5.0, 8.0]),
    ],
    ids=repr,
)
def test_quantile_sampling_matches_mean_ms(dist):
    rng = random.Random(3)
    mean = math.fsum(dist.quantile(rng.random()) for _ in range(N_SAMPLES)) / N_SAMPLES
    assert mean == pytest.approx(dist.mean_ms, rel=0.03)


def test_lognormal_mean_and_median():
    dist = LognormalServiceTime(median_ms=2.0, sigma=0.8)
    assert dist.mean_ms == pytest.approx(2.0 * math.exp(0.32))
    assert dist.quantile(0.5) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("make", "unscaled"),
    [
        (lambda s: ConstantServiceTime(2.0, scale=s), 2.0),
        (lambda s: ExponentialServiceTime(3.0, scale=s), 3.0),
        (lambda s: LognormalServiceTime(1.0, 0.5, scale=s), math.exp(0.125)),
    ],
)
def test_scale_multiplies_mean_quantiles_and_samples(make, unscaled):
    base, scaled = make(1.0), make(2.5)
    assert scaled.mean_ms == pytest.approx(2.5 * unscaled)
    assert scaled.quantile(0.9) == pytest.approx(2.5 * base.quantile(0.9))
    sample = base.sample_ms(random.Random(1))
    assert scaled.sample_ms(random.Random(1)) == pytest.approx(2.5 * sample)


def test_quantiles_are_the_midpoint_prior():
    dist = ExponentialServiceTime(1.0)
    expected = [-math.log(1 - p) for p in (0.125, 0.375, 0.625, 0.875)]
    assert dist.quantiles(4) == pytest.approx(expected)
    with pytest.raises(ValueError, match="n"):
        dist.quantiles(0)


def test_quantile_rejects_u_outside_unit_interval():
    with pytest.raises(ValueError, match="u"):
        ExponentialServiceTime(1.0).quantile(1.0)
    with pytest.raises(ValueError, match="u"):
        QuantileFileServiceTime([1.0]).quantile(-0.1)


def test_quantile_file_interpolates_between_neighbours():
    dist = QuantileFileServiceTime([1.0, 2.0, 4.0, 8.0])  # at p = 0, .25, .5, .75
    assert dist.quantile(0.0) == 1.0
    assert dist.quantile(0.125) == pytest.approx(1.5)
    assert dist.quantile(0.5) == pytest.approx(4.0)
    assert dist.quantile(0.625) == pytest.approx(6.0)
    assert dist.quantile(0.75) == pytest.approx(8.0)


def test_cdf_inverts_quantile():
    dist = QuantileFileServiceTime([1.0, 2.0, 4.0, 8.0, 9.0], scale=2.0)
    for u in (0.0, 0.1, 0.37, 0.5, 0.79, 0.8, 0.9, 0.999):
        assert dist.cdf(dist.quantile(u)) == pytest.approx(u)
    assert dist.cdf(1.0) == 0.0


def test_masstree_mean_matches_readme(tailbench_dir: Path):
    dist = QuantileFileServiceTime.from_file(tailbench_dir / "masstree_quantiles.txt")
    assert len(dist) == 10_000
    assert dist.mean_ms == pytest.approx(0.176, rel=0.03)
    assert empirical_mean(dist) == pytest.approx(0.176, rel=0.03)


def test_masstree_tail_extends_beyond_the_last_quantile(tailbench_dir: Path):
    dist = QuantileFileServiceTime.from_file(tailbench_dir / "masstree_quantiles.txt")
    last = dist.quantile(0.9999)
    assert last == pytest.approx(0.4811)
    assert dist.tail_mean_ms > 0
    above = [dist.quantile(u) for u in (0.99991, 0.99995, 0.999999)]
    assert last < above[0] < above[1] < above[2]
    # Exponential tail: the conditional median excess is theta * ln 2.
    assert dist.quantile(0.99995) - last == pytest.approx(dist.tail_mean_ms * math.log(2))


def test_quantile_file_scale(tailbench_dir: Path):
    path = tailbench_dir / "masstree_quantiles.txt"
    base = QuantileFileServiceTime.from_file(path)
    scaled = QuantileFileServiceTime.from_file(path, scale=3.0)
    assert scaled.mean_ms == pytest.approx(3 * base.mean_ms)
    assert scaled.quantile(0.99995) == pytest.approx(3 * base.quantile(0.99995))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "q.txt"
    path.write_text(text)
    return path


def test_quantile_file_ignores_blank_lines(tmp_path: Path):
    dist = QuantileFileServiceTime.from_file(write(tmp_path, "1.0\n\n2.0\n  \n3.0\n"))
    assert len(dist) == 3
    assert dist.source == str(tmp_path / "q.txt")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1.0\n2.0\nabc\n", r"q\.txt:3: not a number: 'abc'"),
        ("1.0\n\n3.0\n2.0\n", r"q\.txt:4: 2\.0 is below the previous quantile 3\.0"),
        ("1.0\n-2\n", r"q\.txt:2: must be a finite number >= 0"),
        ("1.0\nnan\n", r"q\.txt:2: must be a finite number >= 0"),
        ("\n\n", r"q\.txt: no quantiles"),
    ],
)
def test_quantile_file_errors_name_file_and_line(tmp_path: Path, text: str, match: str):
    with pytest.raises(ValueError, match=match):
        QuantileFileServiceTime.from_file(write(tmp_path, text))


def test_quantile_sequence_errors():
    with pytest.raises(ValueError, match="no quantiles"):
        QuantileFileServiceTime([])
    with pytest.raises(ValueError, match=r"quantiles_ms\[1\]"):
        QuantileFileServiceTime([2.0, 1.0])


@pytest.mark.parametrize(
    ("spec", "kind", "mean_ms"),
    [
        (ServiceSpec("constant", value_ms=2.0), ConstantServiceTime, 2.0),
        (ServiceSpec("exponential", mean_ms=3.0, scale=2.0), ExponentialServiceTime, 6.0),
        (ServiceSpec("lognormal", median_ms=1.0, sigma=0.5), LognormalServiceTime, math.exp(0.125)),
        (ServiceSpec("lognormal", mean_ms=4.0, sigma=0.5), LognormalServiceTime, 4.0),
    ],
)
def test_make_distribution(spec, kind, mean_ms):
    dist = make_distribution(spec)
    assert isinstance(dist, kind)
    assert dist.mean_ms == pytest.approx(mean_ms)


def test_make_distribution_from_quantile_file(tailbench_dir: Path):
    path = str(tailbench_dir / "shore_quantiles.txt")
    dist = make_distribution(ServiceSpec("quantiles", path=path))
    assert isinstance(dist, QuantileFileServiceTime)
    assert dist.mean_ms == pytest.approx(0.341, rel=0.03)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (ServiceSpec("exponential", mean_ms=-1), r"service\.mean_ms: must be > 0, got -1"),
        (ServiceSpec("exponential"), r"service\.mean_ms: required for kind 'exponential'"),
        (ServiceSpec("constant", value_ms=-0.5), r"service\.value_ms: must be >= 0, got -0\.5"),
        (ServiceSpec("lognormal", median_ms=1.0), r"service\.sigma: required"),
        (ServiceSpec("lognormal", sigma=1.0), r"service\.median_ms: required"),
        (ServiceSpec("lognormal", median_ms=0, sigma=1.0), r"service\.median_ms: must be > 0"),
        (ServiceSpec("exponential", mean_ms=1.0, scale=0), r"service\.scale: must be > 0, got 0"),
        (ServiceSpec("exponential", mean_ms="1"), r"service\.mean_ms: must be a finite number"),
        (ServiceSpec("quantiles"), r"service\.path: required"),
        (ServiceSpec("quantiles", path="/nonexistent/q.txt"), r"service\.path: cannot read"),
        (ServiceSpec("gamma", mean_ms=1.0), r"service\.kind: unknown 'gamma'.*'exponential'"),
    ],
)
def test_make_distribution_errors_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        make_distribution(spec)


# The paper's Table II, x_99^u(k) in ms: the Monte-Carlo figures of the authors' simulator.
TABLE_II = {
    "masstree": {1: 0.212, 10: 0.247, 100: 0.473, 1000: 1.041},
    "shore": {1: 2.117, 10: 2.721, 100: 2.829, 1000: 6.019},
    "xapian": {1: 2.592, 10: 2.998, 100: 3.307, 1000: 7.149},
}


@pytest.mark.parametrize("app", sorted(TABLE_II))
def test_the_paper_tail_is_the_default_and_gives_table_ii(tailbench_dir: Path, app: str):
    dist = QuantileFileServiceTime.from_file(tailbench_dir / f"{app}_quantiles.txt")
    assert dist.tail == "paper"
    assert dist.tail_mean_ms == pytest.approx(dist.quantile(0.9999) / 2)  # last quantile / 2
    # x_99^u(1000) lies in the tail, 2.3 tail means beyond the last quantile: within 1%
    # of the paper's simulated figure (k = 1..100 lie inside the table).
    exact = dist.quantile(0.99 ** (1 / 1000))
    assert exact == pytest.approx(TABLE_II[app][1000], rel=0.01)
    shipped = (tailbench_dir / f"{app}_unloaded_p99_by_fanout.txt").read_text().split()
    assert exact == pytest.approx(float(shipped[999]), rel=0.01)


def test_the_fitted_tail_stays_a_named_option(tailbench_dir: Path):
    path = tailbench_dir / "masstree_quantiles.txt"
    fitted = QuantileFileServiceTime.from_file(path, tail="fitted")
    paper = QuantileFileServiceTime.from_file(path)
    assert fitted.tail_mean_ms == pytest.approx(0.0175, rel=0.01)
    assert paper.tail_mean_ms / fitted.tail_mean_ms > 13  # 14 times heavier
    # Same mean to 0.1%, very different fanout tails.
    assert fitted.mean_ms == pytest.approx(paper.mean_ms, rel=1e-3)
    assert paper.quantile(0.99 ** (1 / 1000)) / fitted.quantile(0.99 ** (1 / 1000)) > 1.9
    assert make_distribution(ServiceSpec(kind="quantiles", path=str(path), tail="fitted")).tail == (
        "fitted"
    )
    with pytest.raises(ValueError, match=r"service\.tail: must be one of paper, fitted, got 'x'"):
        make_distribution(ServiceSpec(kind="quantiles", path=str(path), tail="x"))
