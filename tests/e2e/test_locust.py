"""Locust drives `tailgate up` with the fanout and SaaS mixes, closed and open loop.

Locust runs as a subprocess only: it monkey-patches the standard library with gevent.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtests.locust_mix import OUTCOMES
from tests.conftest import REPO_ROOT
from tests.integration.harness import free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(  # find_spec only looks: importing locust here would monkey-patch
        importlib.util.find_spec("locust") is None, reason="locust not installed (test extra)"
    ),
]

LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"
LOCUST_TIMEOUT_S = 60


@contextlib.contextmanager
def tailgate_up(cwd: Path, *args: str, up_args: tuple[str, ...] = ()) -> Iterator[str]:
    """`tailgate [args] up [up_args]` in `cwd` (its history store lands there); its URL
    once it is up; stopped after."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", *args]
    argv += ["up", "--port", str(port), *up_args]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,  # its own group, so a failed test can kill every child
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        banner = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            banner.append(line)
            if "Ctrl-C" in line:
                break
        assert any("Ctrl-C" in line for line in banner), "".join(banner)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tailgate up` with the SaaS classes, 2 task servers and 2 edge agents; stopped after."""
    data = tmp_path_factory.mktemp("edge")
    config = ("--config", str(REPO_ROOT / "deploy" / "saas.toml"))
    edge = ("--servers", "2", "--edge-agents", "2", "--edge-months", "1", "--edge-data", str(data))
    with tailgate_up(data, *config, up_args=edge) as url:
        yield url


def run_locust(url: str, csv_prefix: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A headless Locust run to completion (bounded), writing its CSV stats."""
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", url]
    argv += ["--csv", str(csv_prefix), "--only-summary", *args]
    return subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=LOCUST_TIMEOUT_S
    )


def stats_rows(csv_prefix: Path) -> list[dict[str, str]]:
    """Rows of <prefix>_stats.csv, the Aggregated row left out."""
    with open(f"{csv_prefix}_stats.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["Name"] != "Aggregated"]


def final_stats(csv_prefix: Path) -> dict[str, Any]:
    """<prefix>_final.json: the run's stats as they ended (the locustfile writes it at exit;
    Locust's CSV files are its last once-a-second snapshot, which on a busy machine can
    predate a short run's requests)."""
    with open(f"{csv_prefix}_final.json", encoding="utf-8") as f:
        return json.load(f)


def test_closed_loop_fanout_and_saas_mixes_report_per_class_slo_outcomes(
    gateway_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "closed"
    run = run_locust(
        gateway_url, out, "-u", "4", "-r", "4", "-t", "8s", "--check-slo", "FanoutUser", "SaasUser"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = stats_rows(out)
    http = {r["Name"]: int(r["Request Count"]) for r in rows if r["Type"] == "POST"}
    assert http["fanout 1 (class A)"] > 0 and http["fanout all (class B)"] > 0
    assert http["saas class A"] > 0 and http["saas class B"] > 0
    slo = {(r["Type"], r["Name"]): int(r["Request Count"]) for r in rows if r["Type"] != "POST"}
    assert all(t.startswith("SLO class ") and n in OUTCOMES for t, n in slo)
    assert slo[("SLO class A", "met")] > 0 and slo[("SLO class B", "met")] > 0
    # One SLO outcome per query: the SLO rows add up to the HTTP rows.
    assert sum(slo.values()) == sum(http.values())
    # The final stats (written at exit) hold at least the CSV's last snapshot.
    final = final_stats(out)
    assert final["exit_code"] == 0 and final["errors"] == []
    ended = {e["name"]: e["num_requests"] for e in final["stats"] if e["method"] == "POST"}
    assert all(ended[name] >= n for name, n in http.items()), (ended, http)
    assert [r for r in rows if int(r["Failure Count"])] == []
    with open(f"{out}_failures.csv", newline="") as f:
        assert list(csv.DictReader(f)) == []
    assert "Per-class SLO summary" in run.stdout
    # --check-slo judges a class only on enough queries (100 at p99): class A gets hundreds
    # here, so it is decided; the rarer classes may stay "not judged" and cannot fail the run.
    verdicts = {
        line.split(":")[0].strip(): line
        for line in run.stdout.splitlines()
        if line.startswith("  class ")
    }
    assert verdicts["class A"].endswith("MEETS its SLO"), run.stdout[-3000:]


def test_open_loop_arrivals_keep_their_rate(gateway_url: str, tmp_path: Path) -> None:
    out = tmp_path / "open"
    rate, seconds = 40, 6
    run = run_locust(
        gateway_url, out, "-u", "2", "-r", "10", "-t", f"{seconds}s", "--rate", str(rate)
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = stats_rows(out)
    # What was sent in the whole run: the CSV is Locust's last once-a-second snapshot.
    sent = sum(e["num_requests"] for e in final_stats(out)["stats"] if e["method"] == "POST")
    # Poisson arrivals: 240 expected; the bounds leave room for a slow start on a busy host.
    assert 0.5 * rate * seconds <= sent <= 1.4 * rate * seconds, sent
    assert {r["Name"] for r in rows if r["Type"] == "POST"} <= {
        "fanout 1 (class A)",
        "fanout 10 (class A)",
        "fanout all (class B)",
    }  # the SaaS and pipeline users are opt-in
    assert [r for r in rows if int(r["Failure Count"])] == []


def test_with_its_api_key_locust_loads_a_gateway_whose_queries_need_one(tmp_path: Path) -> None:
    # A tenant's key makes queries need one (gateway.auth): without it every query is a
    # 401 and Locust fails the run; with --api-key (or TAILGATE_API_KEY) the mix runs.
    keys = tmp_path / "acme.keys"
    keys.write_text("acme-locust-key-0123456789abcdef\n")
    config = tmp_path / "keys.toml"
    config.write_text(f'[tenants.acme]\napi_keys_file = "{keys}"\n')
    with tailgate_up(tmp_path, "--config", str(config), up_args=("--servers", "2")) as url:
        refused = run_locust(url, tmp_path / "nokey", "-u", "2", "-r", "2", "-t", "3s")
        assert refused.returncode == 1, refused.stdout[-2000:] + refused.stderr[-2000:]
        final = final_stats(tmp_path / "nokey")
        assert final["exit_code"] == 1
        failures = [e for e in final["stats"] if e["num_failures"]]
        assert failures and all(e["method"] == "POST" for e in failures)
        errors = [e["error"] for e in final["errors"]]
        # 401s, then 429 slowed_down: the gateway slows a client that keeps failing auth.
        assert any("HTTP 401" in e for e in errors), errors
        assert all("HTTP 401" in e or "HTTP 429 slowed_down" in e for e in errors), errors
        keyed = run_locust(
            url, tmp_path / "key", "-u", "2", "-r", "2", "-t", "3s",
            "--api-key", "acme-locust-key-0123456789abcdef",
        )  # fmt: skip
        assert keyed.returncode == 0, keyed.stdout[-2000:] + keyed.stderr[-2000:]
        final = final_stats(tmp_path / "key")
        assert sum(e["num_requests"] for e in final["stats"] if e["method"] == "POST") > 0
        assert [e for e in final["stats"] if e["num_failures"]] == final["errors"] == []
