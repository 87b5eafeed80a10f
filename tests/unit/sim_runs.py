"""The named simulator experiments run small, for tests/unit/test_experiments*.py."""

from __future__ import annotations

import csv
from pathlib import Path

from loadtests.sim.registry import run_experiment

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_tiny(name: str, out: Path, data_dir: Path, **kw: object) -> Path:
    """Run an experiment with few queries, a coarse bisection, one seed and no workers."""
    kw = {"queries": 3000, "tol": 0.2, "workers": 1, "quiet": True, "seeds": 1, **kw}
    return run_experiment(name, out, data_dir=str(data_dir), **kw)  # type: ignore[arg-type]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))
