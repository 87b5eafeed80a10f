"""Reactive baselines of PARD §5.1: no dropping, Nexus and Clipper++.

Gaps the paper leaves open, decided here:
- Nexus's "current module's latency budget" is read as the request's end-to-end deadline: a
  request in the window is fine when the next batch, started at t_e, ends by its deadline
  (Fig. 1b, "will be timed out after its execution"). When fewer than `room` slots are left
  in a batch being formed, the window is that many requests.
- Clipper++ compares the time the request has spent at this module (t_b - t_r) with the
  module's share SLO_k = SLO * d_k / sum d_i ("already exceeds the latency objective before
  inference", per module). For a DAG, sum d_i is taken over the longest source-to-sink path
  through the module, so the shares along any path never add up to more than the SLO.
"""

from __future__ import annotations

import math

from taskserver.pard.abc import Dropper, RequestQueue
from taskserver.pard.depq import FifoQueue
from taskserver.pard.request import BatchPlan, Decision, ModuleContext, PipelineRequest, Reason
from taskserver.pard.state import StatePlanner

__all__ = ["ClipperPlusPlus", "NexusDropper", "NoDropper"]


class NoDropper(Dropper):
    """The naive baseline: never drop, serve in arrival order."""

    name = "none"

    def new_queue(self) -> RequestQueue:
        """Arrival order."""
        return FifoQueue()

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Always admit; the estimate reported is the elapsed time."""
        return Decision(True, Reason.NO_POLICY, now - request.sent_s, math.inf)


class NexusDropper(Dropper):
    """Nexus: scan the FIFO queue with a batch-sized window, drop ahead of the first good one."""

    name = "nexus"

    def new_queue(self) -> RequestQueue:
        """Arrival order."""
        return FifoQueue()

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Meets its deadline if executed in the next batch: t_e + d_k <= t_s + SLO."""
        finish_s = max(module.expected_start_s, now) + module.duration_s
        estimate = finish_s - request.sent_s
        if estimate > request.slo_s:
            return Decision(False, Reason.OVER_SLO, estimate, request.slo_s)
        return Decision(True, Reason.WITHIN_SLO, estimate, request.slo_s)

    def form_batch(
        self,
        queue: RequestQueue,
        module: ModuleContext,
        now: float,
        room: int | None = None,
    ) -> BatchPlan:
        """Nexus's window scan (§5.1): stop at the first position whose window all meet their
        deadlines, drop every request before it, and batch from there."""
        if not isinstance(queue, FifoQueue):
            raise TypeError(f"nexus needs a FifoQueue, got {type(queue).__name__}")
        window = module.batch_size if room is None else room
        plan = BatchPlan()
        if window < 1 or not queue:
            return plan
        decisions: list[Decision] = []
        run = 0  # feasible requests in a row, ending at the current position
        start = None
        for request in queue:
            decision = self.decide(request, module, now)
            decisions.append(decision)
            run = run + 1 if decision.admit else 0
            if run == window:
                start = len(decisions) - window
                break
        if start is None:  # the tail run (shorter than a window) is the only feasible window
            start = len(decisions) - run
        for i in range(start):
            request = queue.pop(now)
            assert request is not None
            decision = decisions[i]
            if decision.admit:  # feasible itself, but ahead of the first feasible window
                decision = Decision(False, Reason.NEXUS_HEAD, decision.estimate_s, decision.limit_s)
            plan.dropped.append((request, decision))
        for decision in decisions[start : start + window]:
            request = queue.pop(now)
            assert request is not None
            plan.admitted.append((request, decision))
        return plan


class ClipperPlusPlus(Dropper):
    """Clipper++: a fixed SLO share per module, SLO_k = SLO * d_k / sum d_i (§5.1)."""

    name = "clipper++"

    def __init__(self, planner: StatePlanner) -> None:
        self.planner = planner

    def new_queue(self) -> RequestQueue:
        """Arrival order."""
        return FifoQueue()

    def share_s(self, request: PipelineRequest, module: ModuleContext) -> float:
        """SLO_k for this module at the current batch sizes."""
        return request.slo_s * module.duration_s / self.planner.full_path_exec_s()

    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Drop when the time spent at this module already exceeds SLO_k."""
        spent_s = now - request.received_s
        share = self.share_s(request, module)
        if spent_s > share:
            return Decision(False, Reason.OVER_SHARE, spent_s, share)
        return Decision(True, Reason.WITHIN_SHARE, spent_s, share)
