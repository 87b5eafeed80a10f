"""tailgate.toml parsing: defaults, typed values, and messages that name the key."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.config import ConfigError, TailgateConfig, load_config, parse_config
from gateway.config import GatewayConfig
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
        ({"gateway": {"registration_grace_s": -1}}, "gateway.registration_grace_s", ">= 0"),
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


def test_default_edge_pool_shares_a_cdf_per_cluster() -> None:
    edge = load_config(None, env={}).gateway.pool_named("edge")
    assert edge.cdf == "cluster" and edge.queueing == "central"


def test_clusters_in_pools_and_taskserver_load_and_are_checked() -> None:
    cfg = parse_config(
        {
            "pools": [
                {
                    "name": "edge",
                    "cdf": "cluster",
                    "clusters": ["server-room", "gta"],
                    "servers": [{"id": "pi-1", "address": "10.0.0.9:9101", "cluster": "gta"}],
                }
            ],
            "taskserver": {"cluster": "wet-lab"},
        }
    )
    (edge,) = cfg.gateway.pools
    assert edge.clusters == ("server-room", "gta") and edge.servers[0].cluster == "gta"
    assert cfg.taskserver.cluster == "wet-lab"
    for doc, key, words in [
        ({"pools": [{"name": "p", "cdf": "per-cluster"}]}, "pools[0].cdf", "'cluster'"),
        (
            {"pools": [{"name": "p", "clusters": ["ok", "not ok"]}]},
            "pools[0].clusters[1]",
            "'not ok'",
        ),
        ({"pools": [{"name": "p", "clusters": ["a", "a"]}]}, "pools[0].clusters", "twice"),
        (
            {"pools": [{"name": "p", "servers": [{"id": "x", "address": "h:1", "cluster": ""}]}]},
            "pools[0].servers[0].cluster",
            "1..64",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_config(doc)
        assert err.value.key == key, str(err.value)
        assert words in err.value.message


def test_registration_token_sources_and_precedence(tmp_path: Path) -> None:
    (tmp_path / "gw.token").write_text("from-gateway-file\n")
    (tmp_path / "env.token").write_text("  from-env-file  \n")
    f = tmp_path / "tailgate.toml"
    # token_file is relative to the config file, not to the working directory.
    f.write_text('[gateway]\ntoken_file = "gw.token"\n[taskserver]\ntoken = "inline-ts"\n')
    cfg = load_config(f, env={})
    assert cfg.gateway.token == "from-gateway-file"
    assert cfg.taskserver.token == "inline-ts"
    cfg = load_config(f, env={"TAILGATE_AGENT_TOKEN_FILE": str(tmp_path / "env.token")})
    assert cfg.gateway.token == cfg.taskserver.token == "from-env-file"
    env = {"TAILGATE_AGENT_TOKEN": "from-env", "TAILGATE_AGENT_TOKEN_FILE": "/nonexistent"}
    cfg = load_config(f, env=env)
    assert cfg.gateway.token == cfg.taskserver.token == "from-env"
    assert load_config(None, env={"TAILGATE_AGENT_TOKEN": "t0k"}).gateway.token == "t0k"
    assert load_config(None, env={}).gateway.token is None


def test_tokens_stay_out_of_repr_and_printed_config() -> None:
    cfg = load_config(None, env={"TAILGATE_AGENT_TOKEN": "s3cret-value"})
    assert "s3cret-value" not in repr(cfg)
    printable = cfg.redacted()
    assert printable.gateway.token == printable.taskserver.token == "<redacted>"
    assert "s3cret-value" not in str(dataclasses.asdict(printable))
    assert load_config(None, env={}).redacted().gateway.token is None


@pytest.mark.parametrize(
    ("files", "doc", "env", "key", "words"),
    [
        ({}, {"gateway": {"token_file": "missing.token"}}, {}, "gateway.token_file", "cannot read"),
        ({"t": "\n"}, {"gateway": {"token_file": "t"}}, {}, "gateway.token_file", "is empty"),
        (
            {"t": "two words"},
            {"taskserver": {"token_file": "t"}},
            {},
            "taskserver.token_file",
            "printable ASCII",
        ),
        (
            {"t": "x"},
            {"gateway": {"token_file": "t", "token": "y"}},
            {},
            "gateway.token_file",
            "not both",
        ),
        ({}, {"gateway": {"token_file": 3}}, {}, "gateway.token_file", "file path"),
        ({}, {"gateway": {"token": "has space"}}, {}, "gateway.token", "without spaces"),
        ({}, {"taskserver": {"token": ""}}, {}, "taskserver.token", "1..4096"),
        ({}, {}, {"TAILGATE_AGENT_TOKEN": "bad token"}, "TAILGATE_AGENT_TOKEN", "without spaces"),
        (
            {},
            {},
            {"TAILGATE_AGENT_TOKEN_FILE": "nowhere"},
            "TAILGATE_AGENT_TOKEN_FILE",
            "cannot read",
        ),
    ],
)
def test_bad_tokens_name_their_source_without_quoting_them(
    tmp_path: Path, files: dict, doc: dict, env: dict, key: str, words: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if "TAILGATE_AGENT_TOKEN_FILE" in env:
        env = {"TAILGATE_AGENT_TOKEN_FILE": str(tmp_path / env["TAILGATE_AGENT_TOKEN_FILE"])}
    with pytest.raises(ConfigError) as err:
        parse_config(doc, str(tmp_path / "t.toml"), env)
    assert err.value.key == key, str(err.value)
    assert words in err.value.message
    for secret in ("two words", "has space", "bad token"):
        assert secret not in str(err.value)


def test_printing_the_config_hides_the_stores_password(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[gateway]\nstorage_url = "postgresql+psycopg://tg:s3cret@db:5432/tailgate"\n')
    cfg = load_config(f, env={})
    assert cfg.gateway.storage_url.endswith("tg:s3cret@db:5432/tailgate")  # used as given
    shown = cfg.redacted().gateway.storage_url
    assert shown == "postgresql+psycopg://tg:***@db:5432/tailgate"
    plain = GatewayConfig(storage_url="sqlite:///tailgate-gateway.db")
    assert TailgateConfig(gateway=plain).redacted().gateway.storage_url == plain.storage_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # An @ in the query is not the user-info's end: nothing to hide, kept as written.
        ("postgresql+psycopg://db/tailgate?application_name=a@b", None),
        (
            "postgresql+psycopg://tg:s3cret@db/tailgate?application_name=a@b",
            "postgresql+psycopg://tg:***@db/tailgate?application_name=a%40b",
        ),
        (
            "postgresql+psycopg://tg@db/tailgate?password=s3cret&sslmode=require",
            "postgresql+psycopg://tg@db/tailgate?password=%2A%2A%2A&sslmode=require",
        ),
        ("", None),
    ],
)
def test_the_stores_password_is_hidden_wherever_the_url_puts_it(
    url: str, shown: str | None
) -> None:
    cfg = TailgateConfig(gateway=GatewayConfig(storage_url=url))
    got = cfg.redacted().gateway.storage_url
    assert got == (url if shown is None else shown)
    assert "s3cret" not in got


def test_pipeline_options_without_pipeline_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from deploy.cli import main

    assert main(["taskserver", "--dropper", "none", "--peer", "2=127.0.0.1:9102"]) == 2
    err = capsys.readouterr().err
    assert "--dropper, --peer only apply with --pipeline" in err


@pytest.mark.parametrize(
    ("toml", "flags", "slots"),
    [
        ("", [], 256),  # nothing given: a pipeline needs many tasks at once
        ("[taskserver]\nslots = 4\n", [], 4),  # the configured slots win
        ("[taskserver]\nslots = 4\n", ["--slots", "8"], 8),  # and --slots over both
    ],
)
def test_a_pipeline_task_servers_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, flags: list[str], slots: int
) -> None:
    import deploy.cli
    import taskserver.server

    served = []

    async def fake_serve(cfg: Any, **_kw: Any) -> None:  # records the config it would serve
        served.append(cfg)

    monkeypatch.setattr(taskserver.server, "serve", fake_serve)
    monkeypatch.setattr(deploy.cli, "_pipeline_executor", lambda args: object())
    monkeypatch.setattr(deploy.cli, "run_async", lambda main, stop=None: asyncio.run(main))
    f = tmp_path / "t.toml"
    f.write_text(toml)
    argv = ["--config", str(f), "taskserver", "--pipeline", "traffic", *flags]
    assert deploy.cli.main(argv) == 0
    assert [c.slots for c in served] == [slots]


def test_up_starts_four_edge_agents_by_default_when_there_is_an_edge_pool(tmp_path: Path) -> None:
    from deploy.cli import UP_EDGE_AGENTS, up_edge_agents

    default = load_config(None, env={})
    assert UP_EDGE_AGENTS == 4 and up_edge_agents(None, default) == 4
    assert up_edge_agents(0, default) == 0 and up_edge_agents(7, default) == 7
    f = tmp_path / "t.toml"
    f.write_text('[[pools]]\nname = "gpu"\n')
    assert up_edge_agents(None, load_config(f, env={})) == 0


def test_a_task_server_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "deploy.cli", "taskserver", "--id", "t", "--port", str(port)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    assert "tailgate taskserver: cannot listen:" in proc.stderr
    assert "Traceback" not in proc.stderr
