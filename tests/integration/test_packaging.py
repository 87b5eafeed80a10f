"""The wheel users install holds every subpackage and data file (an editable install hides
a missing one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_the_wheel_holds_subpackages_models_specs_scenarios_and_dashboard(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves a build/ folder beside the sources.
    src = tmp_path / "src"
    junk = shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", "*.db*", "tailgate-edge-data"
    )
    shutil.copytree(REPO_ROOT, src, ignore=junk)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("tailgate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("taskserver/pard", "taskserver/pipeline", "loadtests/sim", "gateway"):
        assert f"{package}/__init__.py" in names, package
    expected = [
        "taskserver/tailgate.thrift",
        "gateway/static/dashboard.html",
        "gateway/static/dashboard.js",
        "gateway/static/dashboard.css",
        "gateway/static/vendor/uplot/uPlot.iife.min.js",
        "gateway/static/vendor/uplot/uPlot.min.css",
        "gateway/static/vendor/uplot/LICENSE",
        "onnx_models/models/object_detection.onnx",
        "onnx_models/pipelines/traffic.json",
        "onnx_models/pipelines/traffic.profile.json",
        "loadtests/scenarios/admission.toml",
        "loadtests/sim/data/tailbench/masstree_quantiles.txt",
        "loadtests/sim/data/tailbench/shore_quantiles.txt",
        "loadtests/sim/data/tailbench/xapian_quantiles.txt",
        "loadtests/sim/data/tailbench/xapian_unloaded_p99_by_fanout.txt",
        "loadtests/sim/data/tailbench/README.md",
        "deploy/saas.toml",
    ]
    assert [n for n in expected if n not in names] == []
    assert not any(n.startswith("tests/") for n in names)
