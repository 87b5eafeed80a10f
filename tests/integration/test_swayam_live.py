"""A short live replay of a pool scenario under Swayam, beside the pool simulator.

A tiny pool at time scale 10 (about 30 s of wall time): 1 ms tasks, a 4x burst, t_setup
0.2 s, idle retirement after 0.3 s. The gateway starts as `tailgate up --autoscale` does,
its local actuator starts servers for the burst, and the servers beyond Swayam's prefix
retire after it; the report has the live figures beside both simulator modes, and nothing
the replay started is left running. How close the figures are is the benchmark's business
(`python -m loadtests.swayam_live`), not this test's: this machine's load decides it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loadtests.sim.pool import PoolScenario
from loadtests.swayam_live import run_pool_live
from taskserver.service_time import ServiceSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.solo, pytest.mark.timeout(180)]


def _processes_naming(text: str) -> list[int]:
    """PIDs of live processes whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def test_a_short_replay_scales_out_and_back_and_reports_both_sides() -> None:
    scn = PoolScenario(
        service=ServiceSpec(kind="exponential", mean_ms=1.0),
        trace_s=(0.0, 0.4, 0.5, 1.0, 1.1, 2.6),
        trace_rate=(1.0, 1.0, 4.0, 4.0, 1.0, 1.0),
        base_rate_per_s=300.0,
        target_ms=8.0,
        setup_s=0.2,
        idle_s=0.3,
        interval_s=0.1,
        history_s=0.4,
        max_backends=12,
        window_requests=100,
        name="tiny-burst",
    )
    run = run_pool_live(scn, "swayam", scale=10.0)
    text = run.to_text()
    print(text)  # with -s: the figures of this run
    assert run.answered.get(200, 0) >= 0.95 * run.sent, text
    for part in ("live", "sim, random dispatch", "sim, central FIFO", "backend-seconds"):
        assert part in text
    live = run.live
    start = live.servers_at(0.0)
    assert start is not None and live.peak > start, text  # scaled out for the burst
    assert live.timeline[-1][1] < live.peak, text  # and back after it
    assert live.backend_seconds > 0 and 0.0 <= live.compliance <= 1.0
    # each new server counted from the decision that started it (GET /v1/autoscaler)
    assert run.start_delay_s and all(0.0 <= d < 30.0 for d in run.start_delay_s), text
    assert all(s.peak > s.servers_at(0.0) for s in run.sims.values()), text  # type: ignore[operator]
    # `tailgate up` and every server it started are gone
    deadline = time.monotonic() + 10.0
    while _processes_naming(run.gateway_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_naming(run.gateway_url)
