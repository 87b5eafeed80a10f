"""The systemd units (deploy/systemd): hardened, restartable, long enough to drain, and
starting the `tailgate` CLI with arguments its parser accepts.

`systemd-analyze verify` checks each unit where it is installed (the ExecStart binary is
swapped for a stub: the check needs an executable there); the structural checks run
everywhere.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.cli import build_parser, cmd_edge_agent_run, cmd_gateway, cmd_taskserver
from gateway.config import GatewayConfig
from gateway.service import DRAIN_MARGIN_S
from taskserver.config import TaskServerConfig
from taskserver.lifecycle import LEAVE_MARGIN_S

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
EXECUTABLE = "/opt/tailgate/venv/bin/tailgate"
# unit file -> (the command it runs, an instance name for templates)
UNITS = {
    "tailgate-gateway.service": (cmd_gateway, None),
    "tailgate-taskserver@.service": (cmd_taskserver, "ts-1"),
    "tailgate-edge-agent.service": (cmd_edge_agent_run, None),
}
# What the environment files of the docs put in the unbraced $VARS of ExecStart.
SAMPLE_ENV = {
    "TASKSERVER_ARGS": "--port 9102 --metrics-port 9202 --advertise 10.0.0.5:9102 "
    "--gateway http://10.0.0.2:8080,http://10.0.0.3:8080",
    "AGENT_ARGS": "--id pi-wetlab-3 --cluster wet-lab --gateway http://10.0.0.2:8080 "
    "--advertise 10.0.0.23:9201",
}
HARDENING = {
    "NoNewPrivileges": "yes",
    "PrivateTmp": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "Restart": "on-failure",
    "KillSignal": "SIGTERM",
    "CapabilityBoundingSet": "",
    "RestrictSUIDSGID": "yes",
}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat); `\\` continuations joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    buf = ""
    for raw in path.read_text().splitlines():
        if not buf and raw.lstrip().startswith(("#", ";")):
            continue
        buf += raw.strip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        line, buf = buf, ""
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    """A systemd time span such as 30s, 1min 30s, 2min -> seconds."""
    units = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total


@pytest.fixture(params=sorted(UNITS))
def unit(request: pytest.FixtureRequest) -> tuple[str, dict[str, dict[str, list[str]]]]:
    return request.param, parse_unit(SYSTEMD / request.param)


def test_units_are_hardened(unit: tuple[str, dict[str, dict[str, list[str]]]]) -> None:
    name, sections = unit
    assert {"Unit", "Service", "Install"} <= set(sections), name
    service = sections["Service"]
    for key, value in HARDENING.items():
        assert service.get(key, [None])[-1] == value, f"{name}: {key}={value}"
    dynamic = service.get("DynamicUser", ["no"])[-1] == "yes"
    user = service.get("User", [""])[-1]
    assert dynamic or (user and user not in ("root", "0")), f"{name}: an unprivileged user"
    assert sections["Install"]["WantedBy"] == ["multi-user.target"], name
    # What it writes goes to its state directory, the one writable place it has.
    if "WorkingDirectory" in service:
        state = service["StateDirectory"][-1]
        assert service["WorkingDirectory"][-1] == f"/var/lib/{state}", name


def test_execstart_runs_the_cli_with_valid_arguments(
    unit: tuple[str, dict[str, dict[str, list[str]]]],
) -> None:
    name, sections = unit
    command, instance = UNITS[name]
    (line,) = sections["Service"]["ExecStart"]
    words = []
    for word in shlex.split(line.replace("%i", instance or "")):
        # systemd: an unbraced $VAR alone in a word splits into words; ${VAR} would not.
        var = re.fullmatch(r"\$([A-Za-z_]\w*)", word)
        words += SAMPLE_ENV[var.group(1)].split() if var else [word]
    assert words[0] == EXECUTABLE, name
    assert "%" not in line.replace("%i", ""), f"{name}: only %i is expanded here"
    args = build_parser().parse_args(words[1:])
    assert args.func is command, f"{name}: {words}"
    if instance is not None:
        assert args.id == instance, f"{name}: the instance is the server id"


def test_stop_timeouts_cover_the_drain() -> None:
    gateway = parse_unit(SYSTEMD / "tailgate-gateway.service")["Service"]
    gw = GatewayConfig()
    slowest_query_s = (max(c.latency_ms for c in gw.classes) + gw.grace_ms) / 1e3
    # The drain bound, then the HTTP runner's shutdown (5 s), with room for larger SLOs.
    assert seconds(gateway["TimeoutStopSec"][-1]) >= 3 * (slowest_query_s + DRAIN_MARGIN_S + 5)
    # The gateway stops the task servers its local autoscaler started itself.
    assert gateway["KillMode"] == ["mixed"]
    taskserver = parse_unit(SYSTEMD / "tailgate-taskserver@.service")["Service"]
    drain_s = TaskServerConfig().drain_timeout_s + LEAVE_MARGIN_S
    assert seconds(taskserver["TimeoutStopSec"][-1]) >= 2 * drain_s


def test_tokens_are_credentials_not_world_readable_files() -> None:
    for name in ("tailgate-gateway.service", "tailgate-taskserver@.service"):
        service = parse_unit(SYSTEMD / name)["Service"]
        (cred,) = service["LoadCredential"]
        cred_name, _, source = cred.partition(":")
        assert source.startswith("/etc/tailgate/"), name
        assert f"TAILGATE_AGENT_TOKEN_FILE=%d/{cred_name}" in service["Environment"], name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not found")
def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    stub = tmp_path / "tailgate"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    for name, (_, instance) in UNITS.items():
        unit_name = name.replace("@.", f"@{instance}.") if instance else name
        target = tmp_path / unit_name
        target.write_text((SYSTEMD / name).read_text().replace(EXECUTABLE, str(stub)))
        out = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(target)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # It exits 0 on unknown keys and bad values too: any message is a finding.
        assert out.returncode == 0 and not out.stderr.strip(), f"{name}:\n{out.stderr}"
