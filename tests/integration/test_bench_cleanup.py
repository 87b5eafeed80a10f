"""A benchmark that starts a gateway and task servers stops them when it is stopped:
by SIGTERM in the middle of its run, or when its servers never come up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(120)
def test_sigterm_stops_a_scale_benchmark_and_every_process_it_started(tmp_path: Path) -> None:
    argv = ["--servers", "4", "--per-process", "2", "--queries", "1000000", "--idle-s", "0.5",
            "--settle-s", "0.5"]  # fmt: skip
    bench = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench_scale", *argv],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(started) < 3 and time.monotonic() < deadline:  # a gateway, 2 server processes
            started = _children(bench.pid)
            time.sleep(0.2)
        assert len(started) == 3, started
        time.sleep(3)  # into its queries (a million: it would run for many minutes)
        assert bench.poll() is None
        bench.send_signal(signal.SIGTERM)
        bench.wait(30)
        left = [pid for pid in started if _alive(pid)]
        assert left == [], f"still running after the benchmark stopped: {left}"
    finally:  # what a failure left behind: reparented once the benchmark is gone
        for pid in {*started, *_children(bench.pid)}:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
        bench.communicate()


@pytest.mark.timeout(60)
async def test_servers_that_do_not_come_up_in_time_are_stopped_with_the_gateway() -> None:
    from loadtests.bench_http import Gateway

    gw = Gateway(servers=4, per_process=2, up_timeout_s=0.0)  # no time to come up at all
    try:
        with pytest.raises(RuntimeError, match="task servers came up"):
            async with gw:
                pytest.fail("up with no time to come up")
        started = [p.pid for p in gw.fleet] + ([gw.proc.pid] if gw.proc is not None else [])
        assert len(started) == 3
        assert all(p.returncode is not None for p in [*gw.fleet, gw.proc] if p is not None)
        assert [pid for pid in started if _alive(pid)] == []
    finally:  # what a failure left behind
        for p in [*gw.fleet, gw.proc]:
            if p is not None and p.returncode is None:
                p.kill()
                await p.wait()


@pytest.mark.timeout(90)
async def test_a_scale_run_with_busy_servers_registers_the_rest_in_pool_spare(
    tmp_path: Path,
) -> None:
    # `bench_scale --busy K`: K servers take the queries in pool default, the rest register
    # in pool spare, no process spanning both; the benchmark's own configuration is used.
    import aiohttp

    from loadtests.bench_http import Gateway

    config = tmp_path / "two.toml"
    config.write_text('[[pools]]\nname = "default"\n\n[[pools]]\nname = "spare"\n')
    async with Gateway(7, 3, config=str(config), busy=4) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.url + "/v1/servers") as r:
                listing = await r.json()
    assert len(gw.fleet) == 3  # 3 and 1 in default, 3 in spare
    pools: dict[str, set[str]] = {}
    for view in listing["servers"]:
        pools.setdefault(view["pool"], set()).add(view["id"].split("-")[0])
    assert sorted(pools) == ["default", "spare"]
    assert sum(1 for v in listing["servers"] if v["pool"] == "default") == 4
    assert pools["default"].isdisjoint(pools["spare"])  # a process's servers share a pool


def test_a_scale_run_refuses_busy_with_a_configuration_without_pool_spare(
    tmp_path: Path,
) -> None:
    config = tmp_path / "one.toml"
    config.write_text('[[pools]]\nname = "default"\n')
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.bench_scale", "--servers", "4", "--busy", "2",
         "--config", str(config)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "must name the pools default and spare" in out.stderr


@pytest.mark.timeout(90)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="isolating needs 2 CPUs")
async def test_an_isolated_run_gives_the_gateway_a_cpu_of_its_own() -> None:
    # `bench_http --isolate`: the gateway on the last CPU, the task servers and the
    # benchmark itself on the others; the benchmark's own CPUs come back on exit.
    from loadtests.bench_http import Gateway

    before = os.sched_getaffinity(0)
    last = max(before)
    async with Gateway(3, 2, isolate=True) as gw:
        assert gw.proc is not None and gw.gateway_cpus == {last}
        assert os.sched_getaffinity(gw.proc.pid) == {last}
        for p in gw.fleet:
            assert os.sched_getaffinity(p.pid) == before - {last}
        assert os.sched_getaffinity(0) == before - {last}
    assert os.sched_getaffinity(0) == before


@pytest.mark.timeout(90)
async def test_a_latency_run_measures_its_queries_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench_latency through the benchmarks' Gateway: servers hosted several to a process,
    # its history in memory (an SQLite file in the working directory before).
    from loadtests.bench_latency import measure

    monkeypatch.chdir(tmp_path)
    m = await measure(3, 20, per_process=2)
    assert 0 < m["dispatch_p50"] <= m["added_p50"] and m["cpu"] > 0
    assert m["reads"] > 0 and m["writes"] > 0
    assert os.listdir(tmp_path) == []
