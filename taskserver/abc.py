"""The task server's extension point: the executor interface and its optional hooks.

A task server hands every task's payload to one `Executor`. To add an executor: subclass
`Executor`, implement `execute`, override the hooks it offers, and build it where the
task server picks its executor (`taskserver.server.build_service`). The built-in ones:
`taskserver.executors.EmulatedExecutor` (service times from a distribution),
`taskserver.pipeline.PipelineExecutor` (ONNX pipelines with PARD), and
`edge_agent.sensing.SensingExecutor` (sensor queries on an edge agent).

Errors::

    Exception
     └── ExecutorError   the payload was invalid or its execution failed; the message is
          │              sent back to the gateway as the task's error
          ├── InvalidTask  the payload is invalid (the client's mistake), naming the field;
          │                reported FAILED with an error that starts with INVALID_TASK_PREFIX,
          │                so that a gateway answers the client 4xx rather than 502
          └── TaskDropped  the executor dropped the task on purpose: it could not meet its
                           latency budget (PARD); reported as DROPPED, not FAILED
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["INVALID_TASK_PREFIX", "Executor", "ExecutorError", "InvalidTask", "TaskDropped"]

INVALID_TASK_PREFIX = "invalid task:"
"""How the error of a task whose payload was invalid starts on the wire (a FAILED result):
the mark that lets a gateway tell the client's mistake from a server's failure. Older
gateways see a FAILED task with a message, as before."""


class ExecutorError(Exception):
    """The task's payload or execution failed; the message goes back to the gateway."""


class InvalidTask(ExecutorError):
    """The task's payload is invalid: `field` is at fault (``end``), `problem` says how;
    str() is ``"field: problem"``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def wire_error(self) -> str:
        """The result's error on the wire: ``"invalid task: end: must be after start ..."``."""
        return f"{INVALID_TASK_PREFIX} {self}"

    @classmethod
    def from_wire(cls, error: str | None) -> InvalidTask | None:
        """The InvalidTask a result's error reports, or None when it reports none."""
        if error is None or not error.startswith(INVALID_TASK_PREFIX):
            return None
        field, sep, problem = error[len(INVALID_TASK_PREFIX) :].strip().partition(": ")
        if not sep or not field:
            return cls("payload", error[len(INVALID_TASK_PREFIX) :].strip())
        return cls(field, problem)


class TaskDropped(ExecutorError):
    """The task was dropped because it could not meet its latency budget."""


class Executor(ABC):
    """Runs task payloads; one instance per task server."""

    name: str

    @abstractmethod
    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        """Run one task and return its result bytes; raise ExecutorError on failure.

        budget_ms: what is left of the task's query's end-to-end SLO when it starts here
        (None: unknown); a budget-aware executor may drop the task (TaskDropped) with it.
        """

    # -- optional hooks: the defaults do nothing ---------------------------------------------

    async def close(self) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Release resources; the default has none."""

    def published_state(self) -> bytes:
        """What this executor publishes to the stage before it in a pipeline (the
        ``pipeline_state`` call); the default publishes nothing."""
        return b""

    def snapshot(self) -> dict[str, Any] | None:
        """Executor-level figures to export as metrics at scrape time (a pipeline's goodput,
        drops, batches); None, the default: none, and no collector is registered."""
        return None
