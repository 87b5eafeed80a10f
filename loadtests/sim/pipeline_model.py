"""What the pipeline simulator runs: the module DAG with its profile, b_k, and run settings.

`PipelineModel` holds one pipeline: modules (string ids, in spec order) with their ``subs`` and
``pres``, the branch shares of its splits (``branches``, taskserver/pipeline/routing.py), the
end-to-end SLO, each module's feasible batch sizes and the offline profile that gives d_k(b)
(PARD §4.2, §5.1). `nexus_batch_sizes` picks the batch size b_k each module
collects up to; `SimConfig` says how one run is simulated (see `loadtests.sim.pipeline`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taskserver.pard import PipelineGraph, Profile, ScalingConfig
from taskserver.pipeline.routing import Routing

__all__ = ["PipelineModel", "SimConfig", "nexus_batch_sizes"]


class PipelineModel:
    """What is simulated: the module DAG, its SLO, feasible batch sizes and the profile."""

    def __init__(
        self,
        name: str,
        subs: Mapping[str, Sequence[str]],
        slo_s: float,
        profile: Profile,
        batch_sizes: Mapping[str, Sequence[int]] | None = None,
        names: Mapping[str, str] | None = None,
        branches: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        """`branches`: per split module, {sub: share of requests that take it} (routing.py)."""
        if not (math.isfinite(slo_s) and slo_s > 0):
            raise ValueError(f"pipeline slo_s: must be > 0, got {slo_s!r}")
        self.name = name
        self.slo_s = float(slo_s)
        self.profile = profile
        self.graph = PipelineGraph.from_subs({str(m): [str(s) for s in v] for m, v in subs.items()})
        listed = [str(m) for m in subs] + [str(s) for v in subs.values() for s in v]
        self.modules: tuple[str, ...] = tuple(dict.fromkeys(listed))  # the order given
        self.subs: dict[str, tuple[str, ...]] = {m: () for m in self.modules}
        for m, v in subs.items():
            self.subs[str(m)] = tuple(str(s) for s in v)
        self.pres: dict[str, tuple[str, ...]] = {m: () for m in self.modules}
        for m, v in self.subs.items():
            for s in v:
                self.pres[s] = (*self.pres[s], m)
        sources = [m for m in self.modules if not self.pres[m]]
        if len(sources) != 1:
            raise ValueError(f"pipeline {name!r}: need exactly one source module, got {sources}")
        self.source = sources[0]
        self.sinks = tuple(m for m in self.modules if not self.subs[m])
        sizes = batch_sizes or {}
        self.batch_sizes: dict[str, tuple[int, ...]] = {
            m: tuple(sorted(sizes.get(m, (1,)))) for m in self.modules
        }
        for m, b in self.batch_sizes.items():
            if not b or b[0] < 1:
                raise ValueError(f"pipeline batch_sizes[{m!r}]: need sizes >= 1, got {b!r}")
        self.names = {m: (names or {}).get(m, m) for m in self.modules}
        self.routing = Routing(self.subs, branches)
        self._durations: dict[tuple[str, int], float] = {}

    @classmethod
    def from_spec(cls, spec: Any, profile: Profile) -> PipelineModel:
        """From an `onnx_models` PipelineSpec and its profile (ids become strings)."""
        return cls(
            spec.name,
            {str(m.id): [str(s) for s in m.subs] for m in spec.modules},
            spec.slo_ms / 1000.0,
            profile,
            {str(m.id): m.batch_sizes for m in spec.modules},
            {str(m.id): m.name for m in spec.modules},
            {str(m.id): dict(m.branches) for m in spec.modules if m.branches},
        )

    def duration_s(self, module_id: str, batch: int) -> float:
        """d_k(batch) from the profile, in seconds."""
        key = (module_id, batch)
        d = self._durations.get(key)
        if d is None:
            d = self._durations[key] = self.profile.duration_ms(module_id, batch) / 1000.0
        return d


def nexus_batch_sizes(model: PipelineModel, slo_s: float | None = None) -> dict[str, int]:
    """b_k per module: the largest feasible size with 2 d_k(b) within its SLO share (Nexus)."""
    slo = model.slo_s if slo_s is None else slo_s
    top = {m: model.duration_s(m, model.batch_sizes[m][-1]) for m in model.modules}
    out = {}
    for m in model.modules:
        path_s = max(sum(top[x] for x in p) for p in model.graph.paths_through(m))
        share_s = slo * top[m] / path_s
        fits = [b for b in model.batch_sizes[m] if 2.0 * model.duration_s(m, b) <= share_s]
        out[m] = fits[-1] if fits else model.batch_sizes[m][0]
    return out


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How one pipeline run is simulated."""

    workers: int | Mapping[str, int] = 1
    """Workers per module: one number for all, or per module id (missing ones: 1)."""
    scaling: ScalingConfig | None = None
    """Scale each module's workers at run time (PARD §5.1), starting from `workers`; None:
    `workers` stay fixed."""
    max_batch: Mapping[str, int] | None = None
    """b_k per module; None: `nexus_batch_sizes`."""
    duration_cv: float = 0.05
    """Coefficient of variation of the log-normal noise on each batch's duration."""
    exchange_period_s: float = 1.0
    """State exchange period (PARD §4.1 ②)."""
    wait_quantile: float = 0.1
    """lambda of PARD §4.2."""
    wait_samples: int = 2_000
    """Draws behind w_k per refresh (the paper's M is 10,000; 2,000 keeps runs fast)."""
    queue_window_s: float = 5.0
    """The q_i window (PARD footnote 4)."""
    goodput_window_s: float = 1.0
    """Window of the goodput samples taken each second."""
    seed: int = 0

    def workers_of(self, module_id: str) -> int:
        """Workers of one module."""
        n = self.workers if isinstance(self.workers, int) else self.workers.get(module_id, 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"sim workers[{module_id!r}]: must be an int >= 1, got {n!r}")
        return n
