"""The shipped pipelines, live: real onnxruntime sessions driven through PipelineExecutor (CPU)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable

import pytest

from onnx_models.pipeline_config import pipeline_config
from taskserver.pipeline import PipelineConfig, PipelineDropped, PipelineExecutor

pytestmark = pytest.mark.integration
pytest.importorskip("onnxruntime")


def shipped_config(name: str, **overrides: object) -> PipelineConfig:
    """A PipelineConfig from a shipped spec and its profile, on CPU."""
    return dataclasses.replace(pipeline_config(name, providers="cpu"), **overrides)


@pytest.fixture
async def pipeline() -> AsyncIterator[Callable[..., PipelineExecutor]]:
    made: list[PipelineExecutor] = []

    def make(name: str, **overrides: object) -> PipelineExecutor:
        made.append(PipelineExecutor(shipped_config(name, **overrides)))
        return made[-1]

    yield make
    for ex in made:
        await ex.close()


def request(**fields: object) -> bytes:
    return json.dumps(fields).encode()


async def test_a_traffic_request_returns_the_models_outputs(pipeline):
    ex = pipeline("traffic")
    result = json.loads(await ex.execute(request(image_seed=11, budget_ms=5_000)))
    assert result["pipeline"] == "traffic" and result["provider"] == "CPUExecutionProvider"
    assert list(result["modules"]) == ["1", "2", "3"]
    names = [m["name"] for m in result["modules"].values()]
    assert names == ["object_detection", "face_recognition", "text_recognition"]
    assert all(m["exec_ms"] > 0 and m["batch"] == 1 for m in result["modules"].values())
    text = result["outputs"]["3"]
    assert text["module"] == "text_recognition" and text["shape"] == [48, 37]
    assert len(text["top_k"]) == 3 and all(v <= 0 for _, v in text["top_k"])  # log-probs
    again = json.loads(await ex.execute(request(image_seed=11, budget_ms=5_000)))
    assert again["outputs"] == result["outputs"]  # a seeded frame gives the same answer


async def test_a_burst_on_traffic_is_batched_in_feasible_sizes(pipeline):
    ex = pipeline("traffic")
    payloads = [request(image_seed=i, budget_ms=30_000) for i in range(20)]
    results = await asyncio.gather(*(ex.execute(p) for p in payloads))
    assert len(results) == 20
    sizes = [b.size for b in ex.batches("1")]
    assert sum(sizes) == 20 and max(sizes) >= 4
    assert set(sizes) <= {1, 2, 4, 8, 16, 32}
    snap = ex.snapshot()
    assert snap["on_time"] == 20 and snap["dropped"] == 0 and snap["invalid_rate"] == 0.0


async def test_a_doomed_traffic_request_is_dropped_before_any_model_runs(pipeline):
    ex = pipeline("traffic")
    with pytest.raises(PipelineDropped) as caught:
        await ex.execute(request(image_seed=1, budget_ms=5))
    assert (caught.value.module_id, caught.value.module_name) == ("1", "object_detection")
    assert not any(ex.batches(m) for m in ("1", "2", "3"))
    assert ex.snapshot()["drops_by_module"] == {"1": 1}


async def test_a_game_analysis_request_runs_all_five_modules(pipeline):
    ex = pipeline("ga")
    result = json.loads(await ex.execute(request(image_seed=3, budget_ms=5_000)))
    assert result["pipeline"] == "ga" and list(result["modules"]) == ["1", "2", "3", "4", "5"]
    names = [m["name"] for m in result["modules"].values()]
    assert names == [
        "game_object_detection",
        "kill_count_detection",
        "alive_player_recognition",
        "health_value_recognition",
        "icon_recognition",
    ]
    assert all(m["exec_ms"] > 0 and m["batch"] == 1 for m in result["modules"].values())
    assert list(result["outputs"]) == ["5"] and result["outputs"]["5"]["shape"] == [32]


async def test_the_dag_pipeline_merges_both_branches(pipeline):
    ex = pipeline("dag")
    result = json.loads(await ex.execute(request(image_seed=5, budget_ms=5_000)))
    names = {mid: m["name"] for mid, m in result["modules"].items()}
    assert names == {
        "1": "person_detection",
        "2": "pose_recognition",
        "3": "face_recognition",
        "4": "expression_recognition",
    }
    assert list(result["outputs"]) == ["4"] and result["outputs"]["4"]["shape"] == [7]
    rid = result["request"]
    (pose,), (face,), (merge,) = ([b for b in ex.batches(m) if rid in b.request_ids] for m in "234")
    assert merge.started_s >= max(pose.ended_s, face.ended_s)
