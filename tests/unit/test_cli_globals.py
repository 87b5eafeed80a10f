"""The tailgate command's global options, version and a reader that goes away."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib

import pytest

from deploy import cli
from tests.conftest import REPO_ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploy.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def test_version_and_global_options_after_the_subcommand() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("tailgate ")
    # --config and --log-level (any case) work after the subcommand as before it.
    after = run("config", "--config", "deploy/swayam.toml", "--log-level", "debug")
    before = run("--config", "deploy/swayam.toml", "config")
    assert after.returncode == before.returncode == 0, after.stderr
    assert tomllib.loads(after.stdout) == tomllib.loads(before.stdout)
    assert tomllib.loads(after.stdout)["autoscaling"]["policy"] == "swayam"
    bad = run("--log-level", "loud", "config")
    assert bad.returncode == 2 and "invalid choice: 'LOUD'" in bad.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(_: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_config", broken)
    saved = os.dup(sys.stdout.fileno())
    try:
        assert cli.main(["config"]) == 128 + signal.SIGPIPE
    finally:
        os.dup2(saved, sys.stdout.fileno())
        os.close(saved)


def test_an_experiment_without_matplotlib_says_which_extra_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    import importlib.util

    from loadtests.sim import registry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    ran: list[str] = []
    monkeypatch.setattr(registry, "run_experiment", lambda name, *a, **k: ran.append(name))
    assert cli.main(["sim", "experiment", "swayam", "--out", str(tmp_path)]) == 2
    assert ran == []  # refused before any simulation
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tailgate sim: the experiments' figures need matplotlib: pip install -e '.[sim]'"
    ]


def test_every_query_option_has_a_help_line() -> None:
    parser = cli.build_parser(light=True)
    sub = next(a for a in parser._actions if a.dest == "command")
    query = sub.choices["query"]  # type: ignore[attr-defined]
    missing = [a.option_strings for a in query._actions if a.option_strings and not a.help]
    assert missing == []
    assert "tailgate up --port" in " ".join(query.format_help().split())
