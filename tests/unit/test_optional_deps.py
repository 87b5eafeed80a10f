"""A missing optional dependency: one line naming the extra, exit 2, before any work starts.

Each case runs the command in a fresh interpreter whose import of the module is blocked
(``sys.modules[name] = None``, what Python does for a module that must not load), so it
holds whether or not the extra is installed here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskserver.extras import EXTRAS, missing_module, needs
from tests.conftest import REPO_ROOT

LAUNCH = "import sys; {blocks}; from {module} import main; sys.exit(main({argv!r}))"


def run_without(
    modules: tuple[str, ...], argv: list[str], cwd: Path, entry: str = "deploy.cli"
) -> subprocess.CompletedProcess[str]:
    blocks = "; ".join(f"sys.modules[{m!r}] = None" for m in modules)
    code = LAUNCH.format(blocks=blocks, module=entry, argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""  # nothing started: no table, no "listening" line
    return lines[0]


def test_profile_without_onnxruntime(tmp_path: Path) -> None:
    done = run_without(("onnxruntime",), ["profile", "traffic"], tmp_path)
    assert one_line(done) == "tailgate profile: needs onnxruntime: pip install -e '.[onnx]'"
    assert list(tmp_path.iterdir()) == []  # no profile written


def test_pipeline_task_server_without_onnxruntime(tmp_path: Path) -> None:
    argv = ["taskserver", "--pipeline", "traffic", "--port", "0"]
    line = one_line(run_without(("onnxruntime",), argv, tmp_path))
    assert line == "tailgate taskserver --pipeline: needs onnxruntime: pip install -e '.[onnx]'"


def test_up_with_pipeline_servers_without_onnxruntime(tmp_path: Path) -> None:
    argv = ["up", "--pipeline-servers", "1", "--port", "0", "--edge-agents", "0"]
    line = one_line(run_without(("onnxruntime",), argv, tmp_path))
    assert line == "tailgate up --pipeline-servers: needs onnxruntime: pip install -e '.[onnx]'"
    assert list(tmp_path.iterdir()) == []  # no history store, no edge data


@pytest.mark.parametrize("command", ["gateway", "up"])
def test_a_postgres_store_without_psycopg(command: str, tmp_path: Path) -> None:
    url = "postgresql+psycopg://tailgate@127.0.0.1:1/history"
    argv = [command, "--storage-url", url, "--port", "0"]
    line = one_line(run_without(("psycopg",), argv, tmp_path))
    assert line == (
        f"tailgate {command} (storage postgresql+psycopg): needs psycopg: "
        "pip install -e '.[postgres]'"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["edge-agent", "run", "--id", "e1", "--cluster", "lab", "--port", "0"],
        ["edge-agent", "seed", "--months", "1"],
    ],
    ids=["run", "seed"],
)
def test_an_edge_store_on_postgres_without_psycopg(argv: list[str], tmp_path: Path) -> None:
    url = "postgresql+psycopg://tailgate@127.0.0.1:1/sensing"
    line = one_line(run_without(("psycopg",), [*argv, "--db", url], tmp_path))
    assert line == (
        f"tailgate edge-agent {argv[1]} (storage postgresql+psycopg): needs psycopg: "
        "pip install -e '.[postgres]'"
    )


@pytest.mark.parametrize("command", ["gateway", "up"])
def test_the_kubernetes_actuator_without_kubernetes(command: str, tmp_path: Path) -> None:
    cfg = tmp_path / "k8s.toml"
    cfg.write_text('[autoscaling]\nenabled = true\nactuator = "kubernetes"\n')
    argv = ["--config", str(cfg), command, "--port", "0", "--storage-url", ""]
    line = one_line(run_without(("kubernetes",), argv, tmp_path))
    assert line == (
        f"tailgate {command} (actuator kubernetes): needs kubernetes: pip install -e '.[k8s]'"
    )


def test_sim_experiment_without_matplotlib(tmp_path: Path) -> None:
    argv = ["sim", "experiment", "fanout-single-class", "--out", str(tmp_path / "out")]
    line = one_line(run_without(("matplotlib",), argv, tmp_path))
    assert line == "tailgate sim: the experiments' figures need matplotlib: pip install -e '.[sim]'"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", ["torch", "onnx"])
def test_model_export_without_torch_or_onnx(module: str, tmp_path: Path) -> None:
    if module == "onnx" and missing_module("torch"):
        pytest.skip("torch is checked first and is not installed here")
    started = time.monotonic()
    done = run_without((module,), ["--out", str(tmp_path)], tmp_path, entry="onnx_models.export")
    assert one_line(done) == f"export: needs {module}: pip install -e '.[models]'"
    assert list(tmp_path.iterdir()) == []
    assert time.monotonic() - started < 30


def test_needs_names_each_extra_of_pyproject() -> None:
    import tomllib

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for module, extra in EXTRAS.items():
        # The extra exists and installs a distribution of that name.
        assert extra in extras, extra
        assert any(req.lower().startswith(module) for req in extras[extra]), (module, extra)
    assert needs("c", "json") is None  # present: nothing to say
    assert missing_module("no_such_module_of_tailgate")
    assert needs("c", "json", "no_such_module_of_tailgate") == (
        "c: needs no_such_module_of_tailgate: pip install no_such_module_of_tailgate"
    )
