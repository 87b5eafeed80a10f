"""The live PARD comparison runs a real pipeline beside the simulator and accounts for both."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from loadtests.pard_live import main

pytestmark = [pytest.mark.integration]


@pytest.mark.solo  # it judges the live side's goodput; the refusals below judge no time
def test_live_and_simulated_sides_run_the_same_requests_with_scaling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "live"
    # headroom 50: at 20 req/s the scaler already wants a second object-detection worker
    args = ["--seconds", "5", "--rate", "20", "--droppers", "pard,none", "--out", str(out)]
    args += ["--workers", "auto", "--cold-start-s", "0.05", "--total-workers", "4"]
    assert main([*args, "--headroom", "50"]) == 0
    text = (out / "pard-live.md").read_text(encoding="utf-8")
    for heading in ("## Side by side", "## Validity of the live runs", "## Decision overhead"):
        assert heading in text
    n = int(text.split(" requests in ")[0].rsplit("- ", 1)[-1].replace(",", ""))
    with (out / "pard-live.csv").open(encoding="utf-8") as f:
        rows = {(r["policy"], r["side"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(p, s) for p in ("pard", "none") for s in ("live", "sim")}
    for row in rows.values():
        assert int(row["requests"]) == n  # both sides saw every arrival of the trace
        assert int(row["on_time"]) + int(row["late"]) + int(row["dropped"]) == n
    for policy in ("pard", "none"):
        live = rows[(policy, "live")]
        assert live["verdict"] in ("PASS", "FAIL", "INVALID")
        assert float(live["lateness_p99_ms"]) >= 0.0
        # the replay's own threads used some CPU, no more than the process tree did
        assert 0.0 < float(live["replay_process_cores"]) <= float(live["cpu_cores"]) + 0.05
        assert 0.0 < float(live["decision_mean_ratio"]) < 1.0  # measured, and a share
        assert float(live["decision_total_ratio"]) > 0.0
        for side in ("live", "sim"):  # the scaler started an object-detection worker
            assert int(rows[(policy, side)]["workers_peak_1"]) >= 2
    assert (
        (out / "goodput_over_time.csv")
        .read_text()
        .startswith("second,offered,pard:live,pard:sim,none:live,none:sim")
    )
    with (out / "lateness_over_time.csv").open(encoding="utf-8") as f:
        late = list(csv.DictReader(f))
    assert [int(r["second"]) for r in late] == list(range(5))
    assert sum(int(r["offered"]) for r in late) == n
    for policy in ("pard", "none"):
        by_second = [float(r[f"{policy}:p99_ms"]) for r in late]
        # no second's p99 above the run's largest lateness (its p99 may be: a percentile of
        # the whole is not bounded by the parts' percentiles)
        top = float(rows[(policy, "live")]["lateness_max_ms"])
        assert all(-0.01 <= x <= top + 1e-3 for x in by_second)  # a timer may fire µs early
        assert max(by_second) > 0.0
    assert "| seconds over the bound |" in text
    for png in ("goodput_over_time.png", "workers_over_time.png"):
        assert (out / png).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| pard | sim |" in printed and "decision µs / request" in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "two"], "--workers: expected a positive integer or 'auto', got 'two'"),
        (["--workers", "0"], "--workers: expected a positive integer or 'auto', got '0'"),
        (["--trace", "reddit"], "--trace: invalid choice: 'reddit'"),
        (["--droppers", "pard,bogus"], "--droppers: dropper name: unknown 'bogus'"),
        (["--profile", "/nonexistent/traffic.profile.json"], "no profile of pipeline 'traffic'"),
        (
            ["--workers", "auto", "--total-workers", "2"],
            "--total-workers: need one per module (3) at least, got 2",
        ),
        (["--workers", "auto", "--max-workers", "0"], "max_workers: must be an int >= 1, got 0"),
        (["--seconds", "2"], "--seconds: need at least 5, got 2"),
    ],
)
def test_bad_arguments_exit_non_zero_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_a_profile_without_the_pipelines_batch_sizes_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnx_models.profile import profile_pipeline
    from onnx_models.spec import load_pipeline, pipeline_path

    spec = load_pipeline(pipeline_path("traffic"))
    short = profile_pipeline(spec, batch_sizes=[1, 2], providers="cpu", warmup=0, repeats=1)
    path = short.write(tmp_path / "short.json")
    with pytest.raises(SystemExit) as exc:
        main(["--profile", str(path), "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--profile {path}: object_detection (id 1): batch 32 is outside" in err
    assert "profile every batch size the pipeline runs" in err
    assert not (tmp_path / "never").exists()


def test_cuda_without_onnxruntime_gpu_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this host has CUDA")
    with pytest.raises(SystemExit) as exc:
        main(["--providers", "cuda", "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    assert "install onnxruntime-gpu" in capsys.readouterr().err
