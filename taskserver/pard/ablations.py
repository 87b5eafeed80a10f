"""PARD's ablations that replace the drop test of eq. (3): PARD-oc, PARD-split and PARD-WCL.

PARD §5.1, Table 1 lists ten ablations. Seven keep eq. (3) and change one part of it or the
queue order (``broker``: back, sf, lower, upper; ``depq``: FCFS, HBF, LBF). These three replace
the test that decides *when* to drop and keep the rest of PARD: the DEPQ popped HBF/LBF with the
delayed transition (§4.3), the low-end sweep under HBF, and the Q_k and W_k records that feed
the State Planner. Table 1 gives each one line (§5.3, which explains them, is not at hand), so
each is read from its line as below; the comparisons are those of eq. (3): ``>`` drops, a
request that exactly meets its limit is admitted.

- PARD-oc [44], "Overload control based on Q": a module-local overload controller driven by
  queueing delay. A request is dropped when the queueing delay it saw at this module,
  Q_k = t_b - t_r (eq. 2), exceeds the module's queueing target

      tau_k = max(0, SLO - 2 sum_i d_i) * d_k / sum_i d_i,

  the part of the SLO left for queueing once every module on the path has had its worst-case
  batch wait (W_i <= d_i, Fig. 3b) and its execution, shared in proportion to d_k (the
  proportional split of §5.1's Clipper++; sum over the path through k with the largest sum).
  It sees neither the time the request spent upstream (L_pre) nor the downstream L_sub.
- PARD-split [22], "Fixed per-module SLO split": the SLO is split once over the modules in
  proportion to d_i (the profile at the batch sizes the planner starts with),
  SLO_i = SLO d_i / sum d_i, and a request must be through module k by its cumulative split:
  admitted when L_pre + L_cur = t_e - t_s + d_k <= sum_{i <= k} SLO_i, i.e. eq. (3) with L_sub
  replaced by the split's fixed reservation for the modules after k. Clipper++ (baselines.py)
  instead compares only the time spent at module k before inference (t_b - t_r) with SLO_k,
  in arrival order; PARD-split counts all the latency so far plus the batch wait and
  execution ahead at k, and keeps PARD's queue.
- PARD-WCL, "Split latency budget dynamically": as PARD-split, but the split follows each
  module's worst-case latency WCL_i = q_i + 2 d_i (eq. 2 with Q_i at its recent average q_i,
  W_i at its bound d_i and D_i = d_i), read from the synchronised state (§4.2) at every
  decision: a module whose queue grows takes a larger share of the SLO.

For a DAG the split is taken along every source-to-sink path through the module and the
smallest cumulative share decides (the tightest path, as eq. 3 takes the largest L over the
downstream paths).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

from taskserver.pard.broker import Estimator, RequestBroker, estimate_latency
from taskserver.pard.depq import QueueOrder
from taskserver.pard.load import PriorityConfig
from taskserver.pard.request import Decision, ModuleContext, PipelineRequest, Reason
from taskserver.pard.state import StatePlanner

__all__ = ["FixedSplitBroker", "OverloadControlBroker", "WorstCaseSplitBroker", "cumulative_share"]


def cumulative_share(
    paths: Sequence[Sequence[str]], module_id: str, cost: Callable[[str], float]
) -> float:
    """The smallest share sum_{i <= k} c_i / sum_i c_i over the paths through module k."""
    share = 1.0
    for path in paths:
        costs = [cost(m) for m in path]
        total = sum(costs)
        if total > 0:
            share = min(share, sum(costs[: list(path).index(module_id) + 1]) / total)
    return share


class _SplitBroker(RequestBroker):
    """PARD with eq. (3)'s L_sub replaced by an SLO split: L_pre + L_cur <= SLO * share."""

    def __init__(
        self,
        planner: StatePlanner,
        *,
        order: QueueOrder | str = QueueOrder.ADAPTIVE,
        priority: PriorityConfig | None = None,
        name: str,
    ) -> None:
        super().__init__(planner, order=order, priority=priority, name=name)

    @abstractmethod
    def share(self) -> float:
        """The cumulative share of the SLO by which a request must be through this module."""

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Drop when t_e - t_s + d_k exceeds the cumulative split of the SLO."""
        est = estimate_latency(request, module, now, None, Estimator.BACK)  # L_pre + L_cur
        limit = request.slo_s * self.share()
        if est.total_s > limit:
            return Decision(False, Reason.OVER_SPLIT, est.total_s, limit, est)
        return Decision(True, Reason.WITHIN_SPLIT, est.total_s, limit, est)


class FixedSplitBroker(_SplitBroker):
    """PARD-split (Table 1, [22]): a fixed per-module SLO split in proportion to d_i."""

    def __init__(
        self,
        planner: StatePlanner,
        *,
        order: QueueOrder | str = QueueOrder.ADAPTIVE,
        priority: PriorityConfig | None = None,
        name: str = "split",
    ) -> None:
        super().__init__(planner, order=order, priority=priority, name=name)
        # Fixed once: the profile's d_i at the batch sizes the planner starts with.
        durations = {m: planner.profiled_s(m) for m in planner.graph.modules}
        self._share = cumulative_share(
            planner.graph.paths_through(planner.module_id), planner.module_id, durations.__getitem__
        )

    def share(self) -> float:
        """sum_{i <= k} d_i / sum_i d_i, fixed when the policy was built."""
        return self._share


class WorstCaseSplitBroker(_SplitBroker):
    """PARD-WCL (Table 1): the SLO split re-allocated by worst-case latency q_i + 2 d_i."""

    def __init__(
        self,
        planner: StatePlanner,
        *,
        order: QueueOrder | str = QueueOrder.ADAPTIVE,
        priority: PriorityConfig | None = None,
        name: str = "wcl",
    ) -> None:
        super().__init__(planner, order=order, priority=priority, name=name)

    def worst_case_s(self, module_id: str) -> float:
        """WCL_i = q_i + W_i + D_i at W_i's bound d_i (eq. 2, Fig. 3b)."""
        return self.planner.state(module_id).queue_delay_s + 2.0 * self.planner.duration_s(
            module_id
        )

    def share(self) -> float:
        """sum_{i <= k} WCL_i / sum_i WCL_i from the state held now."""
        planner = self.planner
        return cumulative_share(
            planner.graph.paths_through(planner.module_id), planner.module_id, self.worst_case_s
        )


class OverloadControlBroker(RequestBroker):
    """PARD-oc (Table 1, [44]): drop when this module's queueing delay Q_k exceeds its target."""

    def __init__(
        self,
        planner: StatePlanner,
        *,
        order: QueueOrder | str = QueueOrder.ADAPTIVE,
        priority: PriorityConfig | None = None,
        name: str = "oc",
    ) -> None:
        super().__init__(planner, order=order, priority=priority, name=name)

    def target_s(self, request: PipelineRequest) -> float:
        """tau_k = max(0, SLO - 2 sum d_i) * d_k / sum d_i on the longest path through k."""
        path_s = self.planner.full_path_exec_s()
        own_s = self.planner.duration_s(self.planner.module_id)
        return max(0.0, request.slo_s - 2.0 * path_s) * own_s / path_s

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Drop when Q_k = t_b - t_r exceeds tau_k."""
        queued_s = now - request.received_s
        target = self.target_s(request)
        if queued_s > target:
            return Decision(False, Reason.OVER_QUEUE_TARGET, queued_s, target)
        return Decision(True, Reason.WITHIN_QUEUE_TARGET, queued_s, target)
