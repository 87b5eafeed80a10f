"""Real processes on loopback: task servers and gateways started through the CLI."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import ports

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0


@dataclass
class Proc:
    """A started process and what it announced on stdout."""

    popen: subprocess.Popen[bytes]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.info["address"])

    @property
    def url(self) -> str:
        return str(self.info["url"])

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(5)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def _read_announcement(p: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    assert p.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                return json.loads(buf.split(b"\n", 1)[0])
    finally:
        sel.close()
    p.kill()
    p.wait(5)
    p.stdout.close()  # else its pipe is reported unclosed in whichever test runs next
    raise RuntimeError(f"process did not announce itself (exit {p.returncode}): {buf!r}")


def start_cli(
    args: Sequence[str],
    *,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    wrap: Sequence[str] = (),
) -> Proc:
    """Start `python -m deploy.cli [--config F] ARGS` and wait for its announcement.

    The child gets this environment without the Tailgate variables, plus `env`; `wrap`
    goes before the command line (`ip netns exec NS` runs it in a network namespace).
    """
    argv = [*wrap, sys.executable, "-m", "deploy.cli", "--log-level", "WARNING"]
    if config is not None:
        argv += ["--config", str(config)]
    argv += list(args)
    named = "--storage-url" in args or (config is not None and "storage_url" in config.read_text())
    if args and args[0] in ("gateway", "up") and not named:
        argv += ["--storage-url", ""]  # history in memory: no store file left in the checkout
    child_env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
        child_env.pop(name, None)
    child_env.update(env or {})
    popen = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, env=child_env)
    return Proc(popen, _read_announcement(popen, START_TIMEOUT_S))


def start_taskserver(
    server_id: str, *args: str, config: Path | None = None, env: Mapping[str, str] | None = None
) -> Proc:
    """A task server on a free loopback port."""
    return start_cli(
        ["taskserver", "--id", server_id, "--port", "0", *args], config=config, env=env
    )


def start_gateway(
    config: Path | None = None, *args: str, env: Mapping[str, str] | None = None
) -> Proc:
    """A gateway on a free loopback port."""
    return start_cli(["gateway", "--port", "0", *args], config=config, env=env)


def free_port() -> int:
    """A loopback port that was free a moment ago, outside the ephemeral range (see
    loadtests.ports: a port 0 bind elsewhere cannot take it before the child binds it)."""
    return ports.free_port()


def child_pids(pid: int) -> list[int]:
    """PIDs of a process's direct children."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(x) for x in out.stdout.split()]
