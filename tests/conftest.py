"""Shared fixtures: paths to the measured Tailbench data beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TAILBENCH_DIR = REPO_ROOT.parent / "shared" / "data" / "tailbench"


@pytest.fixture(scope="session")
def tailbench_dir() -> Path:
    """Directory with the Tailbench quantile files (shared/ next to the repo)."""
    if not TAILBENCH_DIR.is_dir():
        pytest.fail(
            f"Tailbench data not found at {TAILBENCH_DIR}: shared/ must sit beside the repo"
        )
    return TAILBENCH_DIR
