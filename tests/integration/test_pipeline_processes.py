"""Workers in their own processes: real onnxruntime children, their answers, losses, scaling
and shutdown (worker_mode process)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from onnx_models.pipeline_config import pipeline_config
from taskserver.metrics import PipelineCollector
from taskserver.pard import ScalingConfig
from taskserver.pipeline import (
    InferenceFailed,
    ModuleConfig,
    OnnxModel,
    PipelineConfig,
    PipelineConfigError,
    PipelineExecutor,
    ProcessRunner,
    WorkerLost,
)
from taskserver.pipeline.sessions import CPU
from tests.integration.harness import child_pids, start_taskserver
from tests.unit.test_pipeline_runtime import make_config, payload, tiny_model, until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]


def traffic(**overrides: object) -> PipelineConfig:
    """The shipped traffic pipeline on the CPU, one intra-op thread per session."""
    config = pipeline_config("traffic", providers="cpu")
    return dataclasses.replace(config, intra_op_threads=1, **overrides)


def gone(pid: int) -> bool:
    """The process has ended (reaped, or a zombie no one has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def worker_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("tailgate-worker")]


@pytest.fixture
async def executors() -> AsyncIterator[Callable[..., PipelineExecutor]]:
    made: list[PipelineExecutor] = []

    def make(config: PipelineConfig, **kw: object) -> PipelineExecutor:
        made.append(PipelineExecutor(config, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for ex in made:
        await ex.close()
    assert not worker_children()  # every child stopped


# ---- one ProcessRunner ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["shared", "pipe"])
def test_a_process_runner_answers_as_the_session_does_in_this_process(
    tmp_path: Path, transport: str
) -> None:
    model = tiny_model(tmp_path / "det.onnx", (3, 16, 16), "detections", (6, 5))
    module = ModuleConfig("1", "detector", model, batch_sizes=(1, 2, 4))
    local = OnnxModel(module, [CPU], intra_op_threads=1)
    runner = ProcessRunner(module, [CPU], intra_op_threads=1, transport=transport)
    try:
        assert runner.alive and runner.pid != os.getpid()
        assert (runner.provider, runner.output_name) == ("CPUExecutionProvider", "detections")
        assert runner.input_shape == (3, 16, 16) and runner.input_dtype == np.float32
        rng = np.random.default_rng(3)
        for n in (1, 3, 4, 9):  # 9: beyond the largest feasible size, so it travels inline
            rows = [rng.random((3, 16, 16), dtype=np.float32) for _ in range(n)]
            buffer = runner.batch_buffer(n)
            assert (buffer is None) == (transport == "pipe" or n > 4)
            batch = np.stack(rows) if buffer is None else np.stack(rows, out=buffer)
            out = runner.run(batch)
            np.testing.assert_array_equal(out, local.run(np.stack(rows)))
        assert runner.batches == 4 and runner.exec_ns > 0 and runner.hop_ns > 0
        with pytest.raises(InferenceFailed, match=r"detector.*inference failed"):
            runner.run(np.zeros((2, 3, 8, 8), dtype=np.float32))  # the wrong shape
        assert runner.alive  # a failed batch is not a lost worker
        assert runner.run(np.zeros((1, 3, 16, 16), dtype=np.float32)).shape == (1, 6, 5)
    finally:
        runner.close()
    assert not runner.alive and gone(runner.pid or 0)


def test_a_worker_that_stops_answering_is_killed_and_can_be_restarted(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "cls.onnx", (1, 8, 8), "logits", (7,))
    module = ModuleConfig("1", "classifier", model, batch_sizes=(1, 2))
    runner = ProcessRunner(module, [CPU], answer_timeout_s=0.5)
    try:
        stuck = runner.pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)  # alive, but answers nothing
        start = time.monotonic()
        with pytest.raises(WorkerLost, match=r"did not answer within 0.5 s \(killed\)"):
            runner.run(np.zeros((1, 1, 8, 8), dtype=np.float32))
        assert time.monotonic() - start < 5 and not runner.alive
        with pytest.raises(WorkerLost):  # lost stays lost until restarted
            runner.run(np.zeros((1, 1, 8, 8), dtype=np.float32))
        runner.restart()
        assert runner.alive and runner.pid != stuck and gone(stuck) and runner.starts == 2
        assert runner.run(np.zeros((2, 1, 8, 8), dtype=np.float32)).shape == (2, 7)
    finally:
        runner.close()


async def test_a_model_that_cannot_load_is_a_config_error_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    good = tiny_model(tmp_path / "cls.onnx", (1, 8, 8), "logits", (7,))
    modules = (
        ModuleConfig("1", "first", good, subs=("2",)),
        ModuleConfig("2", "broken", bad, pres=("1",)),
    )
    config = make_config(modules, providers="cpu", worker_mode="process", workers=2)
    with pytest.raises(PipelineConfigError, match=r"module broken \(id 2\) model: cannot load"):
        PipelineExecutor(config)
    assert not worker_children()  # the children already started were stopped too


# ---- an executor with process workers -----------------------------------------------------


async def test_process_workers_answer_exactly_as_thread_workers(executors) -> None:
    answers = {}
    for mode in ("thread", "process"):
        ex = executors(traffic(worker_mode=mode))
        assert ex.worker_mode == mode
        bodies = [
            json.loads(await ex.execute(payload(image_seed=seed, budget_ms=60_000, top_k=5)))
            for seed in range(6)
        ]
        answers[mode] = [b["outputs"] for b in bodies]
        assert ex.snapshot()["worker_mode"] == mode
        await ex.close()
    assert answers["process"] == answers["thread"]
    burst = executors(traffic(worker_mode="process", workers=2))
    pids = [p for w in burst.snapshot()["modules"].values() for p in w["worker_pids"]]
    assert len(set(pids)) == 6 and os.getpid() not in pids  # a child per worker
    bodies = await asyncio.gather(
        *(burst.execute(payload(image_seed=s, budget_ms=60_000)) for s in range(12))
    )
    assert all(json.loads(b)["outputs"]["3"]["shape"] == [48, 37] for b in bodies)
    assert burst.snapshot()["modules"]["1"]["hop_s"] > 0  # the hop is measured


async def test_a_worker_process_killed_mid_batch_fails_that_batch_and_is_replaced(
    executors,
) -> None:
    ex = executors(traffic(worker_mode="process"))
    worker = ex.workers["1"]
    replica = worker.replicas[0]
    runner = replica.runner
    first = runner.pid
    calls = [ex.execute(payload(image_seed=s, budget_ms=60_000)) for s in range(64)]
    done = asyncio.ensure_future(asyncio.gather(*calls, return_exceptions=True))
    await until(lambda: replica.future is not None and bool(replica.flights), timeout_s=20)
    # Stopped first, so the batch cannot end between the look and the kill.
    os.kill(first, signal.SIGSTOP)
    held = len(replica.flights)
    os.kill(first, signal.SIGKILL)
    results = await asyncio.wait_for(done, 60)  # every request ends: none hangs
    lost = [r for r in results if isinstance(r, WorkerLost)]
    assert len(lost) == held >= 1
    assert f"worker process {first} killed by SIGKILL while running a batch of {held}" in str(
        lost[0]
    )
    assert all(isinstance(r, bytes) for r in results if not isinstance(r, WorkerLost))
    await until(lambda: replica.future is None and runner.alive, timeout_s=30)
    assert runner.pid != first and gone(first)
    module = ex.snapshot()["modules"]["1"]
    assert (module["worker_crashes"], module["worker_restarts"]) == (1, 1)
    assert module["worker_pids"] == [runner.pid]
    registry = CollectorRegistry()
    registry.register(PipelineCollector(ex.snapshot, "gpu-1"))
    labels = {"server": "gpu-1", "pipeline": "traffic", "dropper": "pard", "module": "1"}
    assert registry.get_sample_value("tailgate_pipeline_worker_crashes_total", labels) == 1
    assert json.loads(await ex.execute(payload(image_seed=1, budget_ms=60_000)))["outputs"]


async def test_an_idle_worker_process_that_died_is_replaced_before_its_next_batch(
    executors,
) -> None:
    ex = executors(traffic(worker_mode="process"))
    runner = ex.workers["2"].replicas[0].runner
    first = runner.pid
    os.kill(first, signal.SIGKILL)
    await until(lambda: not runner.alive)
    body = json.loads(await ex.execute(payload(image_seed=4, budget_ms=60_000)))
    assert body["outputs"]["3"]["shape"] == [48, 37]  # nothing failed: it was replaced first
    assert runner.pid != first and runner.alive
    snap = ex.snapshot()
    assert snap["modules"]["2"]["worker_crashes"] == 1 and snap["outcomes"]["failed"] == 0


async def test_process_workers_scale_out_and_in(executors, tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "cls.onnx", (1, 8, 8), "logits", (7,))
    module = ModuleConfig("1", "classifier", model, batch_sizes=(1, 2, 4, 8))
    # profiled d_k(b) = 10 b ms: one worker does 8 / 0.08 s = 100 req/s
    scaling = ScalingConfig(
        max_workers=3,
        total_workers=3,
        cold_start_s=0.2,
        hold_s=0.5,
        rate_window_s=0.5,
        period_s=0.1,
    )
    config = make_config(
        [module],
        duration_ms=10.0,
        slo_ms=30_000.0,
        providers="cpu",
        intra_op_threads=1,
        workers=scaling,
        worker_mode="process",
    )
    ex = executors(config)
    worker = ex.workers["1"]
    first = worker.replicas[0].runner
    calls = []
    for i in range(600):  # 300 req/s for 2 s: the scaler wants 3 workers
        calls.append(asyncio.ensure_future(ex.execute(payload(image_seed=i))))
        await asyncio.sleep(1 / 300)
    await until(lambda: worker.workers >= 2, timeout_s=30)  # spawned, loaded, warm, joined
    await asyncio.gather(*calls)
    grown = [r.runner for r in worker.replicas[1:]]
    assert all(isinstance(r, ProcessRunner) and r.alive for r in grown)
    pids = {r.pid for r in (first, *grown)}
    assert len(pids) == len(grown) + 1 and os.getpid() not in pids
    # no arrivals: after the hold the extra workers go, their processes stopped
    await until(lambda: worker.workers == 1, timeout_s=30)
    await until(lambda: all(gone(r.pid or 0) for r in grown), timeout_s=15)
    assert worker.replicas[0].runner is first and first.alive
    assert ex.snapshot()["modules"]["1"]["scaling_actions"]["stop"] >= 1
    assert isinstance(await ex.execute(payload(image_seed=1)), bytes)


# ---- the task server -----------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_pipeline_task_server_leaves_no_worker_process_behind(stop: str) -> None:
    proc = start_taskserver(
        "ts-proc", "--pipeline", "traffic", "--providers", "cpu", "--worker-mode", "process"
    )
    try:
        children = child_pids(proc.popen.pid)
        assert len(children) >= 3  # a worker per module (and multiprocessing's tracker)
    finally:
        if stop == "SIGTERM":
            proc.stop()
            assert proc.popen.returncode == 0
        else:
            proc.kill()
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(gone(pid) for pid in children):
        time.sleep(0.05)
    assert [pid for pid in children if not gone(pid)] == []
