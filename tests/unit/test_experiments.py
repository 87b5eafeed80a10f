"""The named experiments run end to end (tiny settings) and the shipped scenarios load."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from loadtests.sim import overload_experiments as oe
from loadtests.sim.experiments import SINGLE_CLASS_SLOS_MS
from loadtests.sim.overload_experiments import ADMISSION_LOADS, RULES
from loadtests.sim.pool import load_pool_scenario
from loadtests.sim.progress import ProgressBar
from loadtests.sim.registry import EXPERIMENTS
from loadtests.sim.scenario import load_scenario
from tests.unit.sim_runs import PNG_MAGIC, read_csv, run_tiny

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "loadtests" / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_loads(path: Path) -> None:
    exp = EXPERIMENTS.get(path.stem)
    scn = load_pool_scenario(path) if exp is not None and exp.pool else load_scenario(path)
    assert scn.name == path.stem
    assert scn.service.kind == "quantiles"


def test_every_experiment_has_its_scenario() -> None:
    with_scenario = {n for n, e in EXPERIMENTS.items() if not e.pipeline}  # pard-*: a spec
    assert {p.stem for p in SCENARIOS} >= with_scenario
    for exp in EXPERIMENTS.values():
        assert exp.pipeline or exp.scenario_path.is_file()
        assert exp.title


def test_fanout_single_class_writes_tables_and_plots(tmp_path: Path, tailbench_dir: Path) -> None:
    # 120,000 queries: 1,027 of fanout 100 after the warm-up, just enough to judge their p99.
    md = run_tiny(
        "fanout-single-class", tmp_path, tailbench_dir, apps=["masstree"], queries=120_000, tol=0.3
    )
    folder = tmp_path / "fanout-single-class"
    assert md == folder / "fanout-single-class.md"

    slos = SINGLE_CLASS_SLOS_MS["masstree"]
    rows = read_csv(folder / "maxload.csv")
    assert [(r["slo_ms"], r["policy"]) for r in rows] == [
        (str(s), p) for s in slos for p in ("fifo", "tf-edfq")
    ]
    for r in rows:
        assert r["app"] == "masstree"
        assert 0.0 <= float(r["max_load"]) <= 1.0
        assert float(r["bracket_lo"]) <= float(r["bracket_hi"])
        assert r["queries"] == "120000"

    tails = read_csv(folder / "tails_at_max_load.csv")
    # Per search: the class as a whole and its three fanout types.
    assert len(tails) == 4 * len(rows)
    assert {r["fanout_type"] for r in tails} == {"all", "1", "10", "100"}
    assert all(int(r["samples"]) > 0 for r in tails)
    probes = read_csv(folder / "probes.csv")
    assert len(probes) == sum(int(r["runs"]) for r in rows)

    text = md.read_text(encoding="utf-8")
    assert "## Max load per SLO" in text
    assert "120,000" in text  # queries per simulation
    for s in slos:
        assert f"| masstree | {s} |" in text
    for png in ("max_load_vs_slo.png", "fanout_p99_at_max_load.png"):
        assert (folder / png).read_bytes()[:8] == PNG_MAGIC


def test_too_few_queries_are_never_called_met(tmp_path: Path, tailbench_dir: Path) -> None:
    """3,000 queries hold 27 of fanout 100: their p99 cannot be judged, so no load passes."""
    md = run_tiny("fanout-single-class", tmp_path, tailbench_dir, apps=["masstree"])
    rows = read_csv(tmp_path / "fanout-single-class" / "maxload.csv")
    assert rows and all(float(r["max_load"]) == 0.0 for r in rows)
    assert all(int(r["unjudged_probes"]) > 0 for r in rows)
    text = md.read_text(encoding="utf-8")
    assert "UNJUDGED" in text and "k=100" in text


def test_default_queries_give_the_rarest_group_ten_thousand_samples() -> None:
    from loadtests.sim.experiments import default_queries, rarest_share

    scenarios = {p.stem: p for p in SCENARIOS}
    single = load_scenario(scenarios["fanout-single-class"])
    assert rarest_share(single) == pytest.approx(1 / 111)
    assert default_queries(single) * (1 / 111) * (1 - single.run.warmup) >= 10_000
    fixed = load_scenario(scenarios["fixed-fanout-two-classes"])
    assert rarest_share(fixed) == pytest.approx(0.5)
    assert default_queries(fixed) == 21_895  # (10,000 + 4 sd) / (0.5 x 0.95)


def test_mixed_fanout_reports_max_load_per_class(tmp_path: Path, tailbench_dir: Path) -> None:
    run_tiny(
        "mixed-fanout-four-classes", tmp_path, tailbench_dir, queries=200, tol=0.3, budget=False
    )
    folder = tmp_path / "mixed-fanout-four-classes"
    rows = read_csv(folder / "maxload.csv")
    assert {r["policy"] for r in rows} == {"fifo", "priq", "t-edfq", "tf-edfq"}
    assert {r["group"] for r in rows} == {"I", "II", "III", "IV", "all"}
    for pol in ("fifo", "priq", "t-edfq", "tf-edfq"):
        mine = {r["group"]: float(r["max_load"]) for r in rows if r["policy"] == pol}
        # All classes together can carry no more than the weakest class.
        assert mine["all"] <= min(v for g, v in mine.items() if g != "all")
    assert (folder / "max_load_per_class.png").read_bytes()[:8] == PNG_MAGIC
    assert "## Max load per class" in (folder / "mixed-fanout-four-classes.md").read_text()


@pytest.mark.parametrize(
    ("name", "files"),
    [
        ("fanout-two-classes", ["maxload.csv", "tails_at_max_load.csv", "max_load.png"]),
        ("fixed-fanout-two-classes", ["maxload.csv", "p99_vs_load.csv", "p99_vs_load.png"]),
    ],
)
def test_two_class_experiments_write_their_files(
    name: str, files: list[str], tmp_path: Path, tailbench_dir: Path
) -> None:
    run_tiny(name, tmp_path, tailbench_dir, queries=200, apps=["masstree"], tol=0.3)
    folder = tmp_path / name
    for f in files:
        assert (folder / f).stat().st_size > 0
    rows = read_csv(folder / "maxload.csv")
    # The budget-adjusted TF-EDFQ search comes as one more column.
    assert [(r["policy"], r["budget_adjust"]) for r in rows][-1] == ("tf-edfq", "True")
    assert "TF-EDFQ+budget" in (folder / f"{name}.md").read_text(encoding="utf-8")


def test_the_shipped_admission_grids_span_the_loads_the_reports_describe() -> None:
    from loadtests.sim.qlm_experiments import PREDICTIVE_MULTIPLES, PREDICTIVE_RULES

    assert ADMISSION_LOADS == (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert oe.WINDOW_FRACTIONS[-1] == 1.0 and len(oe.WINDOW_FRACTIONS) == 4
    assert len(RULES) == 6 and RULES[0].value == "none"
    assert PREDICTIVE_MULTIPLES == (0.5, 1.0, 1.5, 2.0, 3.0)
    assert PREDICTIVE_RULES[0] == "none" and "predictive+throttle" in PREDICTIVE_RULES


def test_autoscale_experiment_reports_phases_and_actions(
    tmp_path: Path, tailbench_dir: Path
) -> None:
    md = run_tiny("autoscale", tmp_path, tailbench_dir, queries=6000)
    folder = tmp_path / "autoscale"
    timeline = read_csv(folder / "timeline.csv")
    assert {r["autoscaling"] for r in timeline} == {"off", "on"}
    actions = read_csv(folder / "actions.csv")
    assert all(r["reason"] in ("above_upper", "below_lower") for r in actions)
    text = md.read_text(encoding="utf-8")
    assert "## Per phase" in text and "| on | 3 |" in text
    assert (folder / "miss_ratio_and_speed.png").read_bytes()[:8] == PNG_MAGIC


def test_swayam_experiment_compares_with_the_threshold_autoscaler(
    tmp_path: Path, tailbench_dir: Path
) -> None:
    md = run_tiny("swayam", tmp_path, tailbench_dir)
    folder = tmp_path / "swayam"
    rows = read_csv(folder / "backends_over_time.csv")
    assert {r["policy"] for r in rows} == {"swayam", "threshold"}
    text = md.read_text(encoding="utf-8")
    assert "| swayam |" in text and "| threshold |" in text and "backend-seconds" in text
    assert (folder / "backends_over_time.png").read_bytes()[:8] == PNG_MAGIC


def test_missing_data_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nowhere/masstree_quantiles\.txt"):
        run_tiny("fanout-single-class", tmp_path, tmp_path / "nowhere", apps=["masstree"])


def test_unknown_app_or_experiment_is_refused(tmp_path: Path, tailbench_dir: Path) -> None:
    with pytest.raises(ValueError, match="memcached"):
        run_tiny("fanout-single-class", tmp_path, tailbench_dir, apps=["memcached"])
    with pytest.raises(ValueError, match="runs only masstree"):
        run_tiny("mixed-fanout-four-classes", tmp_path, tailbench_dir, apps=["shore"])
    with pytest.raises(ValueError, match="unknown 'nope'"):
        run_tiny("nope", tmp_path, tailbench_dir)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_bar_prints_a_line_per_tenth_off_a_terminal() -> None:
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(20, "exp", stream=out, clock=clock)
    for _ in range(20):
        clock.now += 1.0
        bar.advance()
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # 0%, 10%, ..., 100%
    assert lines[5].startswith("exp [###############...............] 10/20")
    assert "elapsed 0:10 eta 0:10" in lines[5]
    assert "20/20 100%" in lines[-1]


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = ProgressBar(3, stream=out, clock=FakeClock())
    bar.advance()
    bar.advance(5)  # clamped to the total
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("3/3 100% elapsed 0:00 eta 0:00\n")
