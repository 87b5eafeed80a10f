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

A split module may make some of its subs branches that only a share of the requests take:
``"branches": {"3": 0.6}`` sends 60% of the requests on to module 3; subs it does not name
are taken by every request, and it must leave at least one out. A merge then waits only for
the branches a request took (taskserver/pipeline/routing.py says which requests take a
branch, and how this stands in for routing by a frame's content).

`load_pipeline` validates the file: known keys and types, unique ids and names, ``pres``
and ``subs`` that agree (a in b.subs ⇔ b in a.pres), exactly one source, every module
reachable from it, no cycle, ``branches`` that name subs of a split with shares in (0, 1),
and model files that exist. This module needs no onnxruntime.

Errors::

    ValueError
     └── PipelineSpecError   names the file, the module and the field that is wrong
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from onnx_models.errors import PipelineSpecError
from taskserver.pipeline.config import (
    DEFAULT_BATCH_SIZES,
    ModuleConfig,
    ModuleGraph,
    check_module_graph,
)
from taskserver.pipeline.errors import PipelineConfigError

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "PIPELINES_DIR",
    "ModuleConfig",
    "PipelineSpec",
    "PipelineSpecError",
    "load_pipeline",
    "parse_pipeline",
    "pipeline_path",
    "shipped_pipelines",
]

PIPELINES_DIR = Path(__file__).resolve().parent / "pipelines"

_PIPELINE_KEYS = {"name", "slo_ms", "modules", "description"}
_MODULE_KEYS = {
    "name",
    "id",
    "model",
    "pres",
    "subs",
    "branches",
    "batch_sizes",
    "input_shape",
    "description",
}


@dataclass(frozen=True)
class PipelineSpec(ModuleGraph):
    """A validated pipeline: modules forming a DAG with one source.

    Its modules are `ModuleConfig`s, the one module schema the task server runs
    (ids are the spec's integers as decimal strings); the graph queries (`source`, `sinks`,
    `topological_order`, `paths`, `downstream`, `module`) come from `ModuleGraph`.
    """

    name: str
    """Pipeline name (e.g. ``traffic``)."""
    slo_ms: float
    """End-to-end latency objective of one request, in ms."""
    modules: tuple[ModuleConfig, ...]
    """Modules in file order."""
    path: Path | None = None
    """The spec file it was read from, if any."""


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


def _parse_module(err: _Errors, raw: Any, index: str, base_dir: Path) -> ModuleConfig:
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
    branches = _branches(err, raw, where)
    input_shape = None
    if "input_shape" in raw:
        input_shape = _int_list(err, raw, "input_shape", where, unique=False)
        if not input_shape or any(d < 1 for d in input_shape):
            raise err(f"{where}input_shape: must be positive sizes, got {list(input_shape)}")
    try:
        return ModuleConfig(
            id=str(mid),
            name=name,
            model=model,
            pres=tuple(str(p) for p in pres),
            subs=tuple(str(x) for x in subs),
            batch_sizes=batch_sizes,
            input_shape=input_shape,
            branches=branches,
        )
    except PipelineConfigError as exc:
        raise err(f"{where}{exc}") from exc


def _branches(err: _Errors, raw: dict, where: str) -> dict[str, Any]:
    """``branches``: an object of sub id -> share; the shares and subs are ModuleConfig's to
    check (taskserver.pipeline.routing.check_branches)."""
    value = raw.get("branches", {})
    if not isinstance(value, dict):
        raise err(f"{where}branches: must be an object of sub id -> share, got {value!r}")
    out: dict[str, Any] = {}
    for key, share in value.items():
        sub = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            sub = int(key)
        if sub is None:
            raise err(f"{where}branches: key {key!r} must be the id of one of its subs")
        if str(sub) in out:
            raise err(f"{where}branches: sub {sub} is named twice")
        out[str(sub)] = share
    return out


def _check_graph(err: _Errors, modules: tuple[ModuleConfig, ...]) -> None:
    try:
        check_module_graph(modules)
    except PipelineConfigError as exc:
        raise err(str(exc)) from exc
