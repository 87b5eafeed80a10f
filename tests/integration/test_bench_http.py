"""`python -m loadtests.bench_http` runs end to end with tiny sizes and prints its tables.

A smoke test of the benchmark (its figures are not judged here): a gateway, two emulated
task servers in one process, a second of closed loop and a short sweep.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_the_http_benchmark_prints_its_closed_loop_and_sweep_tables(tmp_path: Path) -> None:
    argv = ["--seconds", "1", "--fanout", "2", "--clients", "2", "--servers", "2",
            "--per-process", "2", "--sweep-fanout", "2", "--sweep-start", "50",
            "--sweep-factor", "2", "--step-seconds", "0.5", "--limit-ms", "1000",
            "--max-steps", "2"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_http", *argv],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "closed loop: fanout 2, 2 clients" in out
    header = out.splitlines().index("  queries/s   tasks/s   failed   gateway CPU   "
                                    "gateway-added µs   client µs")  # fmt: skip
    row = out.splitlines()[header + 2].split()
    assert float(row[0].replace(",", "")) > 0  # queries/s answered
    assert row[2] == "0"  # none failed
    assert "sweep: open-loop Poisson arrivals, fanout 2" in out
    assert "sustained:" in out
    assert list(tmp_path.iterdir()) == []  # nothing left behind
