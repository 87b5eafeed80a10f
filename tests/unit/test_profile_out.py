"""`tailgate profile` writes into the working directory, never over a shipped profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from onnx_models.spec import PIPELINES_DIR
from tests.conftest import REPO_ROOT

TINY = ["--batch-sizes", "1", "--warmup", "0", "--repeats", "1", "--rounds", "1"]
"""The least measuring that still writes a profile (the smallest pipeline: traffic)."""


def test_profile_without_out_leaves_the_shipped_profile_and_writes_here(tmp_path: Path) -> None:
    shipped = PIPELINES_DIR / "traffic.profile.json"
    before = shipped.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "profile", "traffic", *TINY, "--provider", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert shipped.read_bytes() == before
    written = tmp_path / "traffic.profile.json"
    assert json.loads(written.read_text())["pipeline"] == "traffic"
    assert done.stdout.splitlines()[-1] == f"wrote {written.resolve()}"
    assert [p.name for p in tmp_path.iterdir()] == ["traffic.profile.json"]
