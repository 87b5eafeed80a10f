"""The PARD pipeline experiments end to end (tiny settings): pard-traffic, pard-live, pard-ga,
pard-dag, pard-dag_dynamic, their seeds, ablations and sensitivity."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.sim.registry import EXPERIMENTS, run_experiment
from tests.unit.sim_runs import PNG_MAGIC, read_csv

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
