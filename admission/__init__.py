"""Admission control and autoscaling policies driven by the task deadline-miss ratio.

Layout (pure policy objects: time comes in as `now` or from an injected clock; no socket,
thread or env read):

- `gate`: `AdmissionGate`, everything that decides admit / reject / defer for a query (the
  window, the window-age reset, the tails, the fast path and the controller); the gateway
  and the simulator call it the same way.
- `config`: `AdmissionConfig`, the [admission] table; `AllocationConfig`, [allocation].
- `decisions`: `Rule` (the config enum), `Signal`, `QueryInfo`, `Pressure`, `Decision`.
- `rules`: one class per rule (TailGuard's reject-all on R_cth^U, lowest-class-first,
  largest-fanout-first, the throttle, client-side-scheduling's cost ladder), built by
  `make_rule`; each declares the signals it reads.
- `controller`: `AdmissionController`, what the rules share (classes, recent queries,
  counters).
- `window`: `MissRatioWindow`, the task deadline-miss ratio over a moving window
  (TailGuard §III.D), overall and per class, by task count or by time.
- `tails`: recent latency / SLO per class, and `nearest_rank`.
- `autoscale`: `ThresholdAutoscaler` on R_sth^U / R_sth^L (TailGuard §III.E), `ScaleDecision`
  and `vertical_step` for emulated vertical scaling.
- `swayam`: model-based scale-out after Swayam §4 (`RatePredictor`, `required_backends`,
  `SwayamPolicy`), passive scale-in (`IdleTracker`) and the shared `backend_order`.
- `waiting`: QLM's waiting-time estimator (§6, eqs. 2-3): `ServiceMoments`, `estimate_wait`
  (the queue wait of a task joining a server, as a Normal), `meet_probability` (a fanout
  query's chance to meet its SLO from its targets' waits and latency CDFs); read by the
  ``predictive`` rule.
- `errors`: the exception tree below.

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
from admission.config import AdmissionConfig, AdmissionPolicy, AllocationConfig
from admission.controller import AdmissionController
from admission.decisions import Action, Decision, Pressure, QueryInfo, Rule, Signal
from admission.errors import AdmissionError, PolicyValueError
from admission.gate import AdmissionGate
from admission.rules import AdmissionRule, CostLadder, make_rule
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
from admission.tails import nearest_rank
from admission.waiting import (
    ServiceMoments,
    WaitEstimate,
    estimate_wait,
    meet_probability,
)
from admission.window import MissRatioWindow

__all__ = [
    "SCALE_DOWN_FACTOR",
    "SCALE_UP_FACTOR",
    "Action",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionError",
    "AdmissionGate",
    "AdmissionPolicy",
    "AdmissionRule",
    "AllocationConfig",
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
    "ServiceMoments",
    "Signal",
    "SwayamPolicy",
    "ThresholdAutoscaler",
    "WaitEstimate",
    "backend_order",
    "estimate_backends",
    "estimate_wait",
    "make_rule",
    "meet_probability",
    "nearest_rank",
    "required_backends",
    "response_percentile_ms",
    "vertical_step",
    "waiting_percentile_ms",
]
