"""Shared fixtures: paths to the measured Tailbench data shipped with the package."""

from __future__ import annotations

import compileall
import fcntl
import os
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

from loadtests.sim.tailbench import TAILBENCH_DIR

REPO_ROOT = Path(__file__).resolve().parents[1]

# --- Bytecode is written ------------------------------------------------------------------
#
# With PYTHONDONTWRITEBYTECODE set (many container images set it), Python never caches
# this package's compiled modules: each of the hundreds of processes the suite starts
# (gateways, task servers, edge agents, CLIs) compiles them from source again, ~0.3 s of
# start-up each on the 2-core VM, and every pytest worker rewrites every test module's asserts
# again. The suite and what it starts write their bytecode (__pycache__, ignored by git).
# The package is compiled once, before the workers start, so that their first processes
# do not all compile it at once.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
PACKAGES = (
    "admission",
    "deploy",
    "edge_agent",
    "gateway",
    "loadtests",
    "onnx_models",
    "taskserver",
)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        for name in PACKAGES:
            compileall.compile_dir(REPO_ROOT / name, quiet=1)


@pytest.fixture(scope="session")
def tailbench_dir() -> Path:
    """Directory with the Tailbench quantile files (loadtests/sim/data/tailbench)."""
    if not TAILBENCH_DIR.is_dir():
        pytest.fail(f"Tailbench data not found at {TAILBENCH_DIR}: the package ships it")
    return TAILBENCH_DIR


# --- Tests that measure time run alone -------------------------------------------------
#
# The suite runs in three pytest-xdist workers (pyproject's addopts): on a 2-core host the
# cores were 29% idle with two, as the tests wait on live processes. One run each on the
# 2-core VM: 787.8 s of pytest with two workers, 708.5 s with three. A test marked `solo`
# judges latencies or start-up times of live processes against a scenario, so the other
# workers' CPU-bound tests would be what it measures: it takes an exclusive lock that every
# other test takes shared, so it runs while the other workers wait between two tests.
# Every test passes a gate (a second lock) to take its own, and a solo test holds the gate
# while it waits: tests that come later wait behind it, so it waits only for those already
# running. Without the gate, shared locks were taken one after another while it waited (a
# writer's starvation): 17 solo tests of one run waited 413 s in all, one of them 80 s.
# The locks are taken outside pytest-timeout's timer (an outer hook wrapper), so waiting
# for them does not count against a test's timeout.


def _lock_paths() -> tuple[Path, Path] | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None  # not under xdist: nothing runs beside this test
    base = Path(tempfile.gettempdir()) / f"tailgate-tests-{run}"
    return Path(f"{base}.lock"), Path(f"{base}.gate")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    paths = _lock_paths()
    if paths is None:
        yield
        return
    lock_path, gate_path = paths
    with lock_path.open("a") as lock, gate_path.open("a") as gate:
        solo = item.get_closest_marker("solo") is not None
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- Files with slow tests start first, files with solo tests come last --------------------
#
# xdist (--dist loadfile) hands whole files to the workers, in collection order only
# with --no-loadscope-reorder (pyproject's addopts): by default since pytest-xdist 3.5 it
# sorts them by their number of tests, which undid this order. Files that hold a test
# marked `slow` (the soak, the live replays, the fuzzers, the admission simulations: long,
# many of them waiting on processes) go first, so that the last files handed out are short
# ones and the workers end together. One run each on the 2-core VM (two workers): 757.3 s
# of pytest in this order, 770.6 s with xdist's; each worker ended within 3.2 s of the other; so
# the order is ours, not a measured gain. Files with a `solo` test come last: a solo test
# waits for the tests running beside it, which are then short ones, not the soak or a
# fuzzer (one test of one to two minutes each). The sort is stable: every file stays whole
# and keeps its own order.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with `slow` tests to the front of the collection, files with `solo` ones to
    its end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    solo_files = {item.path for item in items if item.get_closest_marker("solo") is not None}
    items.sort(key=lambda item: (item.path in solo_files, item.path not in slow_files))
