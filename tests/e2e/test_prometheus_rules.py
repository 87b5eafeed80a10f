"""promtool on what we ship: the rules check, their unit tests fire and stay quiet as they
should, and a pipeline task server's exposition passes the metrics lint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from taskserver.metrics import PipelineCollector, TaskServerMetrics
from tests.conftest import REPO_ROOT
from tests.unit.test_alert_rules import RULES
from tests.unit.test_pipeline_exposition import make_snapshot

pytestmark = pytest.mark.e2e

RULE_TESTS = REPO_ROOT / "tests" / "prometheus" / "tailgate-rules.test.yml"


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run promtool; skip when it is not installed."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return subprocess.run([path, *args], input=stdin, capture_output=True, timeout=60)


def test_the_shipped_rules_pass_promtool_check() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    assert b"SUCCESS" in out.stdout


def test_the_rules_unit_tests_pass() -> None:
    """Fast burn pages, slow burn fires only the 6 h page, healthy traffic fires nothing;
    down servers, a stale agent, sustained rejections and a high drop rate fire."""
    out = promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    assert b"SUCCESS" in out.stdout


def test_the_rules_unit_tests_fail_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    """The rule tests can fail: with the fast-burn page made blind, promtool says so."""
    rules_dir = tmp_path / "deploy" / "prometheus"
    tests_dir = tmp_path / "tests" / "prometheus"
    rules_dir.mkdir(parents=True)
    tests_dir.mkdir(parents=True)
    text = RULES.read_text()
    assert text.count("> 14.4 and") == 1
    (rules_dir / RULES.name).write_text(text.replace("> 14.4 and", "> 1000 and"))
    shutil.copy(RULE_TESTS, tests_dir / RULE_TESTS.name)
    out = promtool("test", "rules", str(tests_dir / RULE_TESTS.name))
    assert out.returncode != 0
    assert b"alertname: TailgateSLOFastBurn" in out.stdout + out.stderr


def test_a_pipeline_servers_exposition_passes_promtool_lint() -> None:
    registry = CollectorRegistry()
    TaskServerMetrics(registry, "gpu-1")
    registry.register(PipelineCollector(make_snapshot, "gpu-1"))
    text = generate_latest(registry)
    assert b"tailgate_pipeline_batch_size_bucket{" in text
    out = promtool("check", "metrics", stdin=text)
    assert out.returncode == 0 and not out.stdout.strip(), (out.stdout + out.stderr).decode()
