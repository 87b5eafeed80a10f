"""Errors of the pipeline runtime.

Errors::

    Exception
     ├── ExecutorError (taskserver.executors)   sent back to the gateway as the task's error
     │    ├── BadPayload          the task payload is not a valid pipeline request
     │    ├── InferenceFailed     onnxruntime failed on a batch holding the request
     │    │    └── WorkerLost      the worker process running the batch died or hung
     │    ├── PipelineClosed      the executor closed while the request was in flight
     │    └── TaskDropped (taskserver.executors)   reported as DROPPED, not FAILED
     │         └── PipelineDropped   the dropping policy dropped the request at a module
     └── ValueError
          └── PipelineConfigError   a bad PipelineConfig, or a model that cannot be loaded

onnxruntime's own exceptions never leave this package: they become InferenceFailed (at run
time) or PipelineConfigError (at load time), chained with ``raise ... from exc``.
"""

from __future__ import annotations

from taskserver.abc import ExecutorError, TaskDropped

__all__ = [
    "BadPayload",
    "InferenceFailed",
    "PipelineClosed",
    "PipelineConfigError",
    "PipelineDropped",
    "WorkerLost",
]


class PipelineConfigError(ValueError):
    """A pipeline setting is invalid; the message names the field and quotes the value."""


class BadPayload(ExecutorError):
    """The task payload is not a valid pipeline request; the message names the field."""


class InferenceFailed(ExecutorError):
    """A module's model failed on the batch that held the request."""


class WorkerLost(InferenceFailed):
    """The worker process that ran the request's batch died (or stopped answering)."""


class PipelineClosed(ExecutorError):
    """The executor was closed while the request was in flight."""


class PipelineDropped(TaskDropped):
    """The dropping policy dropped the request at a module (PARD's decision at t_b)."""

    def __init__(
        self,
        module_id: str,
        module_name: str,
        estimate_ms: float,
        limit_ms: float,
        reason: str,
    ) -> None:
        self.module_id = module_id
        self.module_name = module_name
        self.estimate_ms = estimate_ms
        self.limit_ms = limit_ms
        self.reason = reason
        super().__init__(
            f"dropped at module {module_name} (id {module_id}): {reason}: estimate "
            f"{estimate_ms:.1f} ms vs budget {limit_ms:.1f} ms"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, float, float, str]]:
        return (
            type(self),
            (self.module_id, self.module_name, self.estimate_ms, self.limit_ms, self.reason),
        )
