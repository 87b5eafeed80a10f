"""The live pipeline runtime with several workers per module: dispatch, run-time scaling."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from prometheus_client import CollectorRegistry

from taskserver.metrics import PipelineCollector
from taskserver.pard import ScalingConfig
from taskserver.pipeline import (
    ModuleConfig,
    OnnxModel,
    PipelineConfigError,
    PipelineExecutor,
)
from tests.unit.test_pipeline_runtime import (
    FakeRunner,
    chain_modules,
    make_config,
    payload,
    tiny_model,
    until,
)


@pytest.fixture
async def executors():
    made: list[PipelineExecutor] = []

    def make(config, **kw) -> PipelineExecutor:  # type: ignore[no-untyped-def]
        ex = PipelineExecutor(config, **kw)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        await ex.close()


async def test_a_fixed_count_of_workers_spreads_batches_over_them(executors):
    made: list[FakeRunner] = []

    def factory(module: ModuleConfig) -> FakeRunner:
        made.append(FakeRunner(delay_s=0.02))
        return made[-1]

    config = make_config(chain_modules(1), slo_ms=10_000.0, workers=2)
    ex = executors(config, runner_factory=factory)
    assert ex.workers["1"].workers == 2 and len(made) == 2
    await asyncio.gather(*(ex.execute(payload(image_seed=i)) for i in range(24)))
    records = ex.batches("1")
    assert {r.worker for r in records} == {0, 1}
    assert all(runner.sizes for runner in made)  # each session ran batches
    # while one worker runs a batch, the other starts the next: their runs overlap
    spans = sorted((r.started_s, r.ended_s, r.worker) for r in records)
    assert any(a[2] != b[2] and b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_more_than_one_worker_without_a_factory_is_a_config_error():
    config = make_config(chain_modules(1), workers=2)
    with pytest.raises(PipelineConfigError, match=r"workers: 2 per module needs a runner_factory"):
        PipelineExecutor(config, runners={"1": FakeRunner()})


def test_a_bad_worker_count_names_the_field():
    with pytest.raises(PipelineConfigError, match=r"pipeline workers: need an int >= 1"):
        make_config(chain_modules(1), workers=0)


async def test_workers_grow_under_load_and_fall_back_with_real_sessions(executors, tmp_path):
    pytest.importorskip("onnxruntime")
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
        slo_ms=10_000.0,
        providers="cpu",
        intra_op_threads=1,
        workers=scaling,
        worker_mode="thread",  # process workers: tests/integration/test_pipeline_processes.py
    )
    ex = executors(config)
    worker = ex.workers["1"]
    first = worker.runner
    assert worker.workers == 1 and ex.worker_rps("1") == pytest.approx(100.0)
    t0 = time.perf_counter()
    calls = []
    for i in range(450):  # 300 req/s for 1.5 s: ceil(300 / 100 x 1.2) = 4, capped at 3
        calls.append(asyncio.ensure_future(ex.execute(payload(image_seed=i))))
        await asyncio.sleep(1 / 300)
    await asyncio.gather(*calls)
    assert worker.workers >= 2
    records = ex.batches("1")
    assert len({r.worker for r in records}) >= 2  # batches ran on more than one worker
    for replica in worker.replicas[1:]:
        assert isinstance(replica.runner, OnnxModel) and replica.runner is not first
        assert replica.runner.provider == "CPUExecutionProvider"
        assert replica.joined_s >= t0 + scaling.cold_start_s  # served after its cold start
        ran = [r.started_s for r in records if r.worker == replica.index]
        assert not ran or min(ran) >= replica.joined_s
    snap = ex.snapshot()
    assert snap["outcomes"]["on_time"] == 450
    assert snap["modules"]["1"]["scaling_actions"]["start"] >= 1
    registry = CollectorRegistry()
    registry.register(PipelineCollector(ex.snapshot, "gpu-1"))
    labels = {"server": "gpu-1", "pipeline": "test", "dropper": "pard", "module": "1"}
    ready = registry.get_sample_value(
        "tailgate_pipeline_module_workers", {**labels, "state": "ready"}
    )
    assert ready == worker.workers
    started = registry.get_sample_value(
        "tailgate_pipeline_scaling_actions_total", {**labels, "action": "start"}
    )
    assert started is not None and started >= 1
    # no arrivals: 1 wanted, and after the 0.5 s hold the extra workers go
    await until(lambda: worker.workers == 1, timeout_s=10.0)
    assert ex.snapshot()["modules"]["1"]["scaling_actions"]["stop"] >= 1
    await ex.execute(payload(image_seed=1))  # the one left still serves


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "auto"], "--workers only apply with --pipeline"),
        (["--pipeline", "traffic", "--workers", "lots"], "--workers: need an int >= 1 or auto"),
        (
            ["--pipeline", "traffic", "--workers", "2", "--max-workers", "4"],
            "--max-workers and --cold-start-s only apply with --workers auto",
        ),
        (
            ["--pipeline", "traffic", "--workers", "auto", "--cold-start-s", "-1"],
            "--workers auto: workers cold_start_s: must be a finite number >= 0, got -1.0",
        ),
    ],
)
def test_bad_worker_options_exit_2_naming_the_option(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    from deploy.cli import main

    assert main(["taskserver", *flags]) == 2
    assert message in capsys.readouterr().err
