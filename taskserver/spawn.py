"""The command line that starts one task server: built here, once, for every launcher.

`tailgate up` (deploy.launcher), the local autoscaling actuator (through the gateway),
the load tests' server fleets (loadtests.procs) and the wire fuzzer all start task servers
with `taskserver_argv`, so a flag added to ``tailgate taskserver`` is added in one place.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from taskserver.logformat import current_log_format

__all__ = ["tailgate_argv", "taskserver_argv"]


def tailgate_argv(
    config_path: str | None = None, log_level: str = "WARNING", log_format: str | None = None
) -> list[str]:
    """``python -m deploy.cli [--config FILE] --log-level LEVEL [--log-format json]`` with this
    interpreter. The log format is this process's own unless given (children share the
    parent's stderr, so they write the same format)."""
    fmt = current_log_format() if log_format is None else log_format
    return [
        sys.executable,
        "-m",
        "deploy.cli",
        *(["--config", config_path] if config_path else []),
        "--log-level",
        log_level,
        *(["--log-format", fmt] if fmt != "text" else []),
    ]


def taskserver_argv(
    server_id: str,
    *,
    host: str | None = None,
    port: int = 0,
    gateway_url: str | None = None,
    pool: str | None = None,
    slots: int | None = None,
    policy: str | None = None,
    metrics_port: int | None = None,
    config_path: str | None = None,
    exit_with_parent: bool = False,
    log_level: str = "WARNING",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``tailgate taskserver`` with these options (None: the option is left out)."""
    argv = [*tailgate_argv(config_path, log_level), "taskserver"]
    if exit_with_parent:
        argv.append("--exit-with-parent")  # a parent that dies takes its servers with it
    argv += ["--id", server_id]
    if host is not None:
        argv += ["--host", host]
    argv += ["--port", str(port)]
    if gateway_url is not None:
        argv += ["--gateway", gateway_url]
    if pool is not None:
        argv += ["--pool", pool]
    if policy:
        argv += ["--policy", str(policy)]
    if slots is not None:
        argv += ["--slots", str(slots)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return [*argv, *extra_args]
