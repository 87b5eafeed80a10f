"""tailgate.toml parsing: defaults, typed values, and messages that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config import ConfigError, load_config, parse_config
from tests.conftest import REPO_ROOT


def test_no_file_gives_documented_defaults() -> None:
    cfg = load_config(None, env={})
    assert cfg.gateway.port == 8080
    assert [c.name for c in cfg.gateway.classes] == ["A", "B", "C"]
    assert [p.name for p in cfg.gateway.pools] == ["default", "edge"]
    assert cfg.gateway.pool_named("edge").queueing == "central"
    assert cfg.taskserver.policy == "tf-edfq"


def test_full_file_round_trips(tmp_path: Path) -> None:
    f = tmp_path / "tailgate.toml"
    f.write_text(
        """
[gateway]
port = 9000
grace_ms = 250

[[classes]]
name = "gold"
percentile = 99.9
latency_ms = 40
priority = 0

[[pools]]
name = "gpu"
queueing = "server"
cdf = "shared"
[pools.prior]
kind = "lognormal"
median_ms = 3.0
sigma = 0.5
[[pools.servers]]
id = "g1"
address = "10.0.0.5:9101"
slots = 4

[taskserver]
policy = "priq"
slots = 2
[taskserver.service]
kind = "constant"
value_ms = 1.5
"""
    )
    cfg = load_config(f, env={})
    assert cfg.gateway.port == 9000 and cfg.gateway.grace_ms == 250.0
    (gold,) = cfg.gateway.classes
    assert (gold.name, gold.percentile, gold.latency_ms) == ("gold", 99.9, 40.0)
    (gpu,) = cfg.gateway.pools
    assert gpu.cdf == "shared" and gpu.prior.median_ms == 3.0
    assert gpu.servers[0].slots == 4
    assert cfg.taskserver.policy == "priq" and cfg.taskserver.service.value_ms == 1.5


def test_env_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "x.toml"
    f.write_text("[gateway]\nport = 8181\n")
    assert load_config(None, env={"TAILGATE_CONFIG": str(f)}).gateway.port == 8181


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        ({"gateway": {"port": 70000}}, "gateway.port", "0..65535"),
        ({"gateway": {"port": "80"}}, "gateway.port", "expected an integer"),
        ({"gateway": {"prot": 80}}, "gateway.prot", "unknown key"),
        ({"classes": [{"name": "A", "latency_ms": -1}]}, "classes[0].latency_ms", "> 0"),
        ({"classes": [{"name": "A"}]}, "classes[0].latency_ms", "required"),
        (
            {"classes": [{"name": "A", "latency_ms": 5, "percentile": 100}]},
            "classes[0].percentile",
            "(0, 100)",
        ),
        ({"pools": [{"name": "p", "queueing": "sideways"}]}, "pools[0].queueing", "'sideways'"),
        (
            {"pools": [{"name": "p", "servers": [{"id": "a", "address": "nope"}]}]},
            "pools[0].servers[0].address",
            "host:port",
        ),
        ({"taskserver": {"policy": "edf"}}, "taskserver.policy", "'edf'"),
        ({"taskserver": {"slots": 0}}, "taskserver.slots", ">= 1"),
        (
            {"taskserver": {"service": {"kind": "exponential", "mean_ms": "fast"}}},
            "taskserver.service.mean_ms",
            "expected a number",
        ),
        ({"frontend": {}}, "frontend", "unknown section"),
    ],
)
def test_bad_values_name_the_key(doc: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "t.toml")
    assert err.value.key == key, str(err.value)
    assert words in err.value.message
    assert str(err.value).startswith(f"t.toml: {key}: ")


def test_cli_reports_bad_config_and_exits_nonzero(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[gateway]\ngrace_ms = -3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "--config", str(f), "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "gateway.grace_ms: must be >= 0, got -3" in proc.stderr
    f.write_text("[gateway\n")
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "--config", str(f), "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "--config", str(tmp_path / "missing.toml"), "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr
