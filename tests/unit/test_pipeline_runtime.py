"""The pipeline runtime: batching, PARD drops, cancellation, DAG routing, real tiny models."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from taskserver.executors import TaskDropped
from taskserver.metrics import PipelineCollector
from taskserver.pipeline import (
    FULL_REGION,
    BadPayload,
    InferenceFailed,
    ModuleConfig,
    PardKnobs,
    PipelineClosed,
    PipelineConfig,
    PipelineConfigError,
    PipelineDropped,
    PipelineExecutor,
    detection_region,
    feasible_target,
    fit_input,
    parse_payload,
)

# ---- factories --------------------------------------------------------------------------------


class FakeRunner:
    """A model that answers (n, 4) rows; optionally held at a gate, or failing."""

    provider = "FakeProvider"
    output_name = "scores"

    def __init__(
        self, shape: tuple[int, ...] = (3, 8, 8), *, gated: bool = False, delay_s: float = 0.0
    ) -> None:
        self.input_shape = shape
        self.delay_s = delay_s
        self.input_dtype = np.dtype(np.float32)
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.fail: str | None = None
        self.sizes: list[int] = []

    def run(self, batch: np.ndarray) -> np.ndarray:
        assert self.gate.wait(10), "test gate never opened"
        time.sleep(self.delay_s)
        if self.fail:
            raise InferenceFailed(self.fail)
        self.sizes.append(len(batch))
        flat = batch.reshape(len(batch), -1)
        return np.stack([flat.mean(1), flat.max(1), flat.min(1), flat.std(1)], axis=1)


def chain_modules(n: int, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> tuple[ModuleConfig, ...]:
    ids = [str(i) for i in range(1, n + 1)]
    return tuple(
        ModuleConfig(
            id=mid,
            name=f"m{mid}",
            model=Path(f"m{mid}.onnx"),
            pres=ids[i - 1 : i] if i else (),
            subs=ids[i + 1 : i + 2],
            batch_sizes=sizes,
        )
        for i, mid in enumerate(ids)
    )


def make_config(
    modules: Iterable[ModuleConfig],
    *,
    duration_ms: float = 1.0,
    slo_ms: float = 1000.0,
    dropper: str = "pard",
    **kw: object,
) -> PipelineConfig:
    modules = tuple(modules)
    profile = {m.id: {b: duration_ms * b for b in m.batch_sizes} for m in modules}
    # The fakes run far from their profile: keep the paper's d_k, so decisions stay exact.
    kw.setdefault("pard", PardKnobs(adapt_durations=False))
    return PipelineConfig("test", slo_ms, modules, profile=profile, dropper=dropper, **kw)


def payload(**fields: object) -> bytes:
    return json.dumps(fields).encode()


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until `cond()` holds (the runtime works in threads and loop callbacks)."""
    async with asyncio.timeout(timeout_s):
        while not cond():  # noqa: ASYNC110 - the state changes in threads, no event marks it
            await asyncio.sleep(0.001)


@pytest.fixture
async def executors():
    made: list[PipelineExecutor] = []

    def make(config: PipelineConfig, runners: dict | None = None) -> PipelineExecutor:
        ex = PipelineExecutor(config, runners=runners)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        for runner in (w.runner for w in ex.workers.values()):
            if isinstance(runner, FakeRunner):
                runner.gate.set()
        await ex.close()


# ---- pure parts -------------------------------------------------------------------------------


def test_feasible_target_is_the_largest_size_that_fits_or_the_smallest():
    assert [feasible_target(n, (1, 2, 4, 8)) for n in (0, 1, 3, 4, 7, 9, 100)] == [
        1, 1, 2, 4, 4, 8, 8,
    ]  # fmt: skip
    assert feasible_target(1, (4, 8)) == 4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"subs": ("9",)}, "m1 \\(id 1\\): subs: no module has id 9"),
        ({"subs": ()}, r"m1 \(id 1\): subs: must list 2, since m2 \(id 2\) lists 1 in its pres"),
        ({"batch_sizes": (4, 2)}, "strictly ascending"),
        ({"input_shape": (3, 0)}, "input_shape: need dims >= 1"),
    ],
)
def test_bad_configs_name_the_field(change, field):
    first, rest = chain_modules(2)
    fields = {k: getattr(first, k) for k in ("id", "name", "model", "pres", "subs")} | change
    with pytest.raises(PipelineConfigError, match=field):
        make_config([ModuleConfig(**fields), rest])


def test_a_pipeline_needs_exactly_one_source():
    a = ModuleConfig("a", "a", Path("a.onnx"))
    b = ModuleConfig("b", "b", Path("b.onnx"))
    with pytest.raises(
        PipelineConfigError,
        match=r"exactly one module must have empty pres \(the source\); found a \(id a\), b",
    ):
        make_config([a, b])


def test_a_profile_that_misses_a_feasible_size_is_refused():
    modules = chain_modules(1)
    with pytest.raises(PipelineConfigError, match=r"m1 \(id 1\) batch 8"):
        PipelineConfig("p", 100, modules, profile={"1": {1: 1.0, 4: 3.0}})


def test_an_unknown_dropper_is_refused_with_the_valid_names():
    with pytest.raises(PipelineConfigError, match="'pard'"):
        PipelineExecutor(
            make_config(chain_modules(1), dropper="magic"), runners={"1": FakeRunner()}
        )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "must be a JSON object"),
        (b"{bad", "invalid JSON"),
        (payload(image_seed=1, input=[[1]]), "not both"),
        (payload(budget_ms=0), "budget_ms"),
        (payload(top_k=0), "top_k"),
        (payload(speed=1), "unknown fields"),
        (payload(input={"shape": [2, 2], "dtype": "float32", "b64": "AAAA"}), "bytes"),
    ],
)
def test_bad_payloads_name_the_field(body, message):
    with pytest.raises(BadPayload, match=message):
        parse_payload(body)


def test_payload_frames_are_deterministic_and_fitted_to_the_source_shape():
    a = parse_payload(payload(image_seed=7)).frame((3, 20, 12), np.dtype(np.float32))
    b = parse_payload(b"").frame((3, 20, 12), np.dtype(np.float32))
    assert a.shape == (3, 20, 12) and a.dtype == np.float32
    assert np.array_equal(a, parse_payload(payload(image_seed=7)).frame((3, 20, 12), a.dtype))
    assert not np.array_equal(a, b)
    raw = np.arange(16, dtype=np.float32).reshape(4, 4)
    given = {"shape": [4, 4], "dtype": "float32", "b64": base64.b64encode(raw.tobytes()).decode()}
    frame = parse_payload(payload(input=given)).frame((1, 2, 2), np.dtype(np.float32))
    assert frame.tolist() == [[[0.0, 2.0], [8.0, 10.0]]]
    listed = parse_payload(payload(input=raw.tolist())).frame((1, 4, 4), np.dtype(np.float32))
    assert np.array_equal(listed[0], raw)


def test_inputs_chain_by_cropping_the_detected_region():
    frame = np.zeros((3, 100, 100), dtype=np.float32)
    frame[:, 50:, 50:] = 1.0  # the bottom-right quarter is bright
    box = np.array([[0.5, 0.5, 1.0, 1.0, 0.1], [0.75, 0.75, 0.5, 0.5, 0.9]], dtype=np.float32)
    region = detection_region(box, FULL_REGION)
    assert region == pytest.approx((0.5, 0.5, 1.0, 1.0))
    crop = fit_input(frame, region, (1, 8, 8), np.dtype(np.float32))
    assert crop.shape == (1, 8, 8) and crop.min() == 1.0  # grey, and only the bright part
    inner = detection_region(box, (0.0, 0.0, 0.5, 0.5))  # a box seen on a crop maps back
    assert inner == pytest.approx((0.25, 0.25, 0.5, 0.5))
    assert fit_input(frame, FULL_REGION, (5,), np.dtype(np.float32)).shape == (5,)


# ---- the runtime with fake models ---------------------------------------------------------------


async def test_a_burst_is_served_in_batches_of_feasible_sizes(executors):
    runners = {"1": FakeRunner(gated=True), "2": FakeRunner()}
    ex = executors(make_config(chain_modules(2), slo_ms=10_000.0), runners)
    first = asyncio.create_task(ex.execute(payload(image_seed=0)))
    await until(lambda: ex.workers["1"]._running is not None)  # batch [first] holds the model
    burst = [asyncio.create_task(ex.execute(payload(image_seed=i))) for i in range(1, 14)]
    await until(lambda: len(ex.workers["1"].queue) + ex.workers["1"].open_count == 13)
    runners["1"].gate.set()
    results = [json.loads(r) for r in await asyncio.gather(first, *burst)]
    assert runners["1"].sizes == [1, 8, 4, 1]  # 13 waiting: 8 now, 4 of the 5 left, then 1
    assert all(b.size == b.target for b in ex.batches("1"))
    assert sum(runners["2"].sizes) == 14 and set(runners["2"].sizes) <= {1, 2, 4, 8}
    assert {r["modules"]["1"]["batch"] for r in results} == {1, 8, 4}
    snap = ex.snapshot()
    assert snap["modules"]["1"]["batch_sizes"] == {"1": 2, "4": 1, "8": 1}
    assert snap["on_time"] == 14 and snap["drop_rate"] == 0.0
    assert snap["outcomes"] == {"on_time": 14, "late": 0, "dropped": 0, "cancelled": 0, "failed": 0}


async def test_a_doomed_request_is_dropped_at_the_first_module_not_the_last(executors):
    runners = {m: FakeRunner() for m in "123"}
    ex = executors(make_config(chain_modules(3), duration_ms=50.0), runners)
    with pytest.raises(PipelineDropped) as caught:
        await ex.execute(payload(image_seed=1, budget_ms=20))
    dropped = caught.value
    assert isinstance(dropped, TaskDropped)  # the task server reports it as DROPPED
    assert (dropped.module_id, dropped.module_name) == ("1", "m1")
    assert dropped.estimate_ms > 150 and dropped.limit_ms == pytest.approx(
        20
    )  # d_1 + d_2 + d_3 + w_1 > 20
    assert "m1 (id 1)" in str(dropped) and "vs budget 20.0 ms" in str(dropped)
    assert all(not ex.batches(m) for m in "123")  # no module spent compute on it
    snap = ex.snapshot()
    assert snap["drops_by_module"] == {"1": 1} and snap["invalid_rate"] == 0.0


async def test_the_reactive_ablation_drops_the_same_request_later(executors):
    # Each module runs its 200 ms: module 2 would drop it only after ~198 ms of scheduling
    # delay (50 ms modules failed so under a loaded CI machine).
    runners = {m: FakeRunner(delay_s=0.2) for m in "123"}
    ex = executors(make_config(chain_modules(3), duration_ms=200.0, dropper="back"), runners)
    with pytest.raises(PipelineDropped) as caught:
        await ex.execute(payload(image_seed=1, budget_ms=598))
    assert caught.value.module_id == "3"  # PARD-back only sees L_pre + L_cur: 400 + 200 > 598
    assert len(ex.batches("1")) == len(ex.batches("2")) == 1  # wasted compute
    snap = ex.snapshot()
    assert snap["invalid_rate"] == 1.0 and snap["outcomes"]["dropped"] == 1
    # The counters behind the rate, as /metrics exports them: all of it invalid.
    registry = CollectorRegistry()
    registry.register(PipelineCollector(ex.snapshot, "gpu-1"))
    labels = {"server": "gpu-1", "pipeline": snap["pipeline"], "dropper": "back"}

    def counter(name: str) -> list[float | None]:
        return [registry.get_sample_value(name, {**labels, "module": m}) for m in "123"]

    compute = counter("tailgate_pipeline_compute_seconds_total")
    assert counter("tailgate_pipeline_invalid_compute_seconds_total") == compute
    assert compute[0] and compute[1] and compute[2] == 0.0  # module 3 never ran it
    assert sum(compute) == pytest.approx(snap["compute_s"]) == snap["invalid_s"]


async def test_cancelling_removes_the_request_from_the_queue_and_the_open_batch(executors):
    runners = {"1": FakeRunner(gated=True), "2": FakeRunner()}
    ex = executors(make_config(chain_modules(2, sizes=(1, 4)), slo_ms=10_000.0), runners)
    worker = ex.workers["1"]
    running = asyncio.create_task(ex.execute(payload(image_seed=0)))
    await until(lambda: worker._running is not None)
    admitted = asyncio.create_task(ex.execute(payload(image_seed=1)))
    await until(lambda: worker.open_count == 1)
    queued = asyncio.create_task(ex.execute(payload(image_seed=2)))
    await until(lambda: len(worker.queue) == 1)  # 2 waiting: the target stays at 1
    queued.cancel()
    admitted.cancel()
    await asyncio.gather(queued, admitted, return_exceptions=True)
    assert len(worker.queue) == 0 and worker.open_count == 0
    runners["1"].gate.set()
    result = json.loads(await running)
    assert [b.request_ids for b in ex.batches("1")] == [(result["request"],)]
    assert [b.request_ids for b in ex.batches("2")] == [(result["request"],)]
    snap = ex.snapshot()
    assert (snap["cancelled"], snap["dropped"], snap["on_time"]) == (2, 0, 1)


def dag_modules() -> tuple[ModuleConfig, ...]:
    spec = {"1": ((), ("2", "3")), "2": (("1",), ("4",)), "3": (("1",), ("4",))}
    spec["4"] = (("2", "3"), ())
    return tuple(
        ModuleConfig(id=m, name=f"m{m}", model=Path("x.onnx"), pres=p, subs=s)
        for m, (p, s) in spec.items()
    )


async def test_a_dag_request_merges_both_branches(executors):
    runners = {m: FakeRunner() for m in "1234"}
    runners["3"] = FakeRunner(gated=True)
    ex = executors(make_config(dag_modules(), slo_ms=10_000.0), runners)
    task = asyncio.create_task(ex.execute(payload(image_seed=3)))
    await until(lambda: len(ex.batches("2")) == 1)
    await asyncio.sleep(0.01)
    assert not ex.batches("4")  # branch 2 is done, the merge waits for branch 3
    runners["3"].gate.set()
    result = json.loads(await task)
    assert list(result["modules"]) == ["1", "2", "3", "4"]
    assert list(result["outputs"]) == ["4"] and result["outputs"]["4"]["shape"] == [4]
    (b2,), (b3,), (b4,) = (ex.batches(m) for m in "234")
    assert b4.started_s >= max(b2.ended_s, b3.ended_s)


async def test_a_drop_on_one_branch_takes_the_request_out_of_the_other(executors):
    modules = dag_modules()
    runners = {m: FakeRunner() for m in "1234"}
    runners["3"] = FakeRunner(gated=True)
    slow = {"2": 500.0}  # module 2 alone cannot meet a 300 ms budget
    profile = {m.id: {b: slow.get(m.id, 1.0) * b for b in m.batch_sizes} for m in modules}
    config = PipelineConfig("dag", 10_000.0, modules, profile=profile, dropper="back")
    ex = executors(config, runners)
    blocker = asyncio.create_task(ex.execute(payload(image_seed=1)))  # holds module 3
    await until(lambda: ex.workers["3"]._running is not None)
    with pytest.raises(PipelineDropped) as caught:
        await ex.execute(payload(image_seed=2, budget_ms=300))
    assert caught.value.module_id == "2"
    assert len(ex.workers["3"].queue) == 0 and ex.workers["3"].open_count == 0
    runners["3"].gate.set()
    first = json.loads(await blocker)["request"]
    assert [b.request_ids for b in ex.batches("3")] == [(first,)]


async def test_an_inference_failure_fails_the_request_naming_the_module(executors):
    runners = {m: FakeRunner() for m in "12"}
    runners["2"].fail = "module m2 (id 2): inference failed: boom"
    ex = executors(make_config(chain_modules(2)), runners)
    with pytest.raises(InferenceFailed, match=r"m2 \(id 2\).* boom"):
        await ex.execute(payload(image_seed=1))
    assert ex.snapshot()["failed"] == 1


async def test_state_exchange_publishes_at_most_once_a_period_and_refreshes(executors):
    runners = {m: FakeRunner() for m in "123"}
    ex = executors(make_config(chain_modules(3)), runners)
    ex.workers["3"].planner.set_batch_size(4)
    before = ex.workers["1"].planner.downstream()[0].exec_s
    ex.exchange("3", now=100.0)
    after = ex.workers["1"].planner.downstream()[0]
    assert ex.workers["1"].planner.state("3").batch_size == 4
    assert after.exec_s == pytest.approx(before + 0.003)  # d_3 went from 1 ms to 4 ms
    wait_before = after.wait_s
    ex.exchange("1", now=100.0)  # planner 1's own tick: it merged a downstream state, refresh
    assert ex.workers["1"].planner.downstream()[0].wait_s > wait_before  # w_1 grew with d_3
    ex.workers["3"].planner.set_batch_size(8)
    ex.exchange("3", now=100.5)  # within the period: nothing is published
    assert ex.workers["1"].planner.state("3").batch_size == 4


async def test_closing_fails_what_is_in_flight_and_refuses_more(executors):
    runners = {"1": FakeRunner(gated=True)}
    ex = executors(make_config(chain_modules(1)), runners)
    running = asyncio.create_task(ex.execute(payload(image_seed=0)))
    await until(lambda: ex.workers["1"]._running is not None)
    queued = asyncio.create_task(ex.execute(payload(image_seed=1)))
    await until(lambda: ex.workers["1"].open_count == 1)
    runners["1"].gate.set()
    await ex.close()
    for task in (running, queued):
        with pytest.raises(PipelineClosed):
            await task
    with pytest.raises(PipelineClosed):
        await ex.execute(payload(image_seed=2))


# ---- real onnxruntime sessions on tiny models ---------------------------------------------------


def tiny_model(path: Path, in_shape: tuple[int, ...], out: str, out_shape: tuple[int, ...]) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    features = int(np.prod(in_shape))
    width = int(np.prod(out_shape))
    weight = np.random.default_rng(0).standard_normal((features, width)).astype(np.float32)
    nodes = [
        helper.make_node("Flatten", ["image"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], ["mm"]),
        helper.make_node("Sigmoid", ["mm"], ["act"]),
        helper.make_node("Reshape", ["act", "shape"], [out]),
    ]
    shape = numpy_helper.from_array(np.array([-1, *out_shape], dtype=np.int64), "shape")
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *in_shape])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", *out_shape])],
        [numpy_helper.from_array(weight, "w"), shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


async def test_real_sessions_run_a_detector_into_a_classifier(executors, tmp_path):
    pytest.importorskip("onnxruntime")
    det = tiny_model(tmp_path / "det.onnx", (3, 16, 16), "detections", (6, 5))
    cls = tiny_model(tmp_path / "cls.onnx", (1, 8, 8), "logits", (7,))
    modules = (
        ModuleConfig("1", "detector", det, subs=("2",)),
        ModuleConfig("2", "classifier", cls, pres=("1",)),
    )
    ex = executors(make_config(modules, providers="cpu", intra_op_threads=1))
    assert ex.workers["1"].roi_output and not ex.workers["2"].roi_output
    results = await asyncio.gather(*(ex.execute(payload(image_seed=i, top_k=2)) for i in range(5)))
    result = json.loads(results[0])
    assert result["provider"] == "CPUExecutionProvider"
    out = result["outputs"]["2"]
    assert out["module"] == "classifier" and out["shape"] == [7] and len(out["values"]) == 7
    assert len(out["top_k"]) == 2 and out["top_k"][0][1] == max(out["values"])
    timing = result["modules"]["1"]
    assert set(timing) == {
        *("name", "queue_ms", "batch_wait_ms", "prep_ms", "exec_ms", "batch", "provider")
    }
    assert ex.snapshot()["modules"]["2"]["provider"] == "CPUExecutionProvider"


def test_a_model_that_cannot_be_loaded_is_a_config_error(tmp_path):
    pytest.importorskip("onnxruntime")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    modules = (ModuleConfig("1", "broken", bad),)
    with pytest.raises(PipelineConfigError, match=r"broken \(id 1\) model: cannot load"):
        PipelineExecutor(make_config(modules, providers="cpu"))


@pytest.mark.parametrize("adapt", [True, False])
async def test_a_module_slower_than_its_profile_stretches_its_d_k(executors, adapt):
    # profiled d_k(1) = 1 ms; module 1 really takes ~6 ms a batch
    runners = {"1": FakeRunner(delay_s=0.006), "2": FakeRunner()}
    config = make_config(chain_modules(2), slo_ms=10_000.0)
    config = dataclasses.replace(
        config, pard=dataclasses.replace(config.pard, adapt_durations=adapt)
    )
    ex = executors(config, runners)
    for i in range(12):
        await ex.execute(payload(image_seed=i))
    scale = ex.workers["1"].planner.state("1").duration_scale
    if adapt:  # EWMA of 12 batches towards the clipped ratio 4: 1 + 3 * (1 - 0.9^12) ~ 2.9
        assert 2.0 < scale <= 4.0
        assert ex.workers["1"].planner.duration_s("1", 1) == pytest.approx(scale / 1000)
    else:
        assert scale == 1.0
    assert ex.snapshot()["modules"]["1"]["duration_scale"] == round(scale, 3)
    assert ex.snapshot()["modules"]["1"]["exec_vs_profile"] > 3  # always against the profile


async def test_the_budget_is_the_smaller_of_the_payloads_and_the_task_servers(executors):
    ex = executors(make_config(chain_modules(2)), {m: FakeRunner() for m in "12"})
    # the task server passes what is left after the task's wait in its queue
    late = json.loads(await ex.execute(payload(image_seed=1, budget_ms=5000), budget_ms=3000.0))
    assert late["budget_ms"] == 3000.0
    early = json.loads(await ex.execute(payload(image_seed=1, budget_ms=800), budget_ms=3000.0))
    assert early["budget_ms"] == 800.0
    assert json.loads(await ex.execute(payload(image_seed=1)))["budget_ms"] == 1000.0  # the SLO
