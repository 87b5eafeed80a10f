"""The live PARD comparison runs a real pipeline and accounts for every request."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from loadtests.pard_live import main

pytestmark = pytest.mark.integration


def test_every_request_is_counted_once_under_each_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "live"
    assert (
        main(["--seconds", "5", "--rate", "40", "--droppers", "pard,none", "--out", str(out)]) == 0
    )
    text = (out / "pard-live.md").read_text(encoding="utf-8")
    rows = [
        line for line in text.splitlines() if line.startswith("| pard") or line.startswith("| none")
    ]
    assert len(rows) == 2
    n = int(text.split(" requests in ")[0].rsplit("\n", 1)[-1])
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        on_time, late, dropped = (int(c) for c in cells[4:7])
        assert on_time + late + dropped == n
    assert (out / "goodput_over_time.csv").read_text().startswith("second,pard,none,offered")
    assert (out / "goodput_over_time.png").stat().st_size > 0
