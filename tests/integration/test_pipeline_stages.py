"""A pipeline split across task servers: real Thrift hand-offs, state exchange, drops, cancels."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable

import pytest

from onnx_models.pipeline_config import pipeline_config
from taskserver.config import TaskServerConfig
from taskserver.executors import TaskDropped
from taskserver.pipeline import BadPayload, PipelineExecutor
from taskserver.server import TaskService, build_service

pytestmark = pytest.mark.integration
pytest.importorskip("onnxruntime")


@dataclasses.dataclass
class Stage:
    executor: PipelineExecutor
    service: TaskService
    server: asyncio.Server

    @property
    def address(self) -> str:
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"


@pytest.fixture
async def stages() -> AsyncIterator[Callable[..., object]]:
    made: list[Stage] = []

    async def start(name: str, local: tuple[str, ...], peers: dict[str, str], **kw: object):
        config = dataclasses.replace(
            pipeline_config(name, providers="cpu"), local=local, peers=peers, **kw
        )
        ex = PipelineExecutor(config)
        ts = TaskServerConfig(server_id=f"stage-{local[0]}", slots=256)
        service = build_service(ts, None, ex)
        server = await asyncio.get_running_loop().create_server(
            service.protocol_factory, "127.0.0.1", 0
        )
        made.append(Stage(ex, service, server))
        return made[-1]

    yield start
    for st in reversed(made):
        st.server.close()
        await st.service.close()


def request(**fields: object) -> bytes:
    return json.dumps(fields).encode()


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until `cond()` holds (states move in loop callbacks and model threads)."""
    async with asyncio.timeout(timeout_s):
        while not cond():  # noqa: ASYNC110 - no event marks these changes
            await asyncio.sleep(0.01)


async def test_a_traffic_request_crosses_two_stages_and_returns_every_output(stages):
    tail = await stages("traffic", ("2", "3"), {})
    head = await stages("traffic", ("1",), {"2": tail.address})
    assert set(head.executor.workers) == {"1"} and set(tail.executor.workers) == {"2", "3"}
    result = json.loads(await head.executor.execute(request(image_seed=11, budget_ms=5_000)))
    assert list(result["modules"]) == ["1", "2", "3"]
    assert result["modules"]["2"]["stage"] == tail.address
    assert result["outputs"]["3"]["module"] == "text_recognition"
    # the same frame through one process gives the same answer: the hand-off is lossless
    whole = await stages("traffic", ("1", "2", "3"), {})
    alone = json.loads(await whole.executor.execute(request(image_seed=11, budget_ms=5_000)))
    assert alone["outputs"] == result["outputs"]


async def test_the_dag_splits_after_its_source_and_merges_in_the_later_stage(stages):
    tail = await stages("dag", ("2", "3", "4"), {})
    head = await stages("dag", ("1",), {"2": tail.address, "3": tail.address})
    result = json.loads(await head.executor.execute(request(image_seed=3, budget_ms=5_000)))
    assert set(result["modules"]) == {"1", "2", "3", "4"}
    assert set(result["outputs"]) == {"4"}


async def test_module_states_of_the_later_stage_reach_the_first_within_periods(stages):
    tail = await stages("traffic", ("2", "3"), {})
    head = await stages("traffic", ("1",), {"2": tail.address})
    await head.executor.execute(request(image_seed=1, budget_ms=5_000))
    peer = head.executor.peers[tail.address]
    planner = head.executor.workers["1"].planner
    await until(lambda: planner.state("3").seq >= 0 and planner.state("2").seq >= 0, 10)
    polls = peer.state_polls
    await asyncio.sleep(2.2)
    # at most once per period (1 s): 2.2 s hold at most three more polls (two on time)
    assert 1 <= peer.state_polls - polls <= 3, (polls, peer.state_polls)
    assert peer.state_errors == 0


async def test_a_doomed_request_is_dropped_by_the_later_stage_and_reported_here(stages):
    tail = await stages("traffic", ("2", "3"), {})
    head = await stages("traffic", ("1",), {"2": tail.address}, dropper="none")
    # The head never drops; module 1 (~5 ms) leaves the tail about 1 ms of the 6, and
    # PARD there sees that modules 2 and 3 (~6 ms profiled) cannot make it.
    with pytest.raises(TaskDropped, match="dropped by the stage at"):
        await head.executor.execute(request(image_seed=2, budget_ms=6))
    assert head.executor.snapshot()["drops_by_module"] == {"(later stage)": 1}
    tail_drops = tail.executor.snapshot()["drops_by_module"]
    assert sum(tail_drops.values()) == 1 and set(tail_drops) <= {"2", "3"}


async def test_cancelling_a_request_cancels_its_hand_off(stages):
    tail = await stages("traffic", ("2", "3"), {})
    head = await stages("traffic", ("1",), {"2": tail.address})
    tail_runner = tail.executor.workers["2"].runner
    original = tail_runner.run

    def slow(batch):  # hold module 2 until the head has cancelled
        import time

        time.sleep(0.3)
        return original(batch)

    tail_runner.run = slow  # type: ignore[method-assign]
    task = asyncio.create_task(head.executor.execute(request(image_seed=4, budget_ms=5_000)))
    await until(lambda: tail.executor.snapshot()["arrived"] == 1)
    peer = head.executor.peers[tail.address]
    assert peer.outstanding == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert peer.outstanding == 0  # not waiting on the later stage, whatever it does
    await until(lambda: tail.executor.snapshot()["cancelled"] == 1)
    assert tail.executor.snapshot()["on_time"] == 0


async def test_a_stage_refuses_whole_requests_and_a_wrong_entry(stages):
    tail = await stages("traffic", ("2", "3"), {})
    with pytest.raises(BadPayload, match="send whole requests to the stage with the source"):
        await tail.executor.execute(request(image_seed=1))
    head = await stages("traffic", ("1",), {"2": tail.address})
    with pytest.raises(BadPayload, match=r"entered at modules \['1'\], not \['2'\]"):
        await head.executor.execute(
            request(input=[[0.0, 1.0], [1.0, 0.0]], entries={"2": [0, 0, 1, 1]})
        )


async def test_an_unreachable_stage_fails_the_request_with_its_address(stages):
    head = await stages("traffic", ("1",), {"2": "127.0.0.1:9"})
    with pytest.raises(Exception, match=r"127\.0\.0\.1:9"):
        await head.executor.execute(request(image_seed=1, budget_ms=5_000))
