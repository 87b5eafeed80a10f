"""Predictive admission on real processes: a burst on one slow server builds a queue, and the
gateway turns away the queries its wait estimate says will miss their SLO (QLM §6)."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest

from tests.integration.conftest import Cluster, query, register, server_views, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SERVICE_MS = 200.0

# One class with a 1 s SLO; the pool's prior is the servers' own service time, so the
# estimates are right from the first query; a configured Retry-After that no estimate gives.
GATEWAY_TOML = f"""
[gateway]
retry_after_s = 30

[[classes]]
name = "A"
percentile = 99
latency_ms = 1000

[[pools]]
name = "default"
[pools.prior]
kind = "constant"
value_ms = {SERVICE_MS}

[admission]
rule = "predictive"
"""

QUERY = {"class": "A", "targets": {"servers": ["ts-1"]}}


async def test_a_query_predicted_to_miss_gets_503_with_the_estimated_wait(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    gw = cluster.gateway(GATEWAY_TOML)
    ts = cluster.taskserver(
        "ts-1", "--service-kind", "constant", "--service-value-ms", f"{SERVICE_MS}"
    )
    await register(http, gw, ts, slots=1)
    idle = (await server_views(http, gw.url))["ts-1"]
    assert idle["estimated_wait_ms"] == 0.0 and idle["estimated_wait_sd_ms"] == 0.0

    # Idle: admitted.
    status, body, _ = await query(http, gw, QUERY)
    assert status == 200 and body["met_slo"], body

    # A burst of twelve on the one slot: each new query waits for those before it, and from
    # the fifth on (~700 ms of queue against an 800 ms budget) the estimate says it misses.
    burst = [asyncio.create_task(query(http, gw, QUERY)) for _ in range(12)]
    try:
        view = await wait_until(lambda s: s["outstanding"] >= 3, http, gw, "ts-1")
        # All but the one in service are ahead, plus its residual service (half of 200 ms).
        expected_ms = (view["outstanding"] - 1) * SERVICE_MS + SERVICE_MS / 2
        assert view["estimated_wait_ms"] == pytest.approx(expected_ms, rel=0.1), view
        assert view["estimated_wait_sd_ms"] > 0  # the residual's spread
        answers = await asyncio.gather(*burst)
    finally:
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)

    admitted = [b for s, b, _ in answers if s == 200]
    rejected = [(b, h) for s, b, h in answers if s == 503]
    assert len(admitted) + len(rejected) == len(burst), answers
    assert admitted and rejected, [s for s, _, _ in answers]
    for body, headers in rejected:
        assert body["error"]["code"] == "admission_rejected", body
        assert body["reason"] == "predicted_miss"
        assert body["estimated_wait_ms"] > 0
        assert body["meet_probability"] < body["level"] == 0.99
        assert "estimated queue wait" in body["error"]["message"]
        # Retry-After comes from the estimate (whole seconds, at least 1), not the config.
        assert body["retry_after_s"] >= 0
        assert headers["Retry-After"] == str(max(math.ceil(body["retry_after_s"]), 1))
        assert headers["Retry-After"] != "30"

    # The queue has drained: admitted again.
    await wait_until(lambda s: s["outstanding"] == 0, http, gw, "ts-1")
    status, body, _ = await query(http, gw, QUERY)
    assert status == 200, body

    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    rejections = 'tailgate_admission_rejections_total{class="A",reason="predicted_miss"}'
    assert f"{rejections} {float(len(rejected))}" in text
    assert 'tailgate_server_estimated_wait_seconds{pool="default",server="ts-1"} 0.0' in text
    # Every admitted task carried an estimate, and its error was measured when it came back.
    measured = 'tailgate_wait_estimate_error_seconds_bucket{le="+Inf",pool="default"}'
    assert f"{measured} {float(len(admitted) + 2)}" in text
