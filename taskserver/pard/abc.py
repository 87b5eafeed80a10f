"""Extension points of the PARD core: the profile, the request queue and the dropping policy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Protocol, runtime_checkable

from taskserver.pard.request import BatchPlan, Decision, ModuleContext, PipelineRequest

__all__ = ["Dropper", "Profile", "RequestQueue"]


@runtime_checkable
class Profile(Protocol):
    """Offline profile of execution durations (PARD §5.1): d_k for a module at a batch size."""

    def duration_ms(self, module_id: str, batch: int) -> float:
        """Profiled duration of one batch of `batch` requests on `module_id`, in milliseconds."""
        ...


class RequestQueue(ABC):
    """A worker's queue of requests waiting to join a batch."""

    __slots__ = ()

    @abstractmethod
    def push(self, request: PipelineRequest, now: float) -> None:
        """Enqueue a request that arrived at `now`; raises DuplicateRequest for a queued id."""

    @abstractmethod
    def pop(self, now: float) -> PipelineRequest | None:
        """Remove and return the next request in the queue's order, or None when empty."""

    @abstractmethod
    def remove(self, request_id: Hashable) -> PipelineRequest | None:
        """Remove a queued request by id (a cancelled query); None when it is not queued."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, request_id: object) -> bool: ...


class Dropper(ABC):
    """A dropping policy: one decision per request before it joins a batch (PARD Fig. 5, t_b)."""

    name: str = ""  # the factory name (create_dropper)

    @abstractmethod
    def decide(self, request: PipelineRequest, module: ModuleContext, now: float) -> Decision:
        """Admit `request` into the batch that starts at ``module.expected_start_s``, or drop it."""

    @abstractmethod
    def new_queue(self) -> RequestQueue:
        """A fresh queue in this policy's order, one per worker."""

    def form_batch(
        self,
        queue: RequestQueue,
        module: ModuleContext,
        now: float,
        room: int | None = None,
    ) -> BatchPlan:
        """Fetch requests in queue order and decide each until `room` are admitted (§4.1 ⑥).

        `room` defaults to the batch size; the shell calls again with what is left of it when a
        request arrives before the batch starts.
        """
        plan = BatchPlan()
        room = module.batch_size if room is None else room
        while len(plan.admitted) < room:
            request = queue.pop(now)
            if request is None:
                break
            decision = self.decide(request, module, now)
            (plan.admitted if decision.admit else plan.dropped).append((request, decision))
        return plan
