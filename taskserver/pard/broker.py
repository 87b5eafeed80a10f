"""PARD's Request Broker (§4.2): the end-to-end estimate of eq. (3) and the drop decision.

Eq. (3b), for a request at module M_k at the moment t_b it would join a batch:

    L = (t_e - t_s + d_k)  +  (sum q_i + sum d_i + F^-1_{k+1->N}(lambda)),   i = k+1..N

with t_e the expected start of the batch (end of the running one), t_s the send time, d_k the
profiled duration at the current batch size and the bracket on the right from the State
Planner. t_e - t_s splits into L_pre = t_b - t_s (eq. 1, backward) and W_k = t_e - t_b (eq. 2,
current; Q_k = t_b - t_r is inside L_pre at t_b). The request is dropped when L > SLO, i.e.
when it would finish after its deadline; L == SLO still meets it. For a DAG, L is taken along
every downstream path and the maximum decides (§4.2).

Ablations (Table 1 of §5.1; §5.3 is not at hand, so each follows its one-line description):
``back`` keeps L_pre + L_cur only; ``sf`` keeps sum d_i downstream but no Q or W; ``lower`` sets
w_k = 0 and ``upper`` w_k = sum d_i. Queue-order ablations reuse eq. (3) with another order.
PARD-oc, PARD-split and PARD-WCL replace the drop test itself (ablations.py).
"""

from __future__ import annotations

from enum import StrEnum

from taskserver.pard.abc import Dropper, RequestQueue
from taskserver.pard.depq import BudgetQueue, QueueOrder, create_queue, parse_queue_order
from taskserver.pard.load import Priority, PriorityConfig
from taskserver.pard.request import (
    BatchPlan,
    Decision,
    LatencyEstimate,
    ModuleContext,
    PipelineRequest,
    Reason,
)
from taskserver.pard.state import PathEstimate, StatePlanner

__all__ = ["Estimator", "RequestBroker", "estimate_latency"]


class Estimator(StrEnum):
    """Which parts of eq. (3b) an estimate keeps."""

    FULL = "full"  # PARD: eq. (3b) with w_k = F^-1(lambda)
    BACK = "back"  # PARD-back: preceding and current modules only (L_pre + L_cur)
    SF = "sf"  # PARD-sf: downstream sum d_i, ignoring Q and W of subsequent modules
    LOWER = "lower"  # PARD-lower: downstream batch wait assumed 0
    UPPER = "upper"  # PARD-upper: downstream batch wait assumed sum d_i


def estimate_latency(
    request: PipelineRequest,
    module: ModuleContext,
    now: float,
    path: PathEstimate | None,
    estimator: Estimator = Estimator.FULL,
) -> LatencyEstimate:
    """Eq. (3b) for one downstream path (None: a sink, or an estimator without L_sub)."""
    pre_s = now - request.sent_s  # L_pre = t_b - t_s
    wait_s = max(0.0, module.expected_start_s - now)  # W_k = t_e - t_b (0 on an idle worker)
    if path is None or estimator is Estimator.BACK:
        return LatencyEstimate(pre_s, wait_s, module.duration_s)
    if estimator is Estimator.SF:
        return LatencyEstimate(pre_s, wait_s, module.duration_s, 0.0, path.exec_s, 0.0, path.path)
    if estimator is Estimator.LOWER:
        sub_wait_s = 0.0
    elif estimator is Estimator.UPPER:
        sub_wait_s = path.exec_s
    else:
        sub_wait_s = path.wait_s
    return LatencyEstimate(
        pre_s, wait_s, module.duration_s, path.queue_s, path.exec_s, sub_wait_s, path.path
    )


class RequestBroker(Dropper):
    """PARD's dropper: eq. (3) at t_b on a DEPQ popped HBF/LBF (§4.2, §4.3), and its ablations."""

    def __init__(
        self,
        planner: StatePlanner,
        *,
        estimator: Estimator | str = Estimator.FULL,
        order: QueueOrder | str = QueueOrder.ADAPTIVE,
        priority: PriorityConfig | None = None,
        name: str = "pard",
    ) -> None:
        try:
            self.estimator = Estimator(estimator)
        except ValueError:
            valid = ", ".join(repr(e.value) for e in Estimator)
            raise ValueError(f"broker estimator: unknown {estimator!r}, expected {valid}") from None
        self.planner = planner
        self.order = parse_queue_order(order)
        self.priority = priority
        self.name = name

    def new_queue(self) -> RequestQueue:
        """A BudgetQueue in this broker's order (a FifoQueue for PARD-FCFS)."""
        return create_queue(self.order, self.priority)

    def estimate(
        self, request: PipelineRequest, module: ModuleContext, now: float
    ) -> LatencyEstimate:
        """L of eq. (3), the maximum over the downstream paths (§4.2, DAG)."""
        if self.estimator is Estimator.BACK:
            return estimate_latency(request, module, now, None, self.estimator)
        best: LatencyEstimate | None = None
        for path in self.planner.downstream():
            est = estimate_latency(request, module, now, path, self.estimator)
            if best is None or est.sub_s > best.sub_s:  # shared L_pre + L_cur: compare L_sub
                best = est
        assert best is not None  # a graph gives every module at least one (maybe empty) path
        return best

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Drop when L > SLO (eq. 3)."""
        est = self.estimate(request, module, now)
        total = est.total_s
        if total > request.slo_s:
            return Decision(False, Reason.OVER_SLO, total, request.slo_s, est)
        return Decision(True, Reason.WITHIN_SLO, total, request.slo_s, est)

    def form_batch(
        self,
        queue: RequestQueue,
        module: ModuleContext,
        now: float,
        room: int | None = None,
    ) -> BatchPlan:
        """Fill the batch in DEPQ order; under HBF first drop the hopeless low-budget end.

        Beyond the paper: while HBF takes the largest budgets, requests at the low end would
        only be decided once they surface, long after they became hopeless. The DEPQ can pop
        both ends (§4.3), so each round also drops from the low end while eq. (3) says drop;
        those requests would be dropped anyway, as their estimate only grows while they wait.
        Q_k and W_k of every admitted request go to the planner (q_k window, wait sketch).
        """
        sweep: list[tuple[PipelineRequest, Decision]] = []
        if isinstance(queue, BudgetQueue):
            queue.set_capacity_rps(module.capacity_rps)
            if queue.priority(now) is Priority.HBF:
                while (lowest := queue.peek_min()) is not None:
                    decision = self.decide(lowest, module, now)
                    if decision.admit:
                        break
                    queue.pop_min()
                    sweep.append((lowest, decision))
        plan = super().form_batch(queue, module, now, room)
        if sweep:
            plan.dropped[:0] = sweep
        wait_s = max(0.0, module.expected_start_s - now)
        for request, _ in plan.admitted:
            self.planner.record_queue_delay(now - request.received_s, now)
            self.planner.record_batch_wait(wait_s, module.duration_s)
        return plan
