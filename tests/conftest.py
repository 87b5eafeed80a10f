"""Shared fixtures: paths to the measured Tailbench data shipped with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.sim.tailbench import TAILBENCH_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tailbench_dir() -> Path:
    """Directory with the Tailbench quantile files (loadtests/sim/data/tailbench)."""
    if not TAILBENCH_DIR.is_dir():
        pytest.fail(f"Tailbench data not found at {TAILBENCH_DIR}: the package ships it")
    return TAILBENCH_DIR
