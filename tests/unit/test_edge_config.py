"""Agent configuration, its loader (options + environment), intervals, and the CLI's exits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy.cli import main
from edge_agent.agent import build_reader, task_server_config
from edge_agent.backfill import MONTH_S, seed_store, simulated_readings
from edge_agent.config import (
    ENV_TOKEN,
    AgentConfig,
    AgentConfigError,
    dense_agent_configs,
    load_agent_config,
    parse_interval,
    parse_sensors,
)
from edge_agent.readers import CommandReader, IioReader, SimulatedReader
from edge_agent.store import SensorStore


def options(**kw: Any) -> dict[str, Any]:
    """argparse-like options of `edge-agent run` (None = not given)."""
    base: dict[str, Any] = {"id": "pi-1", "cluster": "wet-lab", "command": "edge-agent"}
    return base | kw


def test_defaults_are_documented_values() -> None:
    cfg = AgentConfig()
    assert (cfg.pool, cfg.host, cfg.port, cfg.policy, cfg.slots) == (
        "edge",
        "127.0.0.1",
        9201,
        "tf-edfq",
        1,
    )
    assert cfg.sample_interval_s == 60 and cfg.retention_days == 548
    assert cfg.prune_interval_s == 3600 and cfg.register_interval_s == 3
    assert cfg.profile == "none" and cfg.reader == "simulated" and cfg.metrics_port == 0
    assert cfg.database == "edge-agent-edge-1.db"
    assert cfg.retention_s == 548 * 86_400


def test_loader_maps_options_and_keeps_the_token_out_of_repr(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = load_agent_config(
        options(
            gateway="http://gw:8080",
            port=0,
            token_file=str(token),
            sensors="humidity",
            profile="gta",
            reader_command=None,
        ),
        {ENV_TOKEN: "from-env"},
    )
    assert cfg.agent_id == "pi-1" and cfg.cluster == "wet-lab"
    assert cfg.gateway_url == "http://gw:8080" and cfg.port == 0
    assert cfg.token == "s3cret" and "s3cret" not in repr(cfg)
    assert cfg.sensors == ("humidity",) and cfg.profile == "gta"
    assert cfg.command is None  # the subcommand's name is not the command reader's command
    ts = task_server_config(cfg)
    assert (ts.server_id, ts.cluster, ts.pool, ts.token) == ("pi-1", "wet-lab", "edge", "s3cret")
    assert ts.register_interval_s == 3.0


def test_token_comes_from_the_environment_when_no_file(tmp_path: Path) -> None:
    assert load_agent_config(options(), {ENV_TOKEN: " tok \n"}).token == "tok"
    assert load_agent_config(options(), {}).token is None
    # As for the gateway: the variable wins, then the file the second variable names.
    (tmp_path / "t").write_text("from-file\n")
    env = {"TAILGATE_AGENT_TOKEN_FILE": str(tmp_path / "t")}
    assert load_agent_config(options(), env).token == "from-file"
    assert load_agent_config(options(), {**env, ENV_TOKEN: "var"}).token == "var"
    with pytest.raises(AgentConfigError, match="TAILGATE_AGENT_TOKEN_FILE: cannot read"):
        load_agent_config(options(), {"TAILGATE_AGENT_TOKEN_FILE": str(tmp_path / "none")})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"id": "has space"}, "--id: must match"),
        ({"cluster": ""}, "--cluster: must be 1..64 characters"),
        ({"port": 70000}, "--port: must be 0..65535, got 70000"),
        ({"gateway": "gw:8080"}, "--gateway: must be an http(s) URL"),
        ({"reader": "gpio"}, "--reader: must be one of simulated, iio, command, got 'gpio'"),
        ({"reader": "iio"}, "--iio-device: the iio reader needs a device directory"),
        ({"reader": "command"}, "--command: the command reader needs a command line"),
        ({"sensors": "temperature,co2"}, "--sensors: must be among temperature, humidity"),
        ({"sensors": "Temp"}, "--sensors: sensor name must match"),
        ({"sample_interval_s": 0.0}, "--sample-interval-s: must be a finite number > 0"),
        ({"retention_days": -1.0}, "--retention-days: must be a finite number > 0"),
        ({"policy": "lifo"}, "--policy: must be one of tf-edfq"),
        ({"slots": 0}, "--slots: must be >= 1, got 0"),
        ({"profile": "attic"}, "--profile: must be one of none, server-room"),
        ({"profile": "gta", "read_sample": 1.5}, "--read-sample: must be in [0, 1], got 1.5"),
        ({"profile": "gta", "time_scale": 0.0}, "--time-scale: must be a finite number > 0"),
        ({"read_sample": 0.1}, "--profile: read_sample below 1 and time_scale need a cluster"),
        ({"time_scale": 2.0}, "--profile: read_sample below 1 and time_scale need a cluster"),
        ({"token_file": "/nonexistent/token"}, "--token-file: cannot read /nonexistent/token"),
    ],
)
def test_bad_options_name_the_option(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(options(**kw), {})
    assert str(info.value).startswith(message)


def test_empty_token_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("\n")
    with pytest.raises(AgentConfigError, match=r"--token-file: .* is empty"):
        load_agent_config(options(token_file=str(tmp_path / "t")), {})


def test_readers_built_from_the_config(tmp_path: Path) -> None:
    assert isinstance(build_reader(AgentConfig()), SimulatedReader)
    iio = build_reader(AgentConfig(reader="iio", iio_device=str(tmp_path)))
    assert isinstance(iio, IioReader)
    cmd = build_reader(AgentConfig(reader="command", command="read-sht31 --bus 1"))
    assert isinstance(cmd, CommandReader) and cmd.argv == ["read-sht31", "--bus", "1"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("1d", 86400), ("250ms", 0.25), ("90", 90)],
)
def test_intervals(text: str, seconds: float) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m5", "-5m", "0s", "1.5.2h"])
def test_bad_intervals_name_the_option(text: str) -> None:
    with pytest.raises(AgentConfigError, match=r"^--interval: expected a duration like 30s"):
        parse_interval(text)


def test_sensor_lists() -> None:
    assert parse_sensors("temperature, humidity,temperature") == ("temperature", "humidity")
    with pytest.raises(AgentConfigError, match=r"^--sensors: expected"):
        parse_sensors(" , ")


def test_backfill_rows_are_regular_and_agree_with_live_values(tmp_path: Path) -> None:
    now = 1_767_225_600 + 123
    result = seed_store(str(tmp_path / "s.db"), months=0.1, interval_s=600, seed=2, now_s=now)
    expected_per_sensor = len(range(-(-(now - int(0.1 * MONTH_S)) // 600) * 600, now, 600))
    assert result.rows == 2 * expected_per_sensor and result.rows_per_s > 0
    store = SensorStore(str(tmp_path / "s.db"))
    ts, value = store.latest("humidity") or (0, 0.0)
    assert ts % 600 == 0 and value == SimulatedReader(seed=2).read(ts)["humidity"]
    rows = list(simulated_readings(SimulatedReader(seed=2), 0, 1800, 600))
    assert [(s, t) for s, t, _ in rows] == [
        (s, t) for s in ("temperature", "humidity") for t in (0, 600, 1200)
    ]


def test_cli_seed_prints_rows_and_rate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = str(tmp_path / "cli.db")
    assert main(["edge-agent", "seed", "--db", db, "--months", "0.05", "--interval", "1h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seeded ") and "rows/s" in out
    assert SensorStore(db).count() > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["seed", "--db", "x.db", "--interval", "5x"], "--interval: expected a duration"),
        (["seed", "--db", "x.db", "--interval", "500ms"], "--interval: must be a whole number"),
        (["seed", "--db", "x.db", "--months", "0"], "--months: must be a number in (0, 240]"),
        (["seed", "--db", "x.db", "--sensors", "co2"], "--sensors: the simulated reader knows"),
        (["run", "--id", "a", "--cluster", "c", "--profile", "x"], "--profile: must be one of"),
        (["run", "--id", "a", "--cluster", "c", "--slots", "0"], "--slots: must be >= 1"),
        (["run", "--id", "a", "--cluster", "c", "--count", "0"], "--count: must be an integer"),
        (["run", "--id", "a", "--cluster", "c", "--first", "3"], "--first: only applies with"),
        (
            ["run", "--id", "a", "--cluster", "c", "--count", "2", "--advertise", "h:1"],
            "--count: --advertise names one address",
        ),
        (["run", "--id", "a" * 62, "--cluster", "c", "--count", "20"], "--id: must match"),
    ],
)
def test_cli_bad_options_exit_2_naming_the_option(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["edge-agent", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_run_requires_id_and_cluster(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["edge-agent", "run", "--id", "a"])
    assert info.value.code == 2
    assert "--cluster" in capsys.readouterr().err


def test_a_token_the_gateway_would_refuse_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="TAILGATE_AGENT_TOKEN: token: must be"):
        load_agent_config({}, {"TAILGATE_AGENT_TOKEN": "has a space"})
    f = tmp_path / "t"
    f.write_text("caf\u00e9\n")
    with pytest.raises(AgentConfigError, match="--token-file: token: must be"):
        load_agent_config({"token_file": str(f)}, {})


def test_dense_agents_each_have_an_identity_port_and_seed_and_share_one_store() -> None:
    base = AgentConfig(agent_id="edge", cluster="gta", port=9300, metrics_port=9400, seed=5)
    agents = dense_agent_configs(base, 3, first=9)
    assert [a.agent_id for a in agents] == ["edge-9", "edge-10", "edge-11"]
    assert [a.port for a in agents] == [9300, 9301, 9302]
    assert [a.metrics_port for a in agents] == [9400, 9401, 9402]
    assert [a.seed for a in agents] == [5, 6, 7]
    assert {a.database for a in agents} == {"edge-agent-edge.db"}
    assert {a.cluster for a in agents} == {"gta"}
    free = dense_agent_configs(AgentConfig(agent_id="e", port=0), 2)
    assert [(a.agent_id, a.port, a.metrics_port) for a in free] == [("e-1", 0, 0), ("e-2", 0, 0)]
    assert dense_agent_configs(base, 1) == [base]  # one agent: the config unchanged


def test_dense_agents_bad_counts_are_named() -> None:
    with pytest.raises(ValueError, match="count: must be an integer >= 1, got 0"):
        dense_agent_configs(AgentConfig(), 0)
    with pytest.raises(ValueError, match="first: must be an integer >= 0, got -1"):
        dense_agent_configs(AgentConfig(), 2, first=-1)
    with pytest.raises(ValueError, match="count: 3 agents from port 65534 run past 65535"):
        dense_agent_configs(AgentConfig(port=65534), 3)
