"""Verdicts that rest on too few queries say UNJUDGED: on stdout, in the table, on figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import cli
from loadtests.sim.experiments import SCENARIO_DIR, RunSummary, runs_note
from loadtests.sim.report import TailStat
from tests.unit.sim_runs import read_csv

PNGS = ("max_load_vs_slo.png", "fanout_p99_at_max_load.png")


def png_description(path: Path) -> str:
    from PIL import Image

    with Image.open(path) as img:
        return str(img.info.get("Description", ""))


def test_a_tiny_experiment_says_its_verdicts_are_unjudged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "experiment", "fanout-single-class", "--apps", "masstree"]
    argv += ["--queries", "3000", "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    # 3,000 queries hold about 27 of fanout 100: 0 beyond their p99, 10 needed.
    note = next(line for line in out.splitlines() if "UNJUDGED" in line)
    assert note.startswith("**UNJUDGED probes in 8 of 8 searches")
    assert "class I k=100 had 0 < 10 queries beyond its p99" in note
    # The gain column reports no finding, not a reversed one.
    head = next(line for line in out.splitlines() if line.endswith("| TF-EDFQ vs FIFO |"))
    lines = out.splitlines()
    rows = lines[lines.index(head) + 2 : lines.index(head) + 6]  # one per SLO of masstree
    assert all(row.startswith("| masstree |") for row in rows)
    assert all(row.endswith("| unjudged |") for row in rows), rows
    folder = tmp_path / "fanout-single-class"
    assert all(int(r["unjudged_probes"]) > 0 for r in read_csv(folder / "maxload.csv"))
    for png in PNGS:
        assert png_description(folder / png).startswith("UNJUDGED probes in 8 of 8"), png


def test_sim_run_names_the_thin_group(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(SCENARIO_DIR / "fanout-single-class.toml")
    assert cli.main(["sim", "run", scenario, "--load", "0.05", "--queries", "2000"]) == 3
    out = capsys.readouterr().out
    assert "no verdict: UNJUDGED: class I k=" in out
    assert "class I k=100 had 0 < 10 queries beyond its p99" in out


def summary(samples: int) -> RunSummary:
    stat = TailStat(latency_ms=1.0, slo_ms=2.0, samples=samples, enough=samples >= 1000)
    return RunSummary(0.5, stat.enough, {"A": stat}, {"A": {"10": stat}}, {"A": 99.0})


def test_runs_note_is_empty_only_when_every_group_was_judged() -> None:
    assert runs_note([summary(5000), summary(1000)]) == ""
    note = runs_note([summary(5000), summary(500)])
    assert note.startswith("UNJUDGED groups in 1 of 2 runs")
    assert "class A had 5 < 10 queries beyond its p99 (500 queries, 1,000 needed)" in note
