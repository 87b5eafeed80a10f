"""`tailgate up`: gateway plus task servers and edge agents; Ctrl-C stops them all."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from deploy.launcher import EDGE_CLUSTERS, edge_cluster
from tests.conftest import REPO_ROOT
from tests.integration.harness import child_pids, free_port

pytestmark = pytest.mark.integration

T = TypeVar("T")


@contextlib.contextmanager
def running_up(*args: str, port: int) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`tailgate up ARGS` on `port` (history in memory); yields it and its banner.

    Its own process group, so teardown kills every child whatever the test did.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "up"]
    proc = subprocess.Popen(
        [*argv, "--storage-url", "", *args, "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Ctrl-C" not in banner:
            line = proc.stdout.readline()
            if not line:
                break
            banner += line
        yield proc, banner
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _until_in_flight(base: str, pool: str, timeout_s: float = 10.0) -> None:
    """Poll GET /v1/servers until some server of `pool` holds a task."""
    deadline = time.monotonic() + timeout_s
    servers: list[dict] = []
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/v1/servers", timeout=30) as r:
            servers = json.loads(r.read())["servers"]
        if any(s["pool"] == pool and s["outstanding"] >= 1 for s in servers):
            return
        time.sleep(0.02)
    raise AssertionError(f"no server of pool {pool} ever held a task; last view {servers}")


def test_up_serves_both_pools_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    args = ("--servers", "3", "--edge-agents", "2", "--edge-data", str(tmp_path / "edge"))
    with running_up(*args, "--edge-months", "1", port=port) as (proc, text):
        assert f"http://127.0.0.1:{port}" in text, text
        assert "curl" in text
        assert "edge agent(s) in clusters server-room, wet-lab" in text
        assert "registration token: generated for this run" in text
        children = child_pids(proc.pid)
        assert len(children) == 5
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/v1/servers", timeout=30) as r:
            servers = {s["id"]: s for s in json.loads(r.read())["servers"]}
        assert {sid: s["cluster"] for sid, s in servers.items()} == {
            "ts-1": None,
            "ts-2": None,
            "ts-3": None,
            "edge-1": "server-room",
            "edge-2": "wet-lab",
        }
        # up never leaves registration open: its servers got the token it generated.
        status, ans = _post(base + "/v1/servers", {"id": "x", "address": "127.0.0.1:1"})
        assert status == 401 and ans["error"]["field"] == "Authorization"
        url = f"http://127.0.0.1:{port}/v1/queries"
        status, ans = _post(
            url,
            {"class": "A", "targets": {"pool": "default", "all": True}, "task": {"service_ms": 2}},
        )
        assert status == 200, ans
        assert ans["fanout"] == 3
        latest = {"op": "latest", "sensor": "temperature"}
        status, ans = _post(
            url, {"class": "C", "targets": {"pool": "edge", "all": True}, "task": latest}
        )
        assert status == 200, ans
        assert sorted(t["server"] for t in ans["tasks"]) == ["edge-1", "edge-2"]
        # Real agents on their seeded stores, each answering from its own readings.
        assert {t["result"]["agent"] for t in ans["tasks"]} == {"edge-1", "edge-2"}
        assert all(isinstance(t["result"]["value"], float) for t in ans["tasks"])
        assert sorted(p.name for p in (tmp_path / "edge").glob("*.db")) == [
            "edge-1.db",
            "edge-2.db",
        ]
        status, ans = _post(
            url, {"class": "C", "targets": {"pool": "edge", "per_cluster": 1}, "task": latest}
        )
        assert status == 200, ans
        assert sorted(t["server"] for t in ans["tasks"]) == ["edge-1", "edge-2"]
        # The bundled client: an answer on stdout, exit 0; a bad query names the field, exit 1.
        cli = [sys.executable, "-m", "deploy.cli", "query", "--url", f"http://127.0.0.1:{port}"]
        ok = subprocess.run(
            [*cli, "--class", "B", "--fanout", "2", "--task", '{"echo": 7}'],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
        answer = json.loads(ok.stdout)
        assert answer["fanout"] == 2 and [t["result"]["echo"] for t in answer["tasks"]] == [7, 7]
        bad = subprocess.run(
            [*cli, "--fanout", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
        )
        assert bad.returncode == 1
        assert "HTTP 400" in bad.stderr and "targets.fanout" in bad.stderr
        # Ctrl-C drains: a query in flight is still answered, then everything stops.
        slow = {
            "slo": {"percentile": 99, "latency_ms": 5000},
            "targets": {"pool": "default", "fanout": 1},
            "task": {"service_ms": 700},
        }
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(_post, url, slow)
            _until_in_flight(base, "default")  # the gateway holds it: the drain must answer it
            proc.send_signal(signal.SIGINT)
            assert in_flight.result(timeout=15)[0] == 200
        proc.wait(15)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 0, err
        assert "gateway drained 1 queries" in err, err
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_up_runs_dense_edge_agents_in_few_processes(tmp_path: Path) -> None:
    port = free_port()
    args = ("--servers", "0", "--edge-agents", "8", "--agents-per-process", "2",
            "--edge-read-sample", "0.5", "--edge-seed", "3", "--edge-months", "1",
            "--edge-data", str(tmp_path / "edge"))  # fmt: skip
    with running_up(*args, port=port) as (proc, text):
        assert (
            "8 edge agent(s) in clusters server-room, wet-lab, faculty, gta (4 processes)" in text
        ), text
        assert len(child_pids(proc.pid)) == 4  # a process per cluster, each of two agents
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/v1/servers", timeout=30) as r:
            servers = {s["id"]: s for s in json.loads(r.read())["servers"]}
        assert {sid: s["cluster"] for sid, s in servers.items()} == {
            f"edge-{i + 1}": edge_cluster(i, 8) for i in range(8)
        }
        assert len({s["address"] for s in servers.values()}) == 8
        # Only each process's first agent has a store: the process shares it.
        assert sorted(p.name for p in (tmp_path / "edge").glob("*.db")) == [
            "edge-1.db",
            "edge-3.db",
            "edge-5.db",
            "edge-7.db",
        ]
        end = datetime.now(UTC) - timedelta(days=1)
        week = {"op": "range", "sensor": "temperature",
                "start": (end - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "end": end.strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip
        url = base + "/v1/queries"
        for _ in range(3):
            status, ans = _post(
                url, {"class": "C", "targets": {"pool": "edge", "all": True}, "task": week}
            )
            assert status == 200, ans
            assert {t["server"] for t in ans["tasks"]} == {f"edge-{i}" for i in range(1, 9)}
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
        assert proc.returncode == 0


def test_edge_servers_fill_the_four_clusters_in_blocks() -> None:
    got = [edge_cluster(i, 32) for i in range(32)]
    assert got == [c for c in EDGE_CLUSTERS for _ in range(8)]
    assert EDGE_CLUSTERS[0] == "server-room"
    assert [edge_cluster(i, 6) for i in range(6)] == [
        "server-room",
        "server-room",
        "wet-lab",
        "wet-lab",
        "faculty",
        "faculty",
    ]


def test_killed_up_takes_its_task_servers_with_it() -> None:
    with running_up("--edge-agents", "0", "--servers", "2", port=free_port()) as (proc, _):
        children = child_pids(proc.pid)
        assert len(children) == 2
        proc.kill()  # no chance to clean up: the servers must notice on their own
        proc.wait(5)
        deadline = time.monotonic() + 10
        alive = children
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in children if _alive(p)]
        assert not alive, f"orphaned task servers: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie no one reaps any more still answers kill(0): check its state.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_up_runs_an_onnx_pipeline_pool() -> None:
    pytest.importorskip("onnxruntime")
    port = free_port()
    args = ("--servers", "1", "--edge-agents", "0", "--pipeline-servers", "1")
    with running_up(*args, port=port) as (proc, banner):
        assert "1 traffic pipeline server(s)" in banner, banner
        assert '"pool": "pipeline"' in banner  # the banner's example query
        status, ans = _post(
            f"http://127.0.0.1:{port}/v1/queries",
            {
                "slo": {"percentile": 99, "latency_ms": 2000},
                "targets": {"pool": "pipeline", "fanout": 1},
                "task": {"image_seed": 3},
            },
        )
        assert status == 200, ans
        (task,) = ans["tasks"]
        assert task["server"] == "pipe-1"
        assert task["result"]["pipeline"] == "traffic" and "3" in task["result"]["outputs"]
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        assert proc.returncode == 0


def test_up_without_onnxruntime_names_the_extra(tmp_path: Path) -> None:
    hide = tmp_path / "site"
    hide.mkdir()
    (hide / "onnxruntime.py").write_text("raise ImportError('hidden for this test')\n")
    env = dict(os.environ, PYTHONPATH=str(hide))
    env.pop("TAILGATE_CONFIG", None)
    argv = [sys.executable, "-m", "deploy.cli", "up", "--pipeline-servers", "1"]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "pip install -e '.[onnx]'" in done.stderr, done.stderr


def _servers(base: str) -> dict[str, dict[str, Any]]:
    """GET /v1/servers, by server id."""
    with urllib.request.urlopen(base + "/v1/servers", timeout=30) as r:
        return {s["id"]: s for s in json.loads(r.read())["servers"]}


def _until(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll `probe` until it returns something other than None; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got is not None:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{what} within {timeout_s:g} s")


def _pid_of(up_pid: int, server_id: str) -> int | None:
    """PID of the live child of `up` that runs server `server_id` (by its --id argument)."""
    for pid in child_pids(up_pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
            if _alive(pid) and any(
                a == "--id" and b == server_id for a, b in itertools.pairwise(argv)
            ):
                return pid
    return None


def _query(base: str, server_id: str) -> tuple[int, dict]:
    body = {"class": "A", "targets": {"servers": [server_id]}, "task": {"service_ms": 2}}
    return _post(base + "/v1/queries", body)


def test_a_killed_task_server_is_restarted_while_the_others_keep_serving() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_up("--servers", "3", "--edge-agents", "0", port=port) as (proc, banner):
        assert "Ctrl-C" in banner, banner
        before = _servers(base)
        assert {sid: s["state"] for sid, s in before.items()} == dict.fromkeys(
            ("ts-1", "ts-2", "ts-3"), "up"
        )
        others = [_pid_of(proc.pid, sid) for sid in ("ts-1", "ts-3")]
        victim = _pid_of(proc.pid, "ts-2")
        assert victim is not None and None not in others
        os.kill(victim, signal.SIGKILL)  # as the OOM killer would
        # The gateway notices the lost connection: ts-2 is down (until its successor registers).
        _until(
            # (absent for a moment when its successor re-registers at a new address)
            lambda: True if _servers(base).get("ts-2", {}).get("state") != "up" else None,
            10,
            "the gateway never marked the killed ts-2 down",
        )
        assert proc.poll() is None, "up stopped when one child died"
        for sid in ("ts-1", "ts-3"):
            status, ans = _query(base, sid)
            assert status == 200, ans
            assert [t["server"] for t in ans["tasks"]] == [sid]
        # It comes back: a new process on a new port, registered and up again.
        back = _until(
            lambda: (
                s
                if (s := _servers(base).get("ts-2", {})).get("state") == "up"
                and s["address"] != before["ts-2"]["address"]
                else None
            ),
            20,
            "ts-2 did not come back up at a new address",
        )
        successor = _pid_of(proc.pid, "ts-2")
        assert successor is not None and successor != victim, back
        status, ans = _query(base, "ts-2")
        assert status == 200, ans
        assert [_pid_of(proc.pid, sid) for sid in ("ts-1", "ts-3")] == others  # untouched
        assert proc.poll() is None
        # Only SIGTERM (or Ctrl-C) of up stops everything: drain first, then the children.
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 0, err
        restarts = [line for line in err.splitlines() if "restarting" in line]
        assert len(restarts) == 1, err
        assert re.fullmatch(
            r"tailgate: server ts-2 exited \(killed by SIGKILL\); "
            r"restarting in 0\.[4-6] s \(restart 1\)",
            restarts[0],
        ), restarts
        assert "tailgate: gateway drained" in err and "tailgate: stopped" in err, err
        assert child_pids(proc.pid) == []
        left = [pid for pid in (*others, successor) if pid is not None and _alive(pid)]
        assert not left, f"children left behind: {left}"


def test_a_server_that_cannot_start_fails_up_at_once() -> None:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TAILGATE_CONFIG", "TAILGATE_AGENT_TOKEN", "TAILGATE_AGENT_TOKEN_FILE"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "up"]
    argv += ["--storage-url", "", "--servers", "1", "--edge-agents", "0", "--metrics-ports"]
    with socket.socket() as taken:
        # ts-1's --metrics-ports port is in use: that server can never start, so up must
        # not restart it forever but fail, naming it.
        with contextlib.suppress(OSError):  # if someone else holds it, just as good
            taken.bind(("127.0.0.1", port + 100))
            taken.listen()
        done = subprocess.run(
            [*argv, "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert re.search(
        r"tailgate up: server ts-1 exited during start-up \(exit code \d+\)", done.stderr
    ), done.stderr
    assert "restarting" not in done.stderr
