"""Worker modes: which one ``auto`` picks, and how a module replaces a worker it lost."""

from __future__ import annotations

import asyncio
import threading

import pytest

import taskserver.pipeline.worker as worker_module
from taskserver.pipeline import (
    InferenceFailed,
    ModuleConfig,
    PipelineConfigError,
    PipelineExecutor,
    WorkerLost,
    resolve_worker_mode,
)
from taskserver.pipeline.sessions import CPU, CUDA, PROCESS_MIN_CPUS
from tests.unit.test_pipeline_runtime import FakeRunner, chain_modules, make_config, payload, until

# ---- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "providers", "cpus", "expected"),
    [
        ("auto", [CPU], PROCESS_MIN_CPUS, "process"),
        ("auto", [CPU], 16, "process"),
        ("auto", [CPU], PROCESS_MIN_CPUS - 1, "thread"),
        ("auto", [CPU], 1, "thread"),
        ("auto", [CUDA, CPU], 16, "thread"),  # one GPU: a context and arena per process
        ("process", [CUDA, CPU], 2, "process"),  # asked for: given
        ("thread", [CPU], 64, "thread"),
    ],
)
def test_auto_runs_cpu_workers_in_processes_on_multi_core_hosts_only(
    mode: str, providers: list[str], cpus: int, expected: str
) -> None:
    assert resolve_worker_mode(mode, providers, cpus) == expected


def test_a_bad_worker_mode_names_the_field_and_the_choices() -> None:
    with pytest.raises(PipelineConfigError, match=r"pipeline worker_mode: must be one of .*'fork'"):
        make_config(chain_modules(1), worker_mode="fork")
    with pytest.raises(PipelineConfigError, match=r"worker_mode: must be auto, process or thread"):
        resolve_worker_mode("fork", [CPU], 4)


def test_the_default_worker_mode_is_auto() -> None:
    assert make_config(chain_modules(1)).worker_mode == "auto"


# ---- a lost worker, with stand-in runners --------------------------------------------------------


class LosingRunner(FakeRunner):
    """A runner whose process can be lost mid-batch, restarted (or fail to be), and closed."""

    start_s = 0.01

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lose = threading.Event()
        self.restarts = 0
        self.restart_errors: list[Exception] = []  # raised by the next restarts, in order
        self.closed = 0

    def run(self, batch):  # type: ignore[no-untyped-def]
        assert self.gate.wait(10), "test gate never opened"
        if self.lose.is_set():
            self.lose.clear()
            raise WorkerLost("module m1 (id 1): worker process 4242 killed by SIGKILL")
        return super().run(batch)

    def restart(self) -> None:
        self.restarts += 1
        if self.restart_errors:
            raise self.restart_errors.pop(0)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
async def executors():
    made: list[PipelineExecutor] = []

    def make(config, **kw) -> PipelineExecutor:  # type: ignore[no-untyped-def]
        ex = PipelineExecutor(config, **kw)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        for replica in (r for w in ex.workers.values() for r in w.replicas):
            replica.runner.gate.set()
        await ex.close()


async def test_a_lost_worker_fails_its_batch_only_and_serves_again_once_restarted(executors):
    runner = LosingRunner(gated=True)
    ex = executors(make_config(chain_modules(1), slo_ms=10_000.0), runners={"1": runner})
    worker = ex.workers["1"]
    first = asyncio.ensure_future(ex.execute(payload(image_seed=0)))
    await until(lambda: worker.replicas[0].future is not None)  # a batch of 1 is running
    later = [asyncio.ensure_future(ex.execute(payload(image_seed=i))) for i in range(1, 6)]
    await until(lambda: len(worker.queue) + worker.open_count == 5)
    runner.lose.set()
    runner.gate.set()
    done = await asyncio.wait_for(asyncio.gather(first, *later, return_exceptions=True), 10)
    lost = [r for r in done if isinstance(r, WorkerLost)]
    assert len(lost) == 1 and "killed by SIGKILL" in str(lost[0])  # the running batch's one
    assert all(isinstance(r, bytes) for r in done if r not in lost)  # the rest ran after
    assert runner.restarts == 1 and worker.replicas == [worker.replicas[0]]
    snap = ex.snapshot()
    module = snap["modules"]["1"]
    assert (module["worker_crashes"], module["worker_restarts"]) == (1, 1)
    assert snap["outcomes"]["failed"] == 1 and snap["outcomes"]["on_time"] == 5


async def test_while_its_process_restarts_a_worker_counts_as_busy_until_its_start_time(
    executors, monkeypatch
):
    runner = LosingRunner()
    hold = threading.Event()
    restart = runner.restart
    monkeypatch.setattr(runner, "restart", lambda: (hold.wait(10), restart()))
    ex = executors(make_config(chain_modules(1), slo_ms=10_000.0), runners={"1": runner})
    worker = ex.workers["1"]
    runner.lose.set()
    with pytest.raises(WorkerLost):
        await ex.execute(payload(image_seed=1))
    replica = worker.replicas[0]
    assert replica.future is not None  # restarting: no batch goes to it meanwhile
    assert replica.end_s == pytest.approx(replica.started_s + runner.start_s)
    waiting = asyncio.ensure_future(ex.execute(payload(image_seed=2)))
    await until(lambda: len(worker.queue) + worker.open_count == 1)
    assert runner.sizes == []  # held until the new process is up
    hold.set()
    assert isinstance(await asyncio.wait_for(waiting, 10), bytes)


async def test_a_worker_that_cannot_be_restarted_leaves_when_others_serve(executors):
    made: list[LosingRunner] = []

    def factory(module: ModuleConfig) -> LosingRunner:
        made.append(LosingRunner())
        return made[-1]

    config = make_config(chain_modules(1), slo_ms=10_000.0, workers=2)
    ex = executors(config, runner_factory=factory, runners={"1": factory(chain_modules(1)[0])})
    worker = ex.workers["1"]
    assert worker.workers == 2
    second = worker.replicas[1].runner
    second.restart_errors.append(PipelineConfigError("module m1 model: cannot load m1.onnx"))
    second.lose.set()
    worker.replicas[0].idle_since_s = float("inf")  # the next batch goes to the second
    with pytest.raises(WorkerLost):
        await ex.execute(payload(image_seed=1))
    # It leaves the replicas at once; its runner is closed in its own thread after that.
    await until(lambda: worker.workers == 1 and second.closed == 1)
    assert worker.restart_failures == 1
    assert worker.planner.state("1").workers == 1
    assert isinstance(await ex.execute(payload(image_seed=2)), bytes)


async def test_the_last_worker_that_cannot_be_restarted_fails_what_waits_and_tries_again(
    executors, monkeypatch
):
    monkeypatch.setattr(worker_module, "RESTART_RETRY_S", 0.2)
    runner = LosingRunner()
    runner.restart_errors.append(PipelineConfigError("module m1 model: cannot load m1.onnx"))
    hold = threading.Event()
    restart = runner.restart
    monkeypatch.setattr(runner, "restart", lambda: (hold.wait(10), restart()))
    ex = executors(make_config(chain_modules(1), slo_ms=10_000.0), runners={"1": runner})
    worker = ex.workers["1"]
    runner.lose.set()
    with pytest.raises(WorkerLost):
        await ex.execute(payload(image_seed=1))
    waiting = asyncio.ensure_future(ex.execute(payload(image_seed=2)))
    await until(lambda: len(worker.queue) + worker.open_count == 1)
    hold.set()  # the first restart fails: what waits fails, no request waits for a worker
    with pytest.raises(InferenceFailed, match=r"no worker: module m1 model: cannot load"):
        await asyncio.wait_for(waiting, 10)
    await until(lambda: runner.restarts == 2 and worker.replicas[0].future is None)
    assert worker.restart_failures == 1 and worker.workers == 1
    assert isinstance(await ex.execute(payload(image_seed=3)), bytes)


async def test_closing_closes_every_runner_once_including_retired_ones():
    made: list[LosingRunner] = []

    def factory(module: ModuleConfig) -> LosingRunner:
        made.append(LosingRunner())
        return made[-1]

    config = make_config(chain_modules(2), slo_ms=10_000.0, workers=2)
    first = {m.id: factory(m) for m in config.modules}
    ex = PipelineExecutor(config, runners=first, runner_factory=factory)
    await ex.execute(payload(image_seed=1))
    retired = ex.workers["1"].retire_replica()
    assert retired is not None
    await until(lambda: retired.runner.closed == 1)  # closed when it left
    await ex.close()
    assert len(made) == 4 and [r.closed for r in made] == [1, 1, 1, 1]


# ---- where the worker mode is chosen ---------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--worker-mode", "process"], "--worker-mode only apply with --pipeline"),
        (
            ["--pipeline", "traffic", "--worker-mode", "fork"],
            "--worker-mode: invalid choice: 'fork'",
        ),
    ],
)
def test_a_bad_worker_mode_flag_exits_2_naming_it(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from deploy.cli import main

    try:
        code = main(["taskserver", *flags])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_live_replay_takes_the_worker_mode_and_resolves_auto_here() -> None:
    from loadtests.pard_live import live_config, plan_live
    from taskserver.pipeline.sessions import usable_cpus

    setup = plan_live("traffic", workers=2, rate_rps=10.0, worker_mode="process")
    assert setup.worker_mode == "process"
    assert live_config(setup, "pard").worker_mode == "process"
    auto = plan_live("traffic", workers=1, rate_rps=10.0)
    assert auto.worker_mode == resolve_worker_mode("auto", [CPU], usable_cpus())
    cuda = plan_live("traffic", workers=1, rate_rps=10.0, providers="cuda")
    assert cuda.worker_mode == "thread"


async def test_a_worker_stopped_while_it_starts_is_closed_once_started():
    from taskserver.pard import ScalingConfig

    starting = threading.Event()
    release = threading.Event()
    made: list[LosingRunner] = []

    def factory(module: ModuleConfig) -> LosingRunner:
        made.append(LosingRunner())
        starting.set()
        assert release.wait(10)  # a slow start: spawn, load, warm up
        return made[-1]

    config = make_config(chain_modules(1), workers=ScalingConfig(max_workers=2, total_workers=2))
    first = LosingRunner()
    ex = PipelineExecutor(config, runners={"1": first}, runner_factory=factory)
    try:
        await ex.execute(payload(image_seed=1))  # the loop and the workers run
        grow = asyncio.ensure_future(ex._grow("1", 0.0))
        await asyncio.to_thread(starting.wait, 10)
        grow.cancel()  # scaled in, or closing, before it serves
        await asyncio.sleep(0.05)
        assert not grow.done()  # it waits for the start it cannot stop...
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(grow, 10)
        assert made[0].closed == 1  # ...and then closes what was started
        assert ex.workers["1"].workers == 1
    finally:
        release.set()
        await ex.close()
    assert first.closed == 1 and made[0].closed == 1
