"""Pipeline specs: a DAG of ONNX modules read from a JSON or TOML file (PARD §5.1).

A spec names the pipeline, its end-to-end latency SLO and its modules. Each module has a
``name``, an integer ``id``, a ``model`` file (relative to the spec file, or absolute),
the ids of its upstream modules (``pres``) and of its downstream modules (``subs``), and
optionally its feasible ``batch_sizes`` and ``input_shape`` (without the batch axis)::

    {"name": "dag", "slo_ms": 420, "modules": [
      {"name": "person_detection", "id": 1, "model": "../models/person_detection.onnx",
       "pres": [], "subs": [2, 3]},
      {"name": "pose_recognition", "id": 2, "model": "../models/pose_recognition.onnx",
       "pres": [1], "subs": [4]},
      ...]}

A request enters at the single source, is split where a module has several ``subs`` and
merged where one has several ``pres``; PARD estimates a request's end-to-end latency as the
maximum over the DAG's paths (`PipelineSpec.paths`).

`load_pipeline` validates the file: known keys and types, unique ids and names, ``pres``
and ``subs`` that agree (a in b.subs ⇔ b in a.pres), exactly one source, every module
reachable from it, no cycle, and model files that exist. This module needs no onnxruntime.

Errors::

    ValueError
     └── PipelineSpecError   names the file, the module and the field that is wrong
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from onnx_models.errors import PipelineSpecError

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "PIPELINES_DIR",
    "ModuleSpec",
    "PipelineSpec",
    "PipelineSpecError",
    "load_pipeline",
    "parse_pipeline",
    "pipeline_path",
    "shipped_pipelines",
]

PIPELINES_DIR = Path(__file__).resolve().parent / "pipelines"
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

_PIPELINE_KEYS = {"name", "slo_ms", "modules", "description"}
_MODULE_KEYS = {"name", "id", "model", "pres", "subs", "batch_sizes", "input_shape", "description"}


@dataclass(frozen=True)
class ModuleSpec:
    """One module of a pipeline: a model and its place in the DAG."""

    name: str
    """Module name, unique in its pipeline (e.g. ``face_recognition``)."""
    id: int
    """Module id, unique in its pipeline; ``pres``/``subs`` refer to it."""
    model: Path
    """The ``.onnx`` file, resolved to an absolute path."""
    pres: tuple[int, ...] = ()
    """Ids of the upstream modules whose outputs this one waits for (merged)."""
    subs: tuple[int, ...] = ()
    """Ids of the downstream modules this one forwards to (split)."""
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    """Feasible batch sizes, ascending."""
    input_shape: tuple[int, ...] | None = None
    """Input shape without the batch axis; None: read it from the model."""

    @property
    def label(self) -> str:
        """``name (id N)``, for messages."""
        return f"{self.name} (id {self.id})"


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline: modules forming a DAG with one source."""

    name: str
    """Pipeline name (e.g. ``traffic``)."""
    slo_ms: float
    """End-to-end latency objective of one request, in ms."""
    modules: tuple[ModuleSpec, ...]
    """Modules in file order."""
    path: Path | None = None
    """The spec file it was read from, if any."""
    _by_id: Mapping[int, ModuleSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {m.id: m for m in self.modules})

    def module(self, module_id: int) -> ModuleSpec:
        """The module with this id (KeyError if none)."""
        try:
            return self._by_id[module_id]
        except KeyError:
            raise KeyError(f"pipeline {self.name!r} has no module with id {module_id}") from None

    @property
    def source(self) -> ModuleSpec:
        """The module every request enters at."""
        return next(m for m in self.modules if not m.pres)

    @property
    def sinks(self) -> tuple[ModuleSpec, ...]:
        """Modules without downstream modules, in file order."""
        return tuple(m for m in self.modules if not m.subs)

    def topological_order(self) -> tuple[ModuleSpec, ...]:
        """Every module after all of its upstream modules (ties in file order)."""
        return _topological_order(self.modules)

    def paths(self, from_id: int | None = None) -> tuple[tuple[int, ...], ...]:
        """Every path of module ids from `from_id` (default: the source) to a sink.

        PARD takes the maximum of the latency estimates over these paths (§4.2, §5.1).
        """
        start = self.source.id if from_id is None else self.module(from_id).id
        out: list[tuple[int, ...]] = []
        stack: list[tuple[int, ...]] = [(start,)]
        while stack:
            path = stack.pop()
            subs = self._by_id[path[-1]].subs
            if not subs:
                out.append(path)
            stack.extend((*path, s) for s in reversed(subs))
        return tuple(out)

    def downstream(self, module_id: int) -> tuple[ModuleSpec, ...]:
        """Every module after `module_id` on some path, in topological order (not itself)."""
        seen: set[int] = set()
        todo = list(self.module(module_id).subs)
        while todo:
            mid = todo.pop()
            if mid not in seen:
                seen.add(mid)
                todo.extend(self._by_id[mid].subs)
        return tuple(m for m in self.topological_order() if m.id in seen)


def shipped_pipelines() -> tuple[str, ...]:
    """Names of the pipelines shipped with the package."""
    return tuple(
        sorted(p.stem for p in PIPELINES_DIR.glob("*.json") if not p.stem.endswith(".profile"))
    )


def pipeline_path(name_or_path: str | Path) -> Path:
    """A spec file path as given, or the shipped spec of that name (``traffic``)."""
    path = Path(name_or_path)
    if path.suffix in (".json", ".toml") or path.exists() or len(path.parts) > 1:
        return path
    return PIPELINES_DIR / f"{name_or_path}.json"


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read and validate a pipeline spec (``.json`` or ``.toml``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PipelineSpecError(f"{path}: cannot read the pipeline spec: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise PipelineSpecError(f"{path}: invalid {kind}: {exc}") from exc
    return parse_pipeline(data, base_dir=path.resolve().parent, path=path)


def parse_pipeline(data: Any, *, base_dir: Path, path: Path | None = None) -> PipelineSpec:
    """Validate a decoded spec; `base_dir` resolves relative model paths."""
    err = _Errors(str(path) if path is not None else "<pipeline>")
    if not isinstance(data, dict):
        raise err(f"the spec must be an object, got {type(data).__name__}")
    _no_unknown_keys(err, data, _PIPELINE_KEYS, "")
    name = _string(err, data, "name", "")
    slo_ms = data.get("slo_ms")
    if isinstance(slo_ms, bool) or not isinstance(slo_ms, int | float) or not 0 < slo_ms < math.inf:
        raise err(f"slo_ms: must be a positive number of milliseconds, got {slo_ms!r}")
    raw_modules = data.get("modules")
    if not isinstance(raw_modules, list) or not raw_modules:
        raise err(f"modules: must be a non-empty list, got {raw_modules!r}")
    modules = tuple(
        _parse_module(err, raw, f"modules[{i}]", base_dir) for i, raw in enumerate(raw_modules)
    )
    _check_graph(err, modules)
    return PipelineSpec(
        name=name,
        slo_ms=float(slo_ms),
        modules=modules,
        path=path.resolve() if path is not None else None,
    )


class _Errors:
    """Builds PipelineSpecErrors that start with the spec's file name."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, message: str) -> PipelineSpecError:
        return PipelineSpecError(f"{self.source}: {message}")


def _no_unknown_keys(err: _Errors, data: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        listed = ", ".join(sorted(known))
        raise err(f"{where}unknown field(s) {', '.join(unknown)}; known: {listed}")


def _string(err: _Errors, data: dict, key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise err(f"{where}{key}: must be a non-empty string, got {value!r}")
    return value


def _int_list(
    err: _Errors, data: dict, key: str, where: str, default: Any = (), *, unique: bool = True
) -> tuple[int, ...]:
    value = data.get(key, default)
    if not isinstance(value, list | tuple) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in value
    ):
        raise err(f"{where}{key}: must be a list of integers, got {value!r}")
    if unique and len(set(value)) != len(value):
        raise err(f"{where}{key}: has duplicates: {list(value)}")
    return tuple(value)


def _parse_module(err: _Errors, raw: Any, index: str, base_dir: Path) -> ModuleSpec:
    if not isinstance(raw, dict):
        raise err(f"{index}: a module must be an object, got {type(raw).__name__}")
    mid = raw.get("id")
    name = raw.get("name")
    # Name the module by whatever identifies it so far: id and name once known.
    where = f"{index}" + (f" ({name!r}, id {mid})" if "id" in raw else f" ({name!r})") + ": "
    _no_unknown_keys(err, raw, _MODULE_KEYS, where)
    name = _string(err, raw, "name", where)
    if isinstance(mid, bool) or not isinstance(mid, int):
        raise err(f"{where}id: must be an integer, got {mid!r}")
    model_text = _string(err, raw, "model", where)
    model = Path(model_text).expanduser()
    model = (model if model.is_absolute() else base_dir / model).resolve()
    if not model.is_file():
        raise err(f"{where}model: file {model} does not exist")
    pres = _int_list(err, raw, "pres", where)
    subs = _int_list(err, raw, "subs", where)
    batch_sizes = _int_list(err, raw, "batch_sizes", where, list(DEFAULT_BATCH_SIZES))
    ascending = all(a < b for a, b in pairwise(batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1 or not ascending:
        raise err(f"{where}batch_sizes: must be positive and ascending, got {list(batch_sizes)}")
    input_shape = None
    if "input_shape" in raw:
        input_shape = _int_list(err, raw, "input_shape", where, unique=False)
        if not input_shape or any(d < 1 for d in input_shape):
            raise err(f"{where}input_shape: must be positive sizes, got {list(input_shape)}")
    return ModuleSpec(
        name=name,
        id=mid,
        model=model,
        pres=pres,
        subs=subs,
        batch_sizes=batch_sizes,
        input_shape=input_shape,
    )


def _check_graph(err: _Errors, modules: tuple[ModuleSpec, ...]) -> None:
    by_id: dict[int, ModuleSpec] = {}
    names: dict[str, ModuleSpec] = {}
    for m in modules:
        if m.id in by_id:
            raise err(f"module {m.name!r}: id: {m.id} is already used by {by_id[m.id].label}")
        if m.name in names:
            raise err(f"module {m.label}: name: already used by {names[m.name].label}")
        by_id[m.id] = m
        names[m.name] = m
    for m in modules:
        for key, ids in (("pres", m.pres), ("subs", m.subs)):
            for other in ids:
                if other == m.id:
                    raise err(f"module {m.label}: {key}: lists the module itself")
                if other not in by_id:
                    raise err(f"module {m.label}: {key}: no module has id {other}")
        for sub in m.subs:
            if m.id not in by_id[sub].pres:
                raise err(
                    f"module {by_id[sub].label}: pres: must list {m.id}, "
                    f"since {m.label} lists {sub} in its subs"
                )
        for pre in m.pres:
            if m.id not in by_id[pre].subs:
                raise err(
                    f"module {by_id[pre].label}: subs: must list {m.id}, "
                    f"since {m.label} lists {pre} in its pres"
                )
    sources = [m for m in modules if not m.pres]
    if len(sources) != 1:
        found = ", ".join(m.label for m in sources) or "none"
        raise err(f"pres: exactly one module must have empty pres (the source); found {found}")
    reached = {sources[0].id}
    todo = [sources[0].id]
    while todo:
        for sub in by_id[todo.pop()].subs:
            if sub not in reached:
                reached.add(sub)
                todo.append(sub)
    for m in modules:
        if m.id not in reached:
            raise err(f"module {m.label}: pres: not reachable from the source {sources[0].label}")
    ordered = _topological_order(modules)
    if len(ordered) != len(modules):
        loop = _cycle([m for m in modules if m not in ordered], by_id)
        names = " -> ".join(by_id[i].name for i in loop)
        raise err(f"module {by_id[loop[0]].label}: subs: is on a cycle ({names})")


def _topological_order(modules: tuple[ModuleSpec, ...]) -> tuple[ModuleSpec, ...]:
    """Kahn's algorithm, stable in file order; modules on a cycle are left out."""
    waiting = {m.id: len(m.pres) for m in modules}
    by_id = {m.id: m for m in modules}
    order: list[ModuleSpec] = []
    ready = [m for m in modules if not m.pres]
    while ready:
        m = ready.pop(0)
        order.append(m)
        for sub in m.subs:
            waiting[sub] -= 1
            if waiting[sub] == 0:
                ready.append(by_id[sub])
    return tuple(order)


def _cycle(stuck: list[ModuleSpec], by_id: dict[int, ModuleSpec]) -> list[int]:
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
