"""The named experiments run end to end (tiny settings) and the shipped scenarios load."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from loadtests.sim import overload_experiments as oe
from loadtests.sim.experiments import SINGLE_CLASS_SLOS_MS
from loadtests.sim.overload_experiments import ADMISSION_LOADS, RULES
from loadtests.sim.pool import load_pool_scenario
from loadtests.sim.progress import ProgressBar
from loadtests.sim.registry import EXPERIMENTS, run_experiment
from loadtests.sim.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "loadtests" / "scenarios").glob("*.toml"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_tiny(name: str, out: Path, data_dir: Path, **kw: object) -> Path:
    """Run an experiment with few queries, a coarse bisection, one seed and no workers."""
    kw = {"queries": 3000, "tol": 0.2, "workers": 1, "quiet": True, "seeds": 1, **kw}
    return run_experiment(name, out, data_dir=str(data_dir), **kw)  # type: ignore[arg-type]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


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


# --- PARD pipeline experiments (pard-traffic, pard-live, pard-ga, pard-dag) ----------------

PARD_POLICIES = ["none", "nexus", "clipper++", "pard"]
PARD_ABLATIONS = ["back", "sf", "oc", "split", "wcl", "lower", "upper", "fcfs", "hbf-only"]
PARD_ABLATIONS += ["lbf-only", "instant-switch"]  # Table 1's ten in its order, then one more


def test_every_pipeline_experiment_has_its_spec_and_profile() -> None:
    from onnx_models.spec import PIPELINES_DIR

    pipelines = {p for e in EXPERIMENTS.values() if e.pipeline for p in e.pipeline.split(",")}
    assert pipelines - {"*"} == {"traffic", "live", "ga", "dag", "dag_dynamic"}
    for name in pipelines - {"*"}:
        assert (PIPELINES_DIR / f"{name}.json").is_file()
        assert (PIPELINES_DIR / f"{name}.profile.json").is_file()


@pytest.mark.parametrize(
    ("pipeline", "slo_ms"),
    [("traffic", 400), ("live", 500), ("ga", 600), ("dag", 420), ("dag_dynamic", 420)],
)
def test_pipeline_experiments_run_under_the_papers_slos(pipeline: str, slo_ms: float) -> None:
    from loadtests.sim.pard_experiments import plan_setup
    from onnx_models.spec import PIPELINES_DIR

    setup = plan_setup(
        PIPELINES_DIR / f"{pipeline}.json", PIPELINES_DIR / f"{pipeline}.profile.json", 1000
    )
    # PARD §5.1's SLOs, feasible on the shipped profiles (not raised to the floor).
    assert setup.slo_s == setup.spec_slo_s == pytest.approx(slo_ms / 1000)
    assert setup.pipeline == pipeline


@pytest.mark.parametrize(
    "name", ["pard-traffic", "pard-live", "pard-ga", "pard-dag", "pard-dag_dynamic"]
)
def test_pard_experiment_writes_tables_and_plots(name: str, tmp_path: Path) -> None:
    md = run_experiment(name, tmp_path, queries=100, apps=["spiky"], workers=1, quiet=True, seeds=1)
    folder = tmp_path / name
    assert md == folder / f"{name}.md"
    rows = read_csv(folder / "summary.csv")
    assert [(r["trace"], r["policy"]) for r in rows] == [
        ("spiky", p) for p in PARD_POLICIES + PARD_ABLATIONS
    ]
    modules = read_csv(folder / "modules.csv")
    for r in rows:
        arrived = int(r["arrived"])
        assert arrived > 0 and int(r["on_time"]) + int(r["late"]) + int(r["dropped"]) == arrived
        assert 0.0 <= float(r["drop_rate"]) <= 1.0 and 0.0 <= float(r["invalid_rate"]) <= 1.0
        drops = sum(int(r[f"drops_{m['module_id']}"]) for m in modules)
        assert drops == int(r["dropped"])
    assert rows[0]["dropped"] == "0"  # no dropping: only late completions
    by_module = read_csv(folder / "drops_by_module.csv")
    assert len(by_module) == len(rows) * len(modules)
    timeline = read_csv(folder / "goodput_over_time.csv")
    assert {(r["trace"], r["policy"]) for r in timeline} == {
        (r["trace"], r["policy"]) for r in rows
    }
    text = md.read_text(encoding="utf-8")
    assert "## Setup" in text and "## Goodput, drop rate, invalid rate" in text
    assert "| spiky | **PARD** |" in text and "| spiky | Nexus |" in text
    assert "| spiky | instant-switch |" in text
    assert "| spiky | wcl | PARD-WCL |" in text and "| oc | PARD-oc |" in text
    assert "workers scaled at run time" in text and "## Against the paper's targets" in text
    assert "## Transient drop rate against the window size" in text
    targets = read_csv(folder / "targets.csv")
    assert [(r["trace"], r["seed"]) for r in targets] == [("spiky", "1")]
    transient = read_csv(folder / "transient.csv")
    assert {(r["policy"], r["window_s"]) for r in transient} == {
        (p, str(w)) for p in PARD_POLICIES for w in (1, 2, 5, 10, 30, 60)
    }
    per_second = read_csv(folder / "per_second.csv")
    assert sum(int(r["arrived_per_s"]) for r in per_second if r["policy"] == "pard") == int(
        rows[3]["arrived"]
    )
    # PARD's HBF/LBF state each second, for the policies whose queues adapt (§4.3) only:
    # PARD and the ablations that change its estimate, not the ones that fix its order.
    priority = read_csv(folder / "priority_per_second.csv")
    fixed_order = {"none", "nexus", "clipper++", "fcfs", "hbf-only", "lbf-only"}
    assert {r["policy"] for r in priority} == {r["policy"] for r in rows} - fixed_order
    assert {r["module_id"] for r in priority} == {m["module_id"] for m in modules}
    shares = [float(r["hbf_share"]) for r in priority if r["hbf_share"] != "nan"]
    assert shares and all(0.0 <= x <= 1.0 for x in shares)
    ranking = read_csv(folder / "ablation_ranking.csv")
    assert [r["variant"] for r in ranking] == PARD_ABLATIONS
    for png in (
        "goodput_over_time.png",
        "drop_and_invalid_rates.png",
        "drops_by_module.png",
        "ablations.png",
        "transient.png",
        "workers_over_time.png",
    ):
        assert (folder / png).read_bytes()[:8] == PNG_MAGIC


def test_pard_experiment_on_seeds_and_with_fixed_workers(tmp_path: Path) -> None:
    md = run_experiment(
        "pard-traffic",
        tmp_path,
        queries=300,
        apps=["bursty"],
        workers=1,
        quiet=True,
        seeds=2,
        scaling=False,
    )
    text = md.read_text(encoding="utf-8")
    assert "workers fixed (no run-time scaling); 2 seed(s)" in text
    assert "--fixed-workers --seeds 2" in text
    rows = read_csv(tmp_path / "pard-traffic" / "summary.csv")
    main = [(r["policy"], r["seed"]) for r in rows if r["policy"] in PARD_POLICIES]
    assert sorted(main) == sorted((p, s) for p in PARD_POLICIES for s in ("1", "2"))
    ablations = [r["seed"] for r in rows if r["policy"] not in PARD_POLICIES]
    assert ablations == ["1"] * len(PARD_ABLATIONS)  # the ablations run on the first seed
    capacity = {r["capacity_per_s"] for r in read_csv(tmp_path / "pard-traffic" / "per_second.csv")}
    assert len(capacity) == 1  # fixed workers: one capacity throughout
    targets = read_csv(tmp_path / "pard-traffic" / "targets.csv")
    assert [r["seed"] for r in targets] == ["1", "2"]


def test_pard_all_runs_the_twelve_workloads_and_ranks_the_ablations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loadtests.sim.pard_experiments as pe

    monkeypatch.setattr(pe, "PIPELINE_NAMES", ("traffic", "dag"))  # two of the four: faster
    monkeypatch.setattr(pe, "ABLATIONS", ("back", "lbf-only"))  # and two ablations
    md = run_experiment(
        "pard-all", tmp_path, queries=100, apps=["bursty"], workers=1, quiet=True, seeds=1
    )
    folder = tmp_path / "pard-all"
    targets = read_csv(folder / "targets.csv")
    assert [(r["pipeline"], r["trace"]) for r in targets] == [
        (p, "bursty") for p in ("traffic", "dag")
    ]
    for p in ("traffic", "dag"):
        assert (folder / p / "summary.csv").is_file() and (folder / p / f"{p}.md").is_file()
    ranking = read_csv(folder / "ablation_ranking.csv")
    assert [(r["pipeline"], r["variant"]) for r in ranking] == [
        (p, v) for p in ("traffic", "dag") for v in ("back", "lbf-only")
    ]
    text = md.read_text(encoding="utf-8")
    assert "## Against the paper's targets, 2 workloads" in text
    assert "## Average drop rate and invalid rate (PARD Figure 8)" in text
    assert "## Worst windows (PARD Figures 2 and 9)" in text
    assert "## Ablations (PARD §5.3)" in text and "| lbf-only | PARD-LBF |" in text


def test_pard_sensitivity_varies_the_slo_lambda_and_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loadtests.sim.pard_experiments as pe

    # fewer values than the experiment's (faster); the shipped grids are checked below
    assert pe.SLO_SCALES == (0.8, 1.0, 1.2) and pe.LAMBDAS[2] == 0.1
    assert 5.0 in pe.QUEUE_WINDOWS_S
    SLO_SCALES, LAMBDAS, QUEUE_WINDOWS_S = (0.8, 1.0), (0.1, 0.5), (20.0,)
    monkeypatch.setattr(pe, "SLO_SCALES", SLO_SCALES)
    monkeypatch.setattr(pe, "LAMBDAS", LAMBDAS)
    monkeypatch.setattr(pe, "QUEUE_WINDOWS_S", QUEUE_WINDOWS_S)
    md = run_experiment("pard-sensitivity", tmp_path, queries=200, workers=1, quiet=True, seeds=1)
    rows = read_csv(tmp_path / "pard-sensitivity" / "sensitivity.csv")
    for pipeline in ("traffic", "live"):
        mine = [r for r in rows if r["pipeline"] == pipeline]
        slo = {(float(r["value"]), r["policy"]) for r in mine if r["knob"] == "slo"}
        assert slo == {(x, p) for x in SLO_SCALES for p in PARD_POLICIES}
        lam = [float(r["value"]) for r in mine if r["knob"] == "lambda"]
        assert lam == list(LAMBDAS)
        window = [float(r["value"]) for r in mine if r["knob"] == "window"]
        assert window == list(QUEUE_WINDOWS_S)
        # the same trace whatever the SLO: as many requests under each
        assert len({r["arrived"] for r in mine}) == 1
    text = md.read_text(encoding="utf-8")
    assert "| traffic | bursty | 0.8x (320 ms) | pard |" in text
    assert "| live | bursty | lambda | 0.1 |" in text and "| live | bursty | window | 20 |" in text


def test_pard_experiment_without_a_profile_says_how_to_make_one(tmp_path: Path) -> None:
    import json

    from onnx_models.spec import PIPELINES_DIR

    spec = json.loads((PIPELINES_DIR / "traffic.json").read_text(encoding="utf-8"))
    for m in spec["modules"]:
        m["model"] = str((PIPELINES_DIR / m["model"]).resolve())
    (tmp_path / "traffic.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match=r"no profile of pipeline 'traffic'.*onnx_models profile"):
        run_experiment("pard-traffic", tmp_path / "out", data_dir=tmp_path, quiet=True)
    assert not (tmp_path / "out").exists()


def test_pard_experiment_refuses_an_unknown_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runs the traces periodic, bursty, spiky, got wiki"):
        run_experiment("pard-dag", tmp_path, apps=["wiki"], quiet=True)


def test_wait_estimator_experiment_compares_both_estimates(
    tmp_path: Path, tailbench_dir: Path
) -> None:
    md = run_tiny("wait-estimator", tmp_path, tailbench_dir, queries=800)
    rows = read_csv(tmp_path / "wait-estimator" / "wait_estimator.csv")
    assert {(r["policy"], r["estimate"]) for r in rows} == {
        (p, e) for p in ("fifo", "tf-edfq") for e in ("qlm", "overtaking")
    }
    for r in rows:
        assert int(r["n"]) > 0 and -1.0 < float(r["r2"]) <= 1.0
        if r["policy"] == "fifo":  # nothing overtakes under FIFO: the two estimates agree
            twin = next(
                o for o in rows
                if (o["policy"], o["load"], o["class"], o["estimate"])
                == ("fifo", r["load"], r["class"], "qlm")
            )  # fmt: skip
            assert r["mean_est"] == twin["mean_est"]
    text = md.read_text(encoding="utf-8")
    assert "## By queue position (QLM Fig. 3's view)" in text
    assert "## By number of request groups queued ahead" in text
    png = tmp_path / "wait-estimator" / "wait_by_position.png"
    assert png.read_bytes()[:8] == PNG_MAGIC


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


def test_least_wait_experiment_searches_both_picks(tmp_path: Path, tailbench_dir: Path) -> None:
    md = run_tiny("least-wait", tmp_path, tailbench_dir, queries=600, tol=0.3)
    rows = read_csv(tmp_path / "least-wait" / "least_wait.csv")
    assert {(r["policy"], r["pick"]) for r in rows} == {
        (p, k) for p in ("fifo", "tf-edfq") for k in ("random", "least-wait")
    }
    # 600 queries hold too few of the k = 10 type to judge its p99: said, never called met.
    assert all(float(r["max_load"]) == 0.0 for r in rows)
    assert "Unjudged probes (not called met)" in md.read_text(encoding="utf-8")


def test_information_ladder_refuses_too_few_queries_to_calibrate(
    tmp_path: Path, tailbench_dir: Path
) -> None:
    # Its calibration judges every class x fanout type: 2,000 queries leave the k = 100
    # type unjudged, so no load is met and the experiment says how to fix it.
    with pytest.raises(ValueError, match="run more queries"):
        run_tiny("information-ladder", tmp_path, tailbench_dir, queries=2000, tol=0.3)


def test_multi_query_experiment_searches_every_rule(tmp_path: Path, tailbench_dir: Path) -> None:
    md = run_tiny("multi-query", tmp_path, tailbench_dir, queries=600, tol=0.3)
    rows = read_csv(tmp_path / "multi-query" / "multi_query.csv")
    assert {(r["policy"], r["rule"]) for r in rows} == {
        (p, r) for p in ("fifo", "tf-edfq") for r in ("remaining", "proportional", "equal")
    }
    assert "Unjudged probes (not called met)" in md.read_text(encoding="utf-8")


def test_fair_share_experiment_reports_every_allocation_per_tenant(
    tmp_path: Path, tailbench_dir: Path
) -> None:
    from loadtests.sim.tenant_experiments import FLOOD, VARIANTS, variant_name

    md = run_tiny("fair-share", tmp_path, tailbench_dir, queries=12000, tol=0.3)
    rows = read_csv(tmp_path / "fair-share" / "fair_share.csv")
    assert [(r["allocation"], float(r["flood"])) for r in rows] == [
        (variant_name(*v), m) for v in VARIANTS for m in FLOOD
    ]
    for r in rows:
        for tenant in ("interactive", "bulk"):
            assert 0.0 <= float(r[f"goodput_{tenant}"]) <= float(r[f"admitted_{tenant}"]) <= 1.0
    assert (tmp_path / "fair-share" / "fair_share.png").is_file()
    assert "## Per tenant" in md.read_text(encoding="utf-8")
