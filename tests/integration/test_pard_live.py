"""The live PARD comparison runs a real pipeline beside the simulator and accounts for both."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from loadtests.pard_live import main

pytestmark = [pytest.mark.integration, pytest.mark.solo]


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
        assert 0.0 < float(live["decision_mean_ratio"]) < 1.0  # measured, and a share
        assert float(live["decision_total_ratio"]) > 0.0
        for side in ("live", "sim"):  # the scaler started an object-detection worker
            assert int(rows[(policy, side)]["workers_peak_1"]) >= 2
    assert (
        (out / "goodput_over_time.csv")
        .read_text()
        .startswith("second,offered,pard:live,pard:sim,none:live,none:sim")
    )
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
