"""Typed configuration of one inference pipeline: modules, profile, dropping policy, knobs.

`ModuleConfig` and the graph rules (`check_module_graph`, `ModuleGraph`) are the one schema
of a pipeline's modules: `onnx_models.spec` reads spec files into them, and a task server
runs a `PipelineConfig` made of them.

Plain data on purpose: the task server imports nothing else of ours, so whoever reads a
pipeline spec file builds a `PipelineConfig` from it. Every field has a one-line doc and a
default where one makes sense; a bad value raises PipelineConfigError naming the field.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from taskserver.pard import PipelineGraph, PriorityConfig, Profile, ScalingConfig
from taskserver.pipeline.errors import PipelineConfigError
from taskserver.pipeline.routing import Routing, check_branches

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "PROVIDER_CHOICES",
    "WORKER_MODES",
    "ModuleConfig",
    "ModuleGraph",
    "PardKnobs",
    "PipelineConfig",
    "TableProfile",
    "check_module_graph",
    "topological_order",
]

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
PROVIDER_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")
WORKER_MODES: tuple[str, ...] = ("auto", "process", "thread")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


class TableProfile:
    """A profile given as ``{module_id: {batch: duration_ms}}``: d_k(b) for PARD's estimates.

    Exact at a listed batch size, linear between two listed ones; outside the listed range it
    raises ValueError rather than guess.
    """

    def __init__(self, table: Mapping[Any, Mapping[Any, float]]) -> None:
        self._rows: dict[str, list[tuple[int, float]]] = {}
        for module_id, row in table.items():
            if not isinstance(row, Mapping) or not row:
                raise PipelineConfigError(
                    f"profile[{module_id!r}]: must map batch sizes to ms, got {row!r}"
                )
            points: list[tuple[int, float]] = []
            for batch, ms in row.items():
                try:
                    b = int(batch)
                except (TypeError, ValueError):
                    b = 0
                if b < 1 or not _positive_number(ms):
                    raise PipelineConfigError(
                        f"profile[{module_id!r}][{batch!r}]: need a batch >= 1 and a duration "
                        f"> 0 ms, got {ms!r}"
                    )
                points.append((b, float(ms)))
            self._rows[str(module_id)] = sorted(points)

    def duration_ms(self, module_id: str, batch: int) -> float:
        """d_k(b) in ms for `module_id` at `batch`."""
        row = self._rows.get(str(module_id))
        if row is None:
            raise ValueError(f"profile: no durations for module {module_id!r}")
        if not row[0][0] <= batch <= row[-1][0]:
            sizes = [b for b, _ in row]
            raise ValueError(f"profile: module {module_id!r} batch {batch} outside {sizes}")
        for (b0, ms0), (b1, ms1) in pairwise(row):
            if b0 <= batch <= b1:
                return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
        return row[0][1]  # a single listed batch size equal to `batch`


@dataclass(frozen=True)
class ModuleConfig:
    """One module: a model and its place in the pipeline's DAG."""

    id: str
    """Module id, unique in its pipeline; `pres`/`subs` refer to it (ints become strings)."""
    name: str
    """Module name, for messages and results (e.g. ``face_recognition``)."""
    model: Path
    """The ``.onnx`` file (a relative path is taken from the working directory)."""
    pres: tuple[str, ...] = ()
    """Upstream module ids; a module with several waits for all of them (merge)."""
    subs: tuple[str, ...] = ()
    """Downstream module ids; each gets this module's output (split), unless `branches`
    makes it a branch that only some requests take."""
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    """Feasible batch sizes, ascending; the profile must cover each."""
    input_shape: tuple[int, ...] | None = None
    """Input shape without the batch axis (C, H, W); None: read it from the model."""
    input_dtype: str | None = None
    """Input dtype as a numpy name (``float32``); None: read it from the model."""
    roi_output: bool | None = None
    """Output rows are detections (cx, cy, w, h, score, ...) whose best box its subs crop;
    None: when the model's first output is named ``detections``."""
    branches: tuple[tuple[str, float], ...] = ()
    """Branch shares of a split: (sub id, share of requests that take that branch) pairs,
    also given as a mapping ``{sub_id: share}``; subs not named are taken by every request
    (routing.py); (): every request takes every sub."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "id", str(self.id))
        if not self.id or not isinstance(self.name, str) or not self.name:
            raise PipelineConfigError(f"module id/name: must not be empty, got {self!r}")
        set_(self, "model", Path(self.model))
        for key in ("pres", "subs"):
            value = getattr(self, key)
            if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
                raise PipelineConfigError(f"module {self.id} {key}: must be a list, got {value!r}")
            set_(self, key, tuple(str(v) for v in value))
        branches = self.branches
        try:
            if isinstance(branches, str | bytes):
                raise TypeError(branches)
            shares = {str(sub): share for sub, share in dict(branches).items()}
        except (TypeError, ValueError):
            raise PipelineConfigError(
                f"module {self.id} branches: must map sub ids to shares, got {branches!r}"
            ) from None
        if len(shares) != len(branches):
            raise PipelineConfigError(f"module {self.id} branches: a sub is named twice")
        set_(self, "branches", check_branches(self.id, self.subs, shares))
        sizes = tuple(self.batch_sizes)
        if not sizes or not all(_positive_int(b) for b in sizes):
            raise PipelineConfigError(
                f"module {self.id} batch_sizes: need ints >= 1, got {self.batch_sizes!r}"
            )
        if any(a >= b for a, b in pairwise(sizes)):
            raise PipelineConfigError(
                f"module {self.id} batch_sizes: must be strictly ascending, got {sizes!r}"
            )
        set_(self, "batch_sizes", sizes)
        if self.input_shape is not None:
            shape = tuple(self.input_shape)
            if not shape or not all(_positive_int(d) for d in shape):
                raise PipelineConfigError(
                    f"module {self.id} input_shape: need dims >= 1, got {self.input_shape!r}"
                )
            set_(self, "input_shape", shape)
        if self.input_dtype is not None:
            try:
                np.dtype(self.input_dtype)
            except TypeError as exc:
                raise PipelineConfigError(
                    f"module {self.id} input_dtype: not a numpy dtype, got {self.input_dtype!r}"
                ) from exc

    @property
    def label(self) -> str:
        """``name (id N)``, for messages."""
        return f"{self.name} (id {self.id})"


def check_module_graph(modules: Sequence[ModuleConfig]) -> None:
    """The rules a pipeline's modules obey, stated once for spec files and configs alike:
    unique ids and names, ``pres`` and ``subs`` that agree (a in b.subs ⇔ b in a.pres),
    exactly one source, every module reachable from it, no cycle. PipelineConfigError names
    the module and the field."""
    by_id: dict[str, ModuleConfig] = {}
    names: dict[str, ModuleConfig] = {}
    for m in modules:
        if m.id in by_id:
            raise PipelineConfigError(
                f"module {m.name!r}: id: {m.id} is already used by {by_id[m.id].label}"
            )
        if m.name in names:
            raise PipelineConfigError(
                f"module {m.label}: name: already used by {names[m.name].label}"
            )
        by_id[m.id] = m
        names[m.name] = m
    for m in modules:
        for key, ids in (("pres", m.pres), ("subs", m.subs)):
            if len(set(ids)) != len(ids):
                raise PipelineConfigError(f"module {m.label}: {key}: has duplicates: {list(ids)}")
            for other in ids:
                if other == m.id:
                    raise PipelineConfigError(f"module {m.label}: {key}: lists the module itself")
                if other not in by_id:
                    raise PipelineConfigError(f"module {m.label}: {key}: no module has id {other}")
        for sub in m.subs:
            if m.id not in by_id[sub].pres:
                raise PipelineConfigError(
                    f"module {by_id[sub].label}: pres: must list {m.id}, "
                    f"since {m.label} lists {sub} in its subs"
                )
        for pre in m.pres:
            if m.id not in by_id[pre].subs:
                raise PipelineConfigError(
                    f"module {by_id[pre].label}: subs: must list {m.id}, "
                    f"since {m.label} lists {pre} in its pres"
                )
    sources = [m for m in modules if not m.pres]
    if len(sources) != 1:
        found = ", ".join(m.label for m in sources) or "none"
        raise PipelineConfigError(
            f"pres: exactly one module must have empty pres (the source); found {found}"
        )
    reached = {sources[0].id}
    todo = [sources[0].id]
    while todo:
        for sub in by_id[todo.pop()].subs:
            if sub not in reached:
                reached.add(sub)
                todo.append(sub)
    for m in modules:
        if m.id not in reached:
            raise PipelineConfigError(
                f"module {m.label}: pres: not reachable from the source {sources[0].label}"
            )
    ordered = topological_order(modules)
    if len(ordered) != len(modules):
        loop = _cycle([m for m in modules if m not in ordered], by_id)
        names_on = " -> ".join(by_id[i].name for i in loop)
        raise PipelineConfigError(
            f"module {by_id[loop[0]].label}: subs: is on a cycle ({names_on})"
        )


def topological_order(modules: Sequence[ModuleConfig]) -> tuple[ModuleConfig, ...]:
    """Kahn's algorithm, stable in the given order; modules on a cycle are left out."""
    waiting = {m.id: len(m.pres) for m in modules}
    by_id = {m.id: m for m in modules}
    order: list[ModuleConfig] = []
    ready = [m for m in modules if not m.pres]
    while ready:
        m = ready.pop(0)
        order.append(m)
        for sub in m.subs:
            waiting[sub] -= 1
            if waiting[sub] == 0:
                ready.append(by_id[sub])
    return tuple(order)


def _cycle(stuck: list[ModuleConfig], by_id: Mapping[str, ModuleConfig]) -> list[str]:
    """One cycle among the modules Kahn's algorithm left out, as ids [a, b, ..., a].

    Each of them has an upstream module that was left out too, so walking upstream
    inside that set must come back to a module already seen.
    """
    stuck_ids = {m.id for m in stuck}
    walk = [stuck[0].id]
    while True:
        pre = next(p for p in by_id[walk[-1]].pres if p in stuck_ids)
        if pre in walk:
            upstream = [*walk[walk.index(pre) :], pre]
            return upstream[::-1]
        walk.append(pre)


class ModuleGraph:
    """A pipeline's modules as a DAG with one source (checked by `check_module_graph`).

    Shared by the pipeline a spec file describes (`onnx_models.spec.PipelineSpec`) and the
    one a task server runs (`PipelineConfig`): both hold ``name`` and ``modules``.
    """

    name: str
    modules: tuple[ModuleConfig, ...]

    def module(self, module_id: str | int) -> ModuleConfig:
        """The module with this id (an integer id matches its decimal string; KeyError if none)."""
        key = str(module_id)
        for m in self.modules:
            if m.id == key:
                return m
        raise KeyError(f"pipeline {self.name!r} has no module with id {module_id}")

    @property
    def source(self) -> ModuleConfig:
        """The module every request enters at."""
        return next(m for m in self.modules if not m.pres)

    @property
    def sinks(self) -> tuple[ModuleConfig, ...]:
        """Modules without downstream modules, in the given order."""
        return tuple(m for m in self.modules if not m.subs)

    def topological_order(self) -> tuple[ModuleConfig, ...]:
        """Every module after all of its upstream modules (ties in the given order)."""
        return topological_order(self.modules)

    def paths(self, from_id: str | int | None = None) -> tuple[tuple[str, ...], ...]:
        """Every path of module ids from `from_id` (default: the source) to a sink.

        PARD takes the maximum of the latency estimates over these paths (§4.2, §5.1).
        """
        by_id = {m.id: m for m in self.modules}
        start = self.source.id if from_id is None else self.module(from_id).id
        out: list[tuple[str, ...]] = []
        stack: list[tuple[str, ...]] = [(start,)]
        while stack:
            path = stack.pop()
            subs = by_id[path[-1]].subs
            if not subs:
                out.append(path)
            stack.extend((*path, s) for s in reversed(subs))
        return tuple(out)

    def downstream(self, module_id: str | int) -> tuple[ModuleConfig, ...]:
        """Every module after `module_id` on some path, in topological order (not itself)."""
        by_id = {m.id: m for m in self.modules}
        seen: set[str] = set()
        todo = list(self.module(module_id).subs)
        while todo:
            mid = todo.pop()
            if mid not in seen:
                seen.add(mid)
                todo.extend(by_id[mid].subs)
        return tuple(m for m in self.topological_order() if m.id in seen)

    def graph(self) -> PipelineGraph:
        """The module graph as PARD's core sees it."""
        return PipelineGraph.from_subs({m.id: m.subs for m in self.modules})

    def routing(self) -> Routing:
        """Which subs each request takes and when merges run (routing.py)."""
        return Routing(
            {m.id: m.subs for m in self.modules}, {m.id: dict(m.branches) for m in self.modules}
        )


@dataclass(frozen=True)
class PardKnobs:
    """Settings of PARD's State Planner, state exchange and metrics (§4.2, §5.1)."""

    window_s: float = 5.0
    """Linear-weighted window of the queueing delay q_i (footnote 4)."""
    wait_quantile: float = 0.1
    """lambda: the quantile of the aggregated downstream batch wait taken as w_k."""
    wait_samples: int = 2_000
    """Draws behind w_k. The paper's M = 10,000 costs ~4 ms per downstream module and
    refresh in CPython, on the event loop; 2,000 draws still put the 0.1-quantile within
    about +-0.7 percentile points (binomial standard error)."""
    exchange_period_s: float = 1.0
    """Modules exchange their state at most this often, each then refreshes w_k."""
    metrics_window_s: float = 10.0
    """Goodput is counted over this trailing window."""
    priority: PriorityConfig | None = None
    """mu / eps settings of the HBF/LBF switch (None: the core's defaults)."""
    seed: int = 0
    """Seed of the planners' w_k draws (the same states give the same w_k)."""
    adapt_durations: bool = True
    """Scale each module's profiled d_k by how much slower or faster its batches really
    run (an EWMA over batches, exchanged with the module states). Beyond the paper, which
    uses the offline profile alone; False keeps the paper's d_k."""

    def __post_init__(self) -> None:
        for key in ("window_s", "exchange_period_s", "metrics_window_s"):
            if not _positive_number(getattr(self, key)):
                raise PipelineConfigError(f"pard {key}: must be > 0, got {getattr(self, key)!r}")
        q = self.wait_quantile
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= q <= 1.0:
            raise PipelineConfigError(f"pard wait_quantile: must be in [0, 1], got {q!r}")
        if not _positive_int(self.wait_samples):
            raise PipelineConfigError(
                f"pard wait_samples: must be an int >= 1, got {self.wait_samples!r}"
            )


@dataclass(frozen=True)
class PipelineConfig(ModuleGraph):
    """One pipeline served by a PipelineExecutor."""

    name: str
    """Pipeline name (e.g. ``traffic``); results and metrics carry it."""
    slo_ms: float
    """End-to-end latency objective; the budget of a request whose payload gives none."""
    modules: tuple[ModuleConfig, ...]
    """The modules: exactly one source (no pres), pres and subs that agree, no cycle."""
    profile: Any
    """d_k(b): an object with ``duration_ms(module_id, batch)``, or a mapping
    ``{module_id: {batch: duration_ms}}`` (turned into a TableProfile)."""
    dropper: str = "pard"
    """Dropping policy: pard, its ablations or a baseline (taskserver.pard.DROPPER_NAMES)."""
    pard: PardKnobs = field(default_factory=PardKnobs)
    """PARD's knobs."""
    providers: str = "auto"
    """onnxruntime provider: auto (CUDA when available, else CPU), cpu or cuda."""
    intra_op_threads: int | None = None
    """Threads per session; None: usable CPUs / modules, at least 1 (CPU only)."""
    local: tuple[str, ...] = ()
    """Ids of the modules this process runs; () runs them all. The local modules form one
    stage: its entry modules (the source, or the modules the stage before hands requests
    to, all at once) reach every other local module."""
    peers: Mapping[str, str] = field(default_factory=dict)
    """Where the pipeline goes on after this stage: module id -> ``host:port`` of the task
    server that runs it (and what follows it). Each sub of a local module that is not local
    needs one."""
    workers: int | ScalingConfig = 1
    """Workers (sessions, each run from its own thread, in this process or in a child process
    of its own: `worker_mode`) per local module: a fixed count, or a ScalingConfig to follow
    each module's request rate at run time (``workers = "auto"``)."""
    worker_mode: str = "auto"
    """Where a worker's model runs: ``process`` (a child process each, with its own session
    and intra-op threads), ``thread`` (a session in this process, run from the worker's own
    thread), or ``auto``: process on the CPU provider with 4 or more usable CPUs, thread on
    CUDA (one GPU shared by several processes holds a context and arena per process) and on
    smaller hosts (sessions.resolve_worker_mode)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PipelineConfigError(f"pipeline name: must not be empty, got {self.name!r}")
        if not _positive_number(self.slo_ms):
            raise PipelineConfigError(f"pipeline slo_ms: must be > 0, got {self.slo_ms!r}")
        modules = tuple(self.modules)
        if not modules or not all(isinstance(m, ModuleConfig) for m in modules):
            raise PipelineConfigError(f"pipeline modules: need ModuleConfigs, got {modules!r}")
        object.__setattr__(self, "modules", modules)
        if self.providers not in PROVIDER_CHOICES:
            raise PipelineConfigError(
                f"pipeline providers: must be one of {PROVIDER_CHOICES}, got {self.providers!r}"
            )
        if self.intra_op_threads is not None and not _positive_int(self.intra_op_threads):
            raise PipelineConfigError(
                f"pipeline intra_op_threads: must be an int >= 1, got {self.intra_op_threads!r}"
            )
        if not (_positive_int(self.workers) or isinstance(self.workers, ScalingConfig)):
            raise PipelineConfigError(
                f'pipeline workers: need an int >= 1 or "auto" settings, got {self.workers!r}'
            )
        if self.worker_mode not in WORKER_MODES:
            raise PipelineConfigError(
                f"pipeline worker_mode: must be one of {WORKER_MODES}, got {self.worker_mode!r}"
            )
        if not isinstance(self.dropper, str) or not self.dropper.strip():
            raise PipelineConfigError(f"pipeline dropper: must be a name, got {self.dropper!r}")
        if isinstance(self.profile, Mapping):
            object.__setattr__(self, "profile", TableProfile(self.profile))
        elif not isinstance(self.profile, Profile):
            raise PipelineConfigError(
                f"pipeline profile: need duration_ms(module_id, batch) or a mapping, "
                f"got {type(self.profile).__name__}"
            )
        self._check_graph()
        self._check_profile()
        self._check_placement()

    def _check_graph(self) -> None:
        check_module_graph(self.modules)

    def _check_profile(self) -> None:
        for m in self.modules:
            for b in m.batch_sizes:
                try:
                    ms = self.profile.duration_ms(m.id, b)
                except Exception as exc:  # any profile's own error: name the cell
                    raise PipelineConfigError(
                        f"pipeline profile: module {m.label} batch {b}: {exc}"
                    ) from exc
                if not _positive_number(ms):
                    raise PipelineConfigError(
                        f"pipeline profile: module {m.label} batch {b}: got {ms!r} ms"
                    )

    def _check_placement(self) -> None:
        """One stage: a single entry, every remote sub has a peer, no way back into the stage."""
        ids = [m.id for m in self.modules]
        local = tuple(str(x) for x in self.local) if self.local else tuple(ids)
        unknown = [x for x in local if x not in ids]
        if unknown or len(set(local)) != len(local):
            raise PipelineConfigError(
                f"pipeline local: need distinct module ids of {ids}, got {list(self.local)}"
            )
        object.__setattr__(self, "local", local)
        peers = dict(self.peers)
        here = set(local)
        by_id = {m.id: m for m in self.modules}
        entries = [m for m in local if not (set(by_id[m].pres) & here)]
        if any(not by_id[m].pres for m in entries) and len(entries) > 1:
            raise PipelineConfigError(
                f"pipeline local: modules {list(local)} hold the source, so they must all "
                f"follow from it; {[m for m in entries if by_id[m].pres]} do not"
            )
        reached: set[str] = set()
        for e in entries:
            reached |= _reach(by_id, e, here)
        if reached != here:  # pragma: no cover - every local module is reached or an entry
            raise PipelineConfigError(f"pipeline local: {sorted(here - reached)} not reached")
        exits = {s for m in local for s in by_id[m].subs if s not in here}
        for sub in sorted(exits):
            if sub not in peers:
                raise PipelineConfigError(
                    f"pipeline peers: module {by_id[sub].label} runs elsewhere; give the "
                    f"host:port of its task server"
                )
            stray = [p for p in by_id[sub].pres if p not in here]
            if stray:
                raise PipelineConfigError(
                    f"pipeline local: module {by_id[sub].label} merges {list(by_id[sub].pres)}; "
                    f"its pres {stray} must run in this stage too"
                )
            back = _reach(by_id, sub, set(ids)) & here
            if back:
                raise PipelineConfigError(
                    f"pipeline local: module {by_id[sub].label} runs elsewhere but leads back "
                    f"to local modules {sorted(back)}"
                )
        by_peer: dict[str, list[str]] = {}
        for sub in sorted(exits):
            by_peer.setdefault(str(peers[sub]), []).append(sub)
        for address, subs in by_peer.items():
            pres = {tuple(sorted(by_id[x].pres)) for x in subs}
            if len(pres) > 1:
                raise PipelineConfigError(
                    f"pipeline peers: modules {subs} run at {address} and enter it together, "
                    f"so they need the same pres, got {sorted(pres)}"
                )
        reach_of = {
            a: set().union(*(_reach(by_id, x, set(ids)) for x in subs))
            for a, subs in by_peer.items()
        }
        for a, b in itertools.combinations(sorted(reach_of), 2):
            both = reach_of[a] & reach_of[b]
            if both:
                raise PipelineConfigError(
                    f"pipeline peers: modules {sorted(both)} follow both the stage at {a} and "
                    f"the one at {b}; the branches that merge there must enter one stage"
                )
        stray_peers = sorted(set(peers) - exits)
        if stray_peers:
            raise PipelineConfigError(
                f"pipeline peers: {stray_peers} are not subs of local modules that run "
                f"elsewhere (those are {sorted(exits)})"
            )
        for mid, address in peers.items():
            host, sep, port = str(address).rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise PipelineConfigError(
                    f"pipeline peers: module {mid!r}: need host:port, got {address!r}"
                )
        object.__setattr__(self, "peers", peers)

    @property
    def entries(self) -> tuple[str, ...]:
        """The modules requests enter this process at: the source, or a hand-off's modules."""
        here = set(self.local)
        return tuple(m.id for m in self.modules if m.id in here and not (set(m.pres) & here))

    def runs_here(self, module_id: str) -> bool:
        """Whether this process runs the module."""
        return module_id in self.local


def _reach(by_id: Mapping[str, ModuleConfig], start: str, within: set[str]) -> set[str]:
    """Modules of `within` reached from `start` along subs (start included if in `within`)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        if m in seen or m not in within:
            continue
        seen.add(m)
        todo.extend(by_id[m].subs)
    return seen
