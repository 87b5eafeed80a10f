"""The admission experiments end to end (tiny grids): the rules against the max load, and
the predictive rules at multiples of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.sim import overload_experiments as oe
from loadtests.sim.overload_experiments import RULES
from tests.unit.sim_runs import PNG_MAGIC, read_csv, run_tiny

pytestmark = pytest.mark.slow


def test_admission_experiment_compares_rules_against_the_max_load(
    tmp_path: Path, tailbench_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A smaller grid than the shipped one (checked above): three loads, two window lengths.
    monkeypatch.setattr(oe, "ADMISSION_LOADS", (0.4, 0.7, 1.0))
    monkeypatch.setattr(oe, "WINDOW_FRACTIONS", (1 / 10, 1.0))
    md = run_tiny("admission", tmp_path, tailbench_dir, queries=3000, tol=0.3)
    folder = tmp_path / "admission"
    rows = read_csv(folder / "admission.csv")
    assert [(r["rule"], float(r["offered_load"])) for r in rows] == [
        (rule, load) for rule in RULES for load in (0.4, 0.7, 1.0)
    ]
    assert {r["seed"] for r in rows} == {"1"}
    for r in rows:
        if r["rule"] == "none":
            assert float(r["accepted_load"]) == pytest.approx(float(r["offered_load"]))
        assert float(r["accepted_load"]) <= float(r["offered_load"]) + 1e-9
    text = md.read_text(encoding="utf-8")
    assert "R_cth^U, the miss ratio without admission at that max load" in text
    assert "## Reject-all and the length of its window" in text
    assert "## How each rule admits" in text
    timeline = read_csv(folder / "admission_timeline.csv")
    assert {r["rule"] for r in timeline} == {"reject-all", "throttle"}
    assert all(int(r["admitted"]) <= int(r["offered"]) for r in timeline)
    for png in ("p99_vs_offered_load.png", "accepted_load.png"):
        assert (folder / png).read_bytes()[:8] == PNG_MAGIC


def test_predictive_admission_experiment_sweeps_multiples_of_the_max_load(
    tmp_path: Path, tailbench_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loadtests.sim import qlm_experiments as qe
    from loadtests.sim.qlm_experiments import PREDICTIVE_RULES

    # Two of the shipped multiples (the grid is checked above): under and far over the max.
    PREDICTIVE_MULTIPLES = (1.0, 3.0)
    monkeypatch.setattr(qe, "PREDICTIVE_MULTIPLES", PREDICTIVE_MULTIPLES)
    md = run_tiny("predictive-admission", tmp_path, tailbench_dir, queries=2400, tol=0.3)
    rows = read_csv(tmp_path / "predictive-admission" / "predictive_admission.csv")
    assert [(r["rule"], float(r["multiple"])) for r in rows] == [
        (rule, m) for rule in PREDICTIVE_RULES for m in PREDICTIVE_MULTIPLES
    ]
    for r in rows:
        assert float(r["accepted_load"]) <= float(r["offered_load"]) + 1e-9
        if r["rule"] == "none":
            assert int(r["admission_rejected"]) == 0
    top = [r for r in rows if r["rule"] == "predictive" and float(r["multiple"]) == 3.0]
    assert int(top[0]["admission_rejected"]) > 0  # at 3x the max load it turns queries away
    assert "target met" in md.read_text(encoding="utf-8")


def test_a_run_too_short_to_set_r_cth_u_is_refused_naming_what_to_do(
    tmp_path: Path, tailbench_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too few queries to measure the miss ratio at the max load: a message that says so
    and names --queries, not the admission config's own complaint about a nan threshold."""
    monkeypatch.setattr(oe, "ADMISSION_LOADS", (0.4, 1.0))
    monkeypatch.setattr(oe, "WINDOW_FRACTIONS", (1.0,))
    with pytest.raises(ValueError, match=r"R_cth\^U.*must be in \(0, 1\).*--queries"):
        run_tiny("admission", tmp_path / "new" / "out", tailbench_dir, queries=1500, tol=0.3)
    assert not (tmp_path / "new").exists()  # no folder it made is left, half-written
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError, match="--queries"):
        run_tiny("admission", tmp_path / "kept", tailbench_dir, queries=1500, tol=0.3)
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "admission").exists()
