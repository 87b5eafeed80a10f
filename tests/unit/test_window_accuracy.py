"""loadtests.window_accuracy: what a CDF window of n samples costs x_p^u, and a row's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.cdf import CdfBook
from loadtests import window_accuracy


def test_row_bytes_are_what_a_busy_row_holds() -> None:
    book = CdfBook(window_size=1024, refresh_every=64)
    book.add_server("a", np.random.default_rng(1).lognormal(0.0, 0.5, 1024))
    book.observe_many("a", np.random.default_rng(2).lognormal(0.0, 0.5, 64).tolist())
    row = book._row_of("a")
    slot = book._coarse[:, row.slot].nbytes + book._blocks[:, :, row.slot].nbytes
    assert window_accuracy.row_bytes(1024) == row.window.nbytes + row.sorted.nbytes + slot


def test_errors_are_small_where_the_window_sees_the_quantile() -> None:
    # k = 1 at p99: the window's 99th percentile, which 4,096 samples hold ~41 of the
    # samples above; the seeds fix the draws, so the figures are fixed too.
    errs = window_accuracy.errors("xapian", [512, 4096], [1, 10], seeds=8)
    assert set(errs) == {(512, 1), (512, 10), (4096, 1), (4096, 10)}
    assert all(e.shape == (8,) and np.isfinite(e).all() for e in errs.values())
    assert np.abs(errs[4096, 1]).max() < 0.05
    assert np.abs(errs[4096, 1]).mean() < np.abs(errs[512, 1]).mean()


def test_main_prints_a_table_per_app_and_refuses_bad_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    window_accuracy.main(["--windows", "512,1024", "--fanouts", "1,10", "--seeds", "2"])
    out = capsys.readouterr().out
    for app in ("masstree", "shore", "xapian"):
        assert f"\n{app}\n" in out
    assert out.count("\n    512     21.0") == 3 and out.count("\n   1024     25.0") == 3
    for bad in (["--windows", "50"], ["--fanouts", "x"], ["--apps", "nginx"]):
        with pytest.raises(SystemExit) as exited:
            window_accuracy.main(bad)
        assert exited.value.code == 2
    assert "no shipped Tailbench table 'nginx'" in capsys.readouterr().err
