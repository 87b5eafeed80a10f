"""PARD's policy core: proactive request dropping for multi-model inference pipelines.

Pure code: time comes in as `now` (seconds on the local clock); nothing here reads a clock,
opens a socket or starts a task, and nothing needs numpy. Layout, one idea a file:

- ``request``   what a policy looks at (PipelineRequest, ModuleContext) and returns (Decision)
- ``graph``     PipelineGraph: a chain or DAG as its source-to-sink paths
- ``abc``       extension points: Profile, RequestQueue, Dropper
- ``window``    the linear-weighted sliding window behind q_i (§4.2)
- ``batchwait`` the aggregated downstream batch wait and its lambda-quantile w_k (§4.2)
- ``state``     StatePlanner (L_sub of eq. 3), ModuleState snapshots, StateExchange
- ``load``      mu, eps and HBF/LBF switching with the delayed transition (§4.3)
- ``depq``      DoubleEndedPriorityQueue and the worker queues on it (§4.3)
- ``broker``    RequestBroker: eq. (3) and its ablations (back, sf, lower, upper)
- ``ablations`` PARD-oc, PARD-split, PARD-WCL: Table 1's ablations with another drop test
- ``baselines`` none, Nexus, Clipper++ (§5.1)
- ``factory``   create_dropper(name, planner)
- ``scaling``   WorkerScaler: workers per module from the request rate (§5.1 resource scaling)
- ``metrics``   goodput, drop rate, invalid rate (§5.1)

Errors::

    Exception
     └── PardError
          ├── UnknownModule      a module id the pipeline graph does not hold (also KeyError)
          └── DuplicateRequest   push() of a request id already queued (also KeyError)

Bad settings raise ValueError naming the setting and quoting the value.
"""

from taskserver.pard.abc import Dropper, Profile, RequestQueue
from taskserver.pard.ablations import (
    FixedSplitBroker,
    OverloadControlBroker,
    WorstCaseSplitBroker,
    cumulative_share,
)
from taskserver.pard.baselines import ClipperPlusPlus, NexusDropper, NoDropper
from taskserver.pard.batchwait import (
    WaitSketch,
    quantile,
    sample_aggregate_waits,
    uniform_fractions,
)
from taskserver.pard.broker import Estimator, RequestBroker, estimate_latency
from taskserver.pard.depq import (
    BudgetQueue,
    DoubleEndedPriorityQueue,
    FifoQueue,
    QueueOrder,
    create_queue,
    parse_queue_order,
)
from taskserver.pard.errors import DuplicateRequest, PardError, UnknownModule
from taskserver.pard.factory import DROPPER_NAMES, create_dropper
from taskserver.pard.graph import PipelineGraph, SupportsPaths
from taskserver.pard.load import AdaptivePriority, ArrivalRateMonitor, Priority, PriorityConfig
from taskserver.pard.metrics import ModuleSummary, PardMetrics, PipelineSummary
from taskserver.pard.request import (
    BatchPlan,
    Decision,
    LatencyEstimate,
    ModuleContext,
    PipelineRequest,
    Reason,
)
from taskserver.pard.scaling import ModuleScaling, ScalingConfig, ScalingDecision, WorkerScaler
from taskserver.pard.state import ModuleState, PathEstimate, StateExchange, StatePlanner
from taskserver.pard.window import LinearWeightedWindow

__all__ = [
    "DROPPER_NAMES",
    "AdaptivePriority",
    "ArrivalRateMonitor",
    "BatchPlan",
    "BudgetQueue",
    "ClipperPlusPlus",
    "Decision",
    "DoubleEndedPriorityQueue",
    "Dropper",
    "DuplicateRequest",
    "Estimator",
    "FifoQueue",
    "FixedSplitBroker",
    "LatencyEstimate",
    "LinearWeightedWindow",
    "ModuleContext",
    "ModuleScaling",
    "ModuleState",
    "ModuleSummary",
    "NexusDropper",
    "NoDropper",
    "OverloadControlBroker",
    "PardError",
    "PardMetrics",
    "PathEstimate",
    "PipelineGraph",
    "PipelineRequest",
    "PipelineSummary",
    "Priority",
    "PriorityConfig",
    "Profile",
    "QueueOrder",
    "Reason",
    "RequestBroker",
    "RequestQueue",
    "ScalingConfig",
    "ScalingDecision",
    "StateExchange",
    "StatePlanner",
    "SupportsPaths",
    "UnknownModule",
    "WaitSketch",
    "WorkerScaler",
    "WorstCaseSplitBroker",
    "create_dropper",
    "create_queue",
    "cumulative_share",
    "estimate_latency",
    "parse_queue_order",
    "quantile",
    "sample_aggregate_waits",
    "uniform_fractions",
]
