"""A live ONNX pipeline behind the gateway: model outputs come back; a doomed query is
dropped at the first module and its siblings are cancelled."""

from __future__ import annotations

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register
from tests.integration.harness import free_port

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.integration


async def test_a_pipeline_query_returns_model_outputs_and_a_doomed_one_is_dropped_early(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    # A 1 ms prior: the gateway's unloaded estimate must not turn the tight query below
    # into a 422 before the pipeline can drop it.
    gw = cluster.gateway(
        '[[pools]]\nname = "default"\n[pools.prior]\nkind = "constant"\nvalue_ms = 1.0\n'
    )
    metrics_port = free_port()
    ts = cluster.taskserver(
        "gpu-1", "--pipeline", "traffic", "--providers", "cpu", "--metrics-port", str(metrics_port)
    )
    await register(http, gw, ts, slots=256)
    status, body, _ = await query(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 3000},
            "targets": {"servers": ["gpu-1"]},
            "task": {"image_seed": 7},
        },
    )
    assert status == 200, body
    result = body["tasks"][0]["result"]
    assert result["pipeline"] == "traffic"
    assert [m["name"] for m in result["modules"].values()] == [
        "object_detection",
        "face_recognition",
        "text_recognition",
    ]
    assert result["outputs"] and result["provider"] == "CPUExecutionProvider"
    # The budget the server hands the pipeline is what is left of the query's SLO.
    assert 0 < result["budget_ms"] <= 3000

    # 6 ms cannot hold three models (their profiled batch-1 durations add up to ~11 ms):
    # PARD drops the request at the first module, before any model ran it.
    status, body, headers = await query(
        http,
        gw,
        {
            "slo": {"percentile": 99, "latency_ms": 6},
            "targets": {"servers": ["gpu-1"]},
            "task": {"image_seed": 8},
        },
    )
    assert status == 503 and headers["Retry-After"], body
    assert body["error"]["code"] == "task_dropped"
    assert "object_detection" in body["error"]["message"]
    # The server's /metrics carries the drop and the pipeline's PARD figures.
    async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
        text = await r.text()
    assert 'tailgate_taskserver_tasks_total{server="gpu-1",status="dropped"} 1.0' in text
    assert (
        'tailgate_pipeline_drops_total{dropper="pard",module="1",pipeline="traffic",'
        'server="gpu-1"} 1.0'
    ) in text
    # Counters, not windowed rates: the drop is one request out, dropped.
    assert (
        'tailgate_pipeline_requests_total{dropper="pard",outcome="dropped",pipeline="traffic",'
        'server="gpu-1"} 1.0'
    ) in text
    assert "tailgate_pipeline_compute_seconds_total{" in text
    assert "tailgate_pipeline_batch_size_bucket{" in text
    assert "tailgate_pipeline_goodput_rps" not in text and "tailgate_pipeline_drop_rate" not in text


async def test_a_pipeline_split_over_two_task_servers_answers_through_the_gateway(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway(
        '[[pools]]\nname = "default"\n[pools.prior]\nkind = "constant"\nvalue_ms = 1.0\n'
    )
    tail = cluster.taskserver(
        "stage-2", "--pipeline", "traffic", "--providers", "cpu", "--modules", "2,3"
    )
    metrics_port = free_port()
    head = cluster.taskserver(
        "stage-1",
        *("--pipeline", "traffic", "--providers", "cpu", "--modules", "1"),
        *("--peer", f"2={tail.address}", "--metrics-port", str(metrics_port)),
    )
    await register(http, gw, head, slots=256)  # the gateway only knows the first stage
    body = {
        "slo": {"percentile": 99, "latency_ms": 3000},
        "targets": {"servers": ["stage-1"]},
        "task": {"image_seed": 7},
    }
    status, answer, _ = await query(http, gw, body)
    assert status == 200, answer
    result = answer["tasks"][0]["result"]
    assert list(result["modules"]) == ["1", "2", "3"]
    assert "stage" not in result["modules"]["1"]
    assert result["modules"]["2"]["stage"] == result["modules"]["3"]["stage"] == tail.address
    assert result["outputs"]["3"]["module"] == "text_recognition"
    # The first stage's /metrics: one request done, none dropped.
    async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
        text = await r.text()
    assert 'tailgate_taskserver_tasks_total{server="stage-1",status="ok"} 1.0' in text
