"""`tailgate config` prints TOML the loader reads back as the same configuration."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deploy.config import TailgateConfig, load_config, parse_config
from deploy.config_toml import dump_config, to_toml
from tests.conftest import REPO_ROOT

RICH = """
[gateway]
host = "0.0.0.0"
port = 9000
grace_ms = 250.5
storage_url = ""
default_class = "gold"
replica = "gw-é \\"1\\""

[[classes]]
name = "gold"
latency_ms = 12.5
percentile = 99.9
priority = 0

[[classes]]
name = "bronze"
latency_ms = 400.0
percentile = 95.0
priority = 3

[[pools]]
name = "gpu"
queueing = "server"
policy = "fifo"
cdf = "shared"
prior = { kind = "lognormal", median_ms = 3.0, sigma = 0.5 }
servers = [
    { id = "g1", address = "10.0.0.1:9101", slots = 4, cluster = "rack-a" },
    { id = "g2", address = "10.0.0.2:9101" },
]
clusters = ["rack-a", "rack-b"]
pick = "least-wait"

[[pools]]
name = "edge"
queueing = "central"
prior = { kind = "quantiles", path = "tables/masstree.txt", scale = 10.0 }

[admission]
policy = "none"

[autoscaling]
enabled = true
policy = "swayam"
pool = "gpu"
link_delay_ms = 0.25
max_replicas = 4

[allocation]
policy = "drr"
weights = { "tenant a" = 2.0, b = 0.5 }
protected = ["tenant a"]

[tracing]
sample_ratio = 0.25
service_name = "tailgate-test"

[taskserver]
server_id = "ts-9"
seed = 7
gateway_url = "http://127.0.0.1:9000"
service = { kind = "constant", value_ms = 1.5 }
"""


def round_trip(cfg: TailgateConfig) -> TailgateConfig:
    """Print, then load the printed text as a config file would be loaded."""
    back = parse_config(tomllib.loads(dump_config(cfg)), env={})
    return dataclasses.replace(back, source=cfg.source)


@pytest.mark.parametrize("path", [None, "deploy/swayam.toml", "deploy/saas.toml"])
def test_shipped_configs_round_trip(path: str | None) -> None:
    cfg = load_config(REPO_ROOT / path if path else None, env={})
    assert round_trip(cfg) == cfg


def test_a_rich_config_round_trips(tmp_path: Path) -> None:
    f = tmp_path / "rich.toml"
    f.write_text(RICH, encoding="utf-8")
    cfg = load_config(f, env={})
    # The file sets what the defaults do not: the round trip has something to keep.
    assert cfg != load_config(None, env={})
    assert cfg.gateway.autoscaling.link_delay_ms == 0.25
    assert cfg.gateway.allocation.weights == {"tenant a": 2.0, "b": 0.5}
    assert cfg.gateway.pools[0].servers[1].cluster is None
    assert cfg.taskserver.tracing.sample_ratio == 0.25  # one [tracing] for both
    assert round_trip(cfg) == cfg


def test_none_is_left_out_and_reads_back_as_none() -> None:
    cfg = load_config(None, env={})
    assert cfg.gateway.autoscaling.link_delay_ms is None
    text = dump_config(cfg)
    assert "link_delay_ms" not in text and "None" not in text and "null" not in text
    assert round_trip(cfg).gateway.autoscaling.link_delay_ms is None


def test_tokens_are_never_printed(tmp_path: Path) -> None:
    token = "s3cret-token-value-0123456789"
    cfg = parse_config({}, env={"TAILGATE_AGENT_TOKEN": token})
    text = dump_config(cfg.redacted())
    assert token not in text and "<redacted>" not in text
    assert "token: set" in text
    assert round_trip(cfg.redacted()).gateway.token is None


def test_values_toml_cannot_hold_as_bare_text() -> None:
    doc = {"t": {"inf": float("inf"), "neg": -0.5, "del": "a\x7fb", "q": 'x"\\y\n'}}
    back = tomllib.loads(to_toml(doc))
    assert back == doc


def test_tailgate_config_prints_toml_that_loads_back(tmp_path: Path) -> None:
    f = tmp_path / "rich.toml"
    f.write_text(RICH, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "--config", str(f), "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    saved = tmp_path / "effective.toml"
    saved.write_text(done.stdout, encoding="utf-8")
    again = load_config(saved, env={})
    assert dataclasses.replace(again, source="") == dataclasses.replace(
        load_config(f, env={}), source=""
    )
