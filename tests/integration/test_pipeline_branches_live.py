"""dag_dynamic live: real onnxruntime sessions (CPU), requests that skip face recognition."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from onnx_models.pipeline_config import pipeline_config
from taskserver.config import TaskServerConfig
from taskserver.pipeline import PipelineExecutor, parse_payload, route_key
from taskserver.server import build_service

pytestmark = pytest.mark.integration
pytest.importorskip("onnxruntime")

SEEDS = range(16)


def request(seed: int) -> bytes:
    return json.dumps({"image_seed": seed, "budget_ms": 30_000}).encode()


def takes_face(ex: PipelineExecutor, seed: int) -> bool:
    """What the executor's routing decides for this request (its identity: the seed)."""
    return "3" in ex.routing.taken("1", route_key(parse_payload(request(seed))))


async def test_some_requests_skip_face_recognition_and_all_complete() -> None:
    ex = PipelineExecutor(pipeline_config("dag_dynamic", providers="cpu"))
    try:
        results = [
            json.loads(r) for r in await asyncio.gather(*map(ex.execute, map(request, SEEDS)))
        ]
        took = {s for s in SEEDS if takes_face(ex, s)}
        assert 0 < len(took) < len(SEEDS)  # 0.6 of them, drawn from the request's identity
        for seed, result in zip(SEEDS, results, strict=True):
            expected = ["1", "2", "3", "4"] if seed in took else ["1", "2", "4"]
            assert sorted(result["modules"]) == expected, seed
            assert list(result["outputs"]) == ["4"]  # the merge ran on pose alone if need be
        snap = ex.snapshot()
        assert snap["on_time"] == len(SEEDS) and snap["dropped"] == 0 and snap["in_flight"] == 0
        counts = {m: snap["modules"][m]["requests"] for m in "1234"}
        assert counts == {"1": 16, "2": 16, "3": len(took), "4": 16}
        # The same request takes the same branches when it is sent again.
        again = json.loads(await ex.execute(request(min(took))))
        assert sorted(again["modules"]) == ["1", "2", "3", "4"]
    finally:
        await ex.close()


async def test_a_later_stage_is_entered_only_at_the_branches_taken() -> None:
    made = []

    async def stage(local: tuple[str, ...], peers: dict[str, str]):
        config = dataclasses.replace(
            pipeline_config("dag_dynamic", providers="cpu"), local=local, peers=peers
        )
        ex = PipelineExecutor(config)
        service = build_service(TaskServerConfig(server_id=f"stage-{local[0]}", slots=64), None, ex)
        server = await asyncio.get_running_loop().create_server(
            service.protocol_factory, "127.0.0.1", 0
        )
        made.append((ex, service, server))
        host, port = server.sockets[0].getsockname()[:2]
        return ex, f"{host}:{port}"

    try:
        tail, address = await stage(("2", "3", "4"), {})
        head, _ = await stage(("1",), {"2": address, "3": address})
        seeds = range(6)
        results = [json.loads(await head.execute(request(s))) for s in seeds]
        for seed, result in zip(seeds, results, strict=True):
            expected = ["1", "2", "3", "4"] if takes_face(head, seed) else ["1", "2", "4"]
            assert sorted(result["modules"]) == expected, seed
        assert tail.snapshot()["on_time"] == len(seeds)
        assert tail.snapshot()["modules"]["3"]["requests"] == sum(
            takes_face(head, s) for s in seeds
        )
    finally:
        for _, service, server in reversed(made):
            server.close()
            await service.close()
