"""The allocation layer in the gateway: fair share of the pools between tenants or classes.

``[allocation]`` (client-side-scheduling §3.1; admission.allocation) applies where the
gateway releases work and where it admits it:

- **Central queues**: each central-queueing server's queue is shared by the arbiter
  (gateway.allocation.AllocatedQueue): the arbiter picks the flow whose task goes into the
  next free slot, the pool's policy picks the task within the flow. Under server queueing
  the gateway holds no queue, so only the admission share below applies.
- **Admission** (``share``): with ``windows`` (the default) each flow has an admission
  gate of its own, fed only its own tasks' outcomes, so a flow is refused when its own tasks
  miss their deadlines: with the central queues shared by the arbiter, a flooding tenant's
  misses are its own. With ``transfer``, one gate for all, and `AdmissionShare` decides whose
  queries carry its refusals on the pool-wide signal (a refused query of a flow served less
  per weight than the most-served flow enters, and that flow owes the cost; the predictive
  rule's refusals are the query's own prediction and are not moved). Both are beyond the
  paper, which shares send opportunities only; `tailgate sim experiment fair-share`
  compares them.

A query's flow is its tenant (the body's `tenant`, "default" when absent) or its class
(``flows = "class"``); its cost is its cost hint or k_f * x_p^u (ms of server time), each
task carrying cost / k_f. DRR's protected flows grow with the congestion, here the
admission window's miss ratio over the threshold (1 at the threshold).

`Tenants` holds that state and the per-flow counters behind GET /v1/tenants and the
`tailgate_tenant_*` metrics. Shell code: the clock comes in as an argument.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from admission import AdmissionGate
from admission.allocation import Congestion, DrrArbiter, FairArbiter
from admission.config import AllocationConfig
from gateway.allocation import AllocatedQueue
from gateway.links import TaskLink

__all__ = ["OTHER_FLOW", "SHARE_REASON", "Tenants"]

OTHER_FLOW = "other"
"""The flow of every tenant beyond [allocation] max_flows."""

SHARE_REASON = "tenant_share"
"""The reject reason of a query refused to repay its flow's share debt."""


class Tenants:
    """The allocation layer's state in one gateway."""

    def __init__(self, config: AllocationConfig, pool_gate: AdmissionGate,
                 new_gate: Callable[[], AdmissionGate]) -> None:  # fmt: skip
        self.config = config
        self.pool_gate = pool_gate
        """The gateway's admission gate: every flow's with share != windows."""
        self._new_gate = new_gate
        self.gates: dict[str, AdmissionGate] = {}
        """share = windows: each flow's own gate."""
        self._flows: set[str] = set()
        self.congestion = Congestion()
        """The load signal DRR's protected flows grow with (shared by every central queue)."""
        self.share = config.admission_share()
        self.admitted: Counter[str] = Counter()
        self.admitted_cost: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()
        """(flow, reason) -> queries refused."""

    @property
    def enabled(self) -> bool:
        """Whether [allocation] shares anything."""
        return self.config.enabled

    def flow_of(self, tenant: str, cls: str) -> str:
        """The flow a query belongs to (OTHER_FLOW beyond max_flows distinct ones)."""
        name = tenant if self.config.flows == "tenant" else cls
        flows = self._flows
        if name not in flows:
            if len(flows) >= self.config.max_flows:
                return OTHER_FLOW
            flows.add(name)
        return name

    def gate_of(self, flow: str) -> AdmissionGate:
        """The admission gate that decides for the flow's queries."""
        if not self.config.gate_per_flow:
            return self.pool_gate
        gate = self.gates.get(flow)
        if gate is None:
            gate = self.gates[flow] = self._new_gate()
        return gate

    def note_task(self, flow: str, missed: bool, cls: str) -> None:
        """A task's deadline outcome, for the flow's own gate (share = windows); the pool's
        gate is told by the caller."""
        gate = self.gates.get(flow)
        if gate is not None:
            gate.note_task(missed, cls)

    def record_query(self, flow: str, cls: str, latency_ms: float, slo_ms: float) -> None:
        """An answered query's latency, for the flow's own gate (share = windows)."""
        gate = self.gates.get(flow)
        if gate is not None:
            gate.record_query(cls, latency_ms, slo_ms)

    def arbiter(self) -> DrrArbiter | FairArbiter | None:
        """A new arbiter for one central queue (None: allocation off)."""
        return self.config.arbiter(self.congestion) if self.enabled else None

    def note_congestion(self, miss_ratio: float, threshold: float) -> None:
        """The admission window's state: DRR's congestion level."""
        self.congestion.set(miss_ratio / threshold if threshold > 0 else 0.0)

    def decide(self, flow: str, cost: float, rule_admits: bool, now_s: float) -> bool:
        """Whether the query enters, given the admission rule's verdict (the share may move
        a refusal to another flow); counts it."""
        if self.share is None:
            enters = rule_admits
        else:
            enters = self.share.decide(flow, max(cost, 1e-9), rule_admits, now_s)
        if enters:
            self.admitted[flow] += 1
            self.admitted_cost[flow] += cost
        return enters

    def refused(self, flow: str, reason: str) -> None:
        """A query of the flow was turned away (by the rule or to repay its debt)."""
        self.rejected[(flow, reason)] += 1

    def view(self, links: Iterable[TaskLink], now_s: float) -> dict[str, Any]:
        """GET /v1/tenants: the configuration and, per flow, what it was admitted and
        refused, its share state and its tasks waiting in central queues."""
        queued: Counter[str] = Counter()
        deficit: Counter[str] = Counter()
        for lk in links:
            central = lk.queue
            q = None if central is None else central.queue
            if isinstance(q, AllocatedQueue):
                queued.update(q.backlog())
                if isinstance(q.arbiter, DrrArbiter):
                    for name, f in q.arbiter.flows.items():
                        deficit[str(name)] += f.deficit
        share = {} if self.share is None else self.share.snapshot(now_s)
        names = sorted(
            {*self.admitted, *(f for f, _ in self.rejected), *queued, *share, *self.config.weights}
        )
        flows = []
        for name in names:
            row: dict[str, Any] = {
                "flow": name,
                "weight": self.config.weights.get(name, self.config.default_weight),
                "protected": name in self.config.protected,
                "admitted": self.admitted[name],
                "admitted_cost_ms": round(self.admitted_cost[name], 4),
                "rejected": {r: n for (f, r), n in sorted(self.rejected.items()) if f == name},
                "queued_tasks": queued[name],
                "deficit_ms": round(deficit[name], 4),
            }
            gate = self.gates.get(name)
            if gate is not None:
                p = gate.pressure()
                row["miss_ratio"] = round(p.miss_ratio, 6)
            if name in share:
                s = share[name]
                row["share"] = {
                    "recent_admitted_cost_ms": round(s["recent_admitted_cost"], 4),
                    "debt_ms": round(s["debt"], 4),
                    "admitted_for_share": int(s["admitted_for_share"]),
                    "refused_for_share": int(s["refused_for_share"]),
                }
            flows.append(row)
        return {
            "policy": self.config.policy,
            "flows_by": self.config.flows,
            "share": self.config.share if self.enabled else "none",
            "congestion": round(self.congestion.level, 4),
            "flows": flows,
        }
