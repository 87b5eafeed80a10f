"""The Tailbench tables ship with the package and are found from any working directory."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from loadtests.sim.experiments import DEFAULT_DATA_DIR, SCENARIO_DIR
from loadtests.sim.pool import load_pool_scenario
from loadtests.sim.registry import EXPERIMENTS
from loadtests.sim.scenario import load_scenario
from loadtests.sim.tailbench import APPS, TAILBENCH_DIR, resolve_table
from taskserver.tomlconfig import ConfigError
from tests.conftest import REPO_ROOT

SHARED = REPO_ROOT.parent / "shared" / "data" / "tailbench"
TABLES = [f"{app}_quantiles.txt" for app in APPS] + [
    f"{app}_unloaded_p99_by_fanout.txt" for app in APPS
]


def run_elsewhere(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`tailgate ARGV` from `cwd`, with no shared/ folder anywhere near it."""
    assert not (cwd.parent / "shared").exists()
    return subprocess.run(
        [sys.executable, "-m", "deploy.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="no shared/data/tailbench beside the repo")
@pytest.mark.parametrize("name", TABLES)
def test_shipped_tables_equal_the_published_ones(name: str) -> None:
    assert (TAILBENCH_DIR / name).read_bytes() == (SHARED / name).read_bytes()


def test_the_tables_and_their_source_are_package_data() -> None:
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["loadtests"]
    package = REPO_ROOT / "loadtests"
    shipped = {p for g in globs for p in package.glob(g)}
    for name in [*TABLES, "README.md"]:
        assert TAILBENCH_DIR / name in shipped, name
    readme = " ".join((TAILBENCH_DIR / "README.md").read_text().split())
    assert "Kasture and D. Sanchez" in readme and "(IISWC), 2016" in readme


def test_default_data_dir_does_not_depend_on_the_working_directory() -> None:
    assert DEFAULT_DATA_DIR.is_absolute() and DEFAULT_DATA_DIR == TAILBENCH_DIR
    for app in APPS:
        assert Path(resolve_table(f"tailbench:{app}")).is_file()
    assert resolve_table("my/own.txt") == "my/own.txt"  # a path stays a path
    with pytest.raises(ValueError, match="known: masstree, shore, xapian"):
        resolve_table("tailbench:memcached")


def test_every_shipped_scenario_names_a_shipped_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        text = path.read_text()
        assert "../shared" not in text, path.name
        exp = EXPERIMENTS.get(path.stem)
        pool = exp is not None and exp.pool
        scn = load_pool_scenario(path) if pool else load_scenario(path)
        assert scn.service.path is not None
        assert Path(scn.service.path).parent == TAILBENCH_DIR, path.name


def test_a_copied_scenario_still_finds_its_table_and_a_bad_name_is_named(tmp_path: Path) -> None:
    src = (SCENARIO_DIR / "fanout-single-class.toml").read_text()
    (tmp_path / "mine.toml").write_text(src.replace("tailbench:masstree", "tailbench:xapian"))
    scn = load_scenario(tmp_path / "mine.toml")
    assert scn.service.path == str(TAILBENCH_DIR / "xapian_quantiles.txt")
    (tmp_path / "bad.toml").write_text(src.replace("tailbench:masstree", "tailbench:nope"))
    with pytest.raises(ConfigError) as err:
        load_scenario(tmp_path / "bad.toml")
    assert err.value.key == "service.path" and "tailbench:nope" in err.value.message
    # An explicit path, relative to the scenario's folder, is still read.
    (tmp_path / "table.txt").write_bytes((TAILBENCH_DIR / "shore_quantiles.txt").read_bytes())
    (tmp_path / "own.toml").write_text(src.replace('"tailbench:masstree"', '"table.txt"'))
    assert load_scenario(tmp_path / "own.toml").service.path == str(tmp_path / "table.txt")


def test_a_simulation_runs_from_another_directory(tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    scenario = str(SCENARIO_DIR / "fixed-fanout-two-classes.toml")
    done = run_elsewhere(work, "sim", "run", scenario, "--load", "0.3", "--queries", "3000")
    assert done.returncode in (0, 3), done.stderr  # 3: unjudged, still simulated
    assert "fixed-fanout-two-classes: policy" in done.stdout
    shipped = run_elsewhere(
        work,
        "sim",
        "run",
        scenario,
        "--load",
        "0.3",
        "--queries",
        "3000",
        "--json",
        "--service-quantiles",
        "tailbench:masstree",
    )
    assert shipped.returncode in (0, 3), shipped.stderr
    assert json.loads(shipped.stdout)["queries"] > 0
