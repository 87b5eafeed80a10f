"""What the HTTP fuzzer (tests/integration/test_fuzz_http.py) found in the policies and the
executors, pinned at the unit level."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from admission.groups import MAX_COST_BUCKET, RequestGroups, cost_bucket
from gateway.cdf import CdfBook
from taskserver.abc import InvalidTask
from taskserver.config import TaskServerConfig
from taskserver.executors import EmulatedExecutor
from taskserver.service_time import make_distribution


def test_a_percentile_too_small_for_p_over_100_still_solves() -> None:
    """An SLO at percentile 5e-324 (a number in (0, 100), as the document allows) made
    log(p / 100) a math domain error: every such query answered 500."""
    book = CdfBook()
    book.add_server("ts-1", np.linspace(1.0, 10.0, 100))
    for p in (5e-324, 1e-320, 1e-300, 1e-9):
        solution = book.solve(["ts-1"], p)
        assert math.isfinite(solution.unloaded_ms) and solution.unloaded_ms >= 0, (p, solution)
    assert book.solve(["ts-1"], 50.0).unloaded_ms > book.solve(["ts-1"], 5e-324).unloaded_ms


def test_the_largest_cost_gets_a_bucket_with_finite_bounds() -> None:
    """A query with cost_hint 1.7e308 put its group in bucket 1023, whose upper bound
    2.0 ** 1024 overflows: GET /v1/groups and /metrics answered 500 from then on."""
    assert cost_bucket(1.7e308) == MAX_COST_BUCKET == cost_bucket(2.0**1022)
    assert cost_bucket(2.0**1021) == 1021 and cost_bucket(5e-324) == -1074
    groups = RequestGroups(rate_window=10.0)
    for cost in (1.7e308, 5e-324, 3.0):
        groups.admitted(RequestGroups.key("A", "default", cost), cost, 1, now=0.0)
    view = groups.snapshot(1.0, {"default": 1})
    json.dumps(view, allow_nan=False)  # every figure a finite JSON number
    assert [g["cost_bucket"] for g in view][-1] == [2.0**1022, 2.0**1023]


@pytest.mark.parametrize(
    "payload",
    [b"[null, null]", b'"x"', b"not json", b'{"service_ms": "soon"}', b'{"fail": 3}',
     b'{"drop": 7}', b'{"service_ms_on": {"other": 1}}'],
)  # fmt: skip
async def test_a_payload_the_emulated_executor_cannot_run_is_an_invalid_task(
    payload: bytes,
) -> None:
    """Was an ExecutorError: the gateway answered the client's bad task 502, a server's
    failure, instead of 400 `invalid_task`."""
    executor = EmulatedExecutor(make_distribution(TaskServerConfig().service), server_id="ts-1")
    with pytest.raises(InvalidTask) as err:
        await executor.execute(payload)
    assert err.value.field == "payload"
    assert err.value.wire_error().startswith("invalid task: payload: ")
