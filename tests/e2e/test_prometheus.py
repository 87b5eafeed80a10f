"""A real Prometheus scrapes a gateway, two task servers and an edge agent on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.conftest import Cluster
from tests.integration.harness import free_port, start_cli
from tests.unit.test_alert_rules import RULES, load_rules
from tests.unit.test_grafana_dashboard import load_dashboard, panel_exprs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMETHEUS = Path(shutil.which("prometheus") or "/usr/bin/prometheus")
PROMTOOL = shutil.which("promtool")
SHIPPED_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
WAIT_S = 30.0


def get_json(url: str, timeout_s: float = 10.0) -> tuple[int, Any]:
    """(status, JSON body) of one GET, 4xx and 5xx included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def post_query(gateway_url: str, body: dict[str, Any]) -> int:
    """POST one query; its HTTP status."""
    req = urllib.request.Request(
        gateway_url + "/v1/queries",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def scrape_config(jobs: dict[str, list[str]], rule_files: tuple[Path, ...] = ()) -> str:
    """A prometheus.yml scraping each job's targets every second (and evaluating rules)."""
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s"]
    lines += ["  evaluation_interval: 1s", f"rule_files: {json.dumps(list(map(str, rule_files)))}"]
    lines += ["scrape_configs:"]
    for job, targets in jobs.items():
        lines += [
            f"  - job_name: {job}",
            "    static_configs:",
            f"      - targets: {json.dumps(targets)}",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Starts Prometheus on a config text (returns its URL once ready); always stops it."""
    if not PROMETHEUS.exists():
        pytest.skip(f"no Prometheus server binary at {PROMETHEUS} (apt install prometheus)")
    procs: list[subprocess.Popen[bytes]] = []
    log_path = tmp_path / "prometheus.log"

    def start(config_text: str) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(config_text)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {proc.returncode}: {log_path.read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return url
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready within {WAIT_S:g} s")

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Gateways, task servers and agents started by the test; always stopped."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def instant(prom_url: str, query: str) -> tuple[int, Any]:
    """One instant query against the Prometheus HTTP API: (HTTP status, body)."""
    return get_json(prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query}))


def series_until(
    prom_url: str, query: str, enough: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Poll an instant query until `enough(result)` holds (at most WAIT_S); the result."""
    deadline = time.monotonic() + WAIT_S
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, body = instant(prom_url, query)
        assert status == 200, body
        result = body["data"]["result"]
        if enough(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{query}: still not there after {WAIT_S:g} s: {result}")


def test_shipped_scrape_config_passes_promtool() -> None:
    if PROMTOOL is None:
        pytest.skip("promtool not installed (it ships with prometheus)")
    out = subprocess.run(
        [PROMTOOL, "check", "config", str(SHIPPED_CONFIG)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = SHIPPED_CONFIG.read_text()
    for job in ("gateway", "taskserver", "edge-agent"):
        assert f"job_name: {job}\n" in text
    assert "scrape_interval: 5s" in text and '"127.0.0.1:8080"' in text


def test_prometheus_scrapes_gateway_task_servers_and_an_edge_agent(
    tmp_path: Path, cluster: Cluster, prometheus: Callable[[str], str]
) -> None:
    gw = cluster.gateway()
    ports = {sid: free_port() for sid in ("ts-1", "ts-2", "edge-1")}
    for sid in ("ts-1", "ts-2"):
        ts = cluster.taskserver(sid, "--gateway", gw.url, "--metrics-port", str(ports[sid]))
        assert ts.info["metrics"] == f"127.0.0.1:{ports[sid]}"
    agent_args = ["edge-agent", "run", "--id", "edge-1", "--cluster", "lab", "--port", "0"]
    agent_args += ["--db", str(tmp_path / "edge-1.db"), "--gateway", gw.url]
    agent_args += ["--sample-interval-s", "0.2", "--metrics-port", str(ports["edge-1"])]
    cluster.procs.append(start_cli(agent_args))
    deadline = time.monotonic() + WAIT_S
    servers: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        servers = get_json(gw.url + "/v1/servers")[1]["servers"]
        if sum(s["state"] == "up" for s in servers) == 3:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"servers never all up: {servers}")
    query = {"class": "B", "targets": {"pool": "default", "all": True}, "task": {}}
    assert [post_query(gw.url, query) for _ in range(20)] == [200] * 20
    if PROMTOOL is not None:
        # Every process's exposition passes promtool's metric lint (names, types, labels).
        for url in (gw.url, *(f"http://127.0.0.1:{p}" for p in ports.values())):
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                text = r.read()
            lint = subprocess.run(
                [PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=30
            )
            assert lint.returncode == 0 and not lint.stdout.strip(), (url, lint.stdout, lint.stderr)
            assert b"_created" not in text and b"tailgate_build_info{" in text, url

    jobs = {
        "gateway": [gw.url.removeprefix("http://")],
        "taskserver": [f"127.0.0.1:{ports['ts-1']}", f"127.0.0.1:{ports['ts-2']}"],
        "edge-agent": [f"127.0.0.1:{ports['edge-1']}"],
    }
    prom = prometheus(scrape_config(jobs, (RULES,)))

    up = series_until(prom, "up", lambda r: len(r) == 4 and all(s["value"][1] == "1" for s in r))
    assert sorted(s["metric"]["job"] for s in up) == [
        "edge-agent",
        "gateway",
        "taskserver",
        "taskserver",
    ]
    answered = series_until(prom, 'tailgate_queries_total{outcome=~"met|missed_slo"}', bool)
    assert {s["metric"]["job"] for s in answered} == {"gateway"}
    assert sum(float(s["value"][1]) for s in answered) == 20
    tasks = series_until(
        prom, 'tailgate_taskserver_tasks_total{status="ok"} > 0', lambda r: len(r) == 2
    )
    assert {(s["metric"]["job"], s["metric"]["server"]) for s in tasks} == {
        ("taskserver", "ts-1"),
        ("taskserver", "ts-2"),
    }
    assert sum(float(s["value"][1]) for s in tasks) == 40
    samples = series_until(prom, "tailgate_edge_agent_samples_total > 0", bool)
    assert [(s["metric"]["job"], s["metric"]["server"]) for s in samples] == [
        ("edge-agent", "edge-1")
    ]
    servers_up = series_until(prom, 'tailgate_servers{state="up"}', lambda r: len(r) == 2)
    assert {s["metric"]["pool"]: s["value"][1] for s in servers_up} == {"default": "2", "edge": "1"}

    # The shipped rules evaluate on what the processes export: class B's error budget (its
    # p99 objective from the gateway) and its burn rate are recorded (NaN here: its 20
    # queries were all in before the first scrape), and no rule fails.
    budget = series_until(prom, "class:tailgate_slo_error_budget:ratio", lambda r: len(r) == 3)
    assert {s["metric"]["class"]: round(float(s["value"][1]), 6) for s in budget} == {
        "A": 0.01,
        "B": 0.01,
        "C": 0.05,
    }
    series_until(prom, 'class:tailgate_slo_burn:rate5m{class="B"}', bool)
    status, body = get_json(prom + "/api/v1/rules")
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert len(rules) == len(load_rules())
    assert [r for r in rules if r["health"] == "err"] == []

    # Every dashboard query is valid PromQL for this Prometheus.
    for title, exprs in panel_exprs(load_dashboard()).items():
        for expr in exprs:
            status, body = instant(prom, as_promql(expr))
            assert status == 200 and body["status"] == "success", (title, expr, body)


GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$quantile": "0.99",
    "$pool": ".*",
    "$class": ".*",
    "$job": ".*",
}


def as_promql(expr: str) -> str:
    """A dashboard expression with its Grafana variables filled in as Grafana would."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr
