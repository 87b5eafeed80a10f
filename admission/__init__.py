"""Admission control and autoscaling policies driven by the task deadline-miss ratio.

Layout (pure policy objects: time comes in as `now`; no clock, socket, thread or env read):

- `window`: `MissRatioWindow`, the task deadline-miss ratio over a moving window
  (TailGuard §III.D), overall and per class, by task count or by time.
- `controller`: `AdmissionController` and its rules (TailGuard's reject-all on R_cth^U,
  lowest-class-first, largest-fanout-first, and client-side-scheduling's cost ladder); the
  decision types `QueryInfo`, `Pressure`, `Decision`; and the package's exception tree.
- `autoscale`: `ThresholdAutoscaler` on R_sth^U / R_sth^L (TailGuard §III.E), `ScaleDecision`
  and `vertical_step` for emulated vertical scaling.
- `swayam`: model-based scale-out after Swayam §4 (`RatePredictor`, `required_backends`,
  `SwayamPolicy`), passive scale-in (`IdleTracker`) and the shared `backend_order`.

- `actuators` (shell side, not re-exported: import `admission.actuators` explicitly, so the
  pure core above stays free of aiohttp): carries out a scaling decision for a pool.

The package imports nothing else of ours (DESIGN.md); `gateway` and the shells act on the
decisions.

Errors::

    AdmissionError               base of every error the policy modules raise
     └── PolicyValueError        a policy built or called with a bad value (also a ValueError);
                                 the message names the setting and quotes the value
    ActuatorError                (admission.actuators) scaling could not be carried out
"""

from admission.autoscale import (
    SCALE_DOWN_FACTOR,
    SCALE_UP_FACTOR,
    ScaleDecision,
    ThresholdAutoscaler,
    vertical_step,
)
from admission.controller import (
    Action,
    AdmissionController,
    AdmissionError,
    CostLadder,
    Decision,
    PolicyValueError,
    Pressure,
    QueryInfo,
    Rule,
)
from admission.swayam import (
    BackendEstimate,
    IdleTracker,
    RatePredictor,
    SwayamPolicy,
    backend_order,
    estimate_backends,
    required_backends,
    response_percentile_ms,
    waiting_percentile_ms,
)
from admission.window import MissRatioWindow

__all__ = [
    "SCALE_DOWN_FACTOR",
    "SCALE_UP_FACTOR",
    "Action",
    "AdmissionController",
    "AdmissionError",
    "BackendEstimate",
    "CostLadder",
    "Decision",
    "IdleTracker",
    "MissRatioWindow",
    "PolicyValueError",
    "Pressure",
    "QueryInfo",
    "RatePredictor",
    "Rule",
    "ScaleDecision",
    "SwayamPolicy",
    "ThresholdAutoscaler",
    "backend_order",
    "estimate_backends",
    "required_backends",
    "response_percentile_ms",
    "vertical_step",
    "waiting_percentile_ms",
]
