"""The live pipeline runtime of a GPU task server: ONNX modules, dynamic batching, PARD.

A `PipelineExecutor` serves task payloads through a multi-model inference pipeline (a chain
or a DAG). Each module has a queue in the dropping policy's order, a worker that forms the
next batch while the previous one runs (PARD Fig. 3b) and decides each request at that moment
with PARD's end-to-end estimate (eq. 3), and one or more replicas that run its batches, each
an onnxruntime session run from a thread of its own, in this process or in a child process
(``worker_mode``). A request dropped at any module fails at once, everywhere
(`PipelineDropped`, reported as DROPPED).

Layout, one idea a file:

- ``config``    PipelineConfig, ModuleConfig, PardKnobs, TableProfile: plain data, validated
- ``sessions``  ModelRunner protocol; OnnxModel: one InferenceSession, CUDA when available;
                which worker mode ``auto`` means here
- ``process``   ProcessRunner: a worker's OnnxModel in a child process, batches in shared
                memory, a lost child detected and replaced
- ``tensors``   payload format, how inputs chain between modules, result summaries
- ``routing``   which subs of a split a request takes (``branches``), merges that wait for
                the branches it took, when it has reached every end
- ``flight``    one request in flight: where it is, its per-module timings
- ``worker``    ModuleWorker: DEPQ, decision at t_b, batch size rule, a thread per worker
- ``executor``  PipelineExecutor: routing (split/merge), state exchange, metrics, results
- ``errors``    the exception tree below

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

Needs numpy; onnxruntime only once sessions are built. Imports nothing of ours outside
``taskserver``.
"""

from taskserver.pipeline.config import (
    DEFAULT_BATCH_SIZES,
    WORKER_MODES,
    ModuleConfig,
    PardKnobs,
    PipelineConfig,
    TableProfile,
)
from taskserver.pipeline.errors import (
    BadPayload,
    InferenceFailed,
    PipelineClosed,
    PipelineConfigError,
    PipelineDropped,
    WorkerLost,
)
from taskserver.pipeline.executor import CANCELLED, FAILED, PipelineExecutor
from taskserver.pipeline.flight import BatchRecord, ModuleTiming
from taskserver.pipeline.process import ProcessRunner
from taskserver.pipeline.routing import RouteState, Routing, branch_draw, route_key
from taskserver.pipeline.sessions import (
    ModelRunner,
    OnnxModel,
    default_intra_op_threads,
    resolve_providers,
    resolve_worker_mode,
)
from taskserver.pipeline.tensors import (
    FULL_REGION,
    Region,
    RequestInput,
    detection_region,
    fit_input,
    parse_payload,
    summarize_output,
)
from taskserver.pipeline.worker import ModuleWorker, feasible_target

__all__ = [
    "CANCELLED",
    "DEFAULT_BATCH_SIZES",
    "FAILED",
    "FULL_REGION",
    "WORKER_MODES",
    "BadPayload",
    "BatchRecord",
    "InferenceFailed",
    "ModelRunner",
    "ModuleConfig",
    "ModuleTiming",
    "ModuleWorker",
    "OnnxModel",
    "PardKnobs",
    "PipelineClosed",
    "PipelineConfig",
    "PipelineConfigError",
    "PipelineDropped",
    "PipelineExecutor",
    "ProcessRunner",
    "Region",
    "RequestInput",
    "RouteState",
    "Routing",
    "TableProfile",
    "WorkerLost",
    "branch_draw",
    "default_intra_op_threads",
    "detection_region",
    "feasible_target",
    "fit_input",
    "parse_payload",
    "resolve_providers",
    "resolve_worker_mode",
    "route_key",
    "summarize_output",
]
