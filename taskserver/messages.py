"""What a decoded Task, TaskResult or OwnerClaim must hold before anyone acts on it.

The bounds check (taskserver.framecheck) makes a frame safe to *decode*; these checks make
a decoded message safe to *use*. thriftpy2 does not enforce ``required``: a field that is
missing or sent with another wire type decodes as None, and a string that is not UTF-8
decodes as bytes. So each side checks the fields it reads, once, here, and a message that
fails is refused (the task server answers REJECTED; the gateway fails the task) instead of
raising somewhere later. The checks run on every task, so they are plain comparisons: a
chained comparison is False for NaN and infinities and raises TypeError for None.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_BUDGET_MS",
    "MAX_DURATION_MS",
    "MAX_ID_CHARS",
    "claim_problem",
    "result_problem",
    "task_identity_problem",
    "task_problem",
]

MAX_ID_CHARS = 256
"""Longest query id, class name or gateway id (ours are a few dozen characters)."""
MAX_BUDGET_MS = 1e9
"""Largest budget a task may carry, either sign (about 11.6 days)."""
MAX_DURATION_MS = 1e9
"""Largest duration a result may report."""


def _id_problem(value: Any, name: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if type(value) is not str or not 0 < len(value) <= MAX_ID_CHARS:
        return f"{name}: must be a UTF-8 string of 1..{MAX_ID_CHARS} characters, got {_show(value)}"
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def task_identity_problem(task: Any) -> str | None:
    """Why a result could not be addressed to this task (None: it can)."""
    if task is None:
        return "the task is missing"
    problem = _id_problem(task.query_id, "query_id")
    if problem is None and type(task.task_index) is not int:
        problem = f"task_index: must be an i32, got {_show(task.task_index)}"
    return problem


def task_problem(task: Any) -> str | None:
    """Why an addressable task cannot be queued (None: it can)."""
    try:
        if not (
            -MAX_BUDGET_MS <= task.deadline_budget_ms <= MAX_BUDGET_MS
            and -MAX_BUDGET_MS <= task.slo_budget_ms <= MAX_BUDGET_MS
        ):
            raise TypeError
    except TypeError:
        return (
            f"deadline_budget_ms, slo_budget_ms: must be finite numbers within "
            f"±{MAX_BUDGET_MS:g}, got {_show(task.deadline_budget_ms)}, "
            f"{_show(task.slo_budget_ms)}"
        )
    if type(task.priority) is not int:
        return f"priority: must be an i32, got {_show(task.priority)}"
    if task.class_name is not None and type(task.class_name) is not str:
        return f"class_name: must be a UTF-8 string, got {_show(task.class_name)}"
    return None


def result_problem(r: Any) -> str | None:
    """Why a result must not be believed (None: it may)."""
    try:
        if not (
            0.0 <= r.queue_ms <= MAX_DURATION_MS
            and 0.0 <= r.service_ms <= MAX_DURATION_MS
            and 0.0 <= r.server_ms <= MAX_DURATION_MS
        ):
            raise TypeError
    except TypeError:
        return (
            f"queue_ms, service_ms, server_ms: must be finite durations in 0..{MAX_DURATION_MS:g}"
            f", got {_show(r.queue_ms)}, {_show(r.service_ms)}, {_show(r.server_ms)}"
        )
    if r.queue_ms > r.server_ms:
        # server_ms runs from receipt to result, so it holds the queue wait: a server that says
        # otherwise would give a negative post-queuing time, which no CDF can take.
        return (
            f"queue_ms: must not exceed server_ms, got {_show(r.queue_ms)} > {_show(r.server_ms)}"
        )
    if type(r.status) is not int:
        return f"status: must be a TaskStatus, got {_show(r.status)}"
    if r.error is not None and type(r.error) is not str:
        return f"error: must be a UTF-8 string, got {_show(r.error)}"
    if r.result is not None and type(r.result) is not bytes:
        return f"result: must be binary, got {_show(r.result)}"
    return None


def claim_problem(claim: Any) -> str | None:
    """Why an ownership claim is malformed (None: it is well-formed; it may still be refused)."""
    problem = _id_problem(claim.gateway_id, "claim.gateway_id")
    if problem is not None:
        return problem
    try:
        if not 0.0 <= claim.lease_ms <= MAX_DURATION_MS:
            raise TypeError
    except TypeError:
        return f"claim.lease_ms: must be a finite duration >= 0, got {_show(claim.lease_ms)}"
    if claim.proof is not None and type(claim.proof) is not bytes:
        return f"claim.proof: must be binary, got {_show(claim.proof)}"
    return None
