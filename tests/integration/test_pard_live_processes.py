"""The live PARD replay with each worker's session in a process of its own."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from loadtests.pard_live import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_replay_with_process_workers_reports_their_mode_and_hop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "live"
    args = ["--seconds", "5", "--rate", "15", "--droppers", "pard", "--no-sim"]
    assert main([*args, "--worker-mode", "process", "--out", str(out)]) == 0
    text = (out / "pard-live.md").read_text(encoding="utf-8")
    assert "each worker's session in a process of its own (--worker-mode process)" in text
    assert "live hop ms / batch" in text
    snap = json.loads((out / "snapshots.json").read_text())["pard"]
    assert snap["worker_mode"] == "process"
    assert snap["arrived"] > 0 and snap["failed"] == 0
    for module in snap["modules"].values():
        assert module["hop_s"] > 0 and module["worker_crashes"] == 0
        assert all(isinstance(pid, int) for pid in module["worker_pids"])
    rows = [line for line in text.splitlines() if line.startswith("| pard | object_detection")]
    assert rows and float(rows[0].split("|")[6]) > 0  # the hop column of module 1, in ms
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("tailgate")]
    capsys.readouterr()


def test_a_bad_worker_mode_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--worker-mode", "fork", "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    assert "--worker-mode: invalid choice: 'fork'" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
