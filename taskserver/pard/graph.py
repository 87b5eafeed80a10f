"""The module graph of one pipeline: chains and DAGs as their source-to-sink paths.

Module ids are strings here; integer ids (a spec's ``id``) become their decimal strings.

PARD §5.1 describes a pipeline as modules with ``pres``/``subs``; for a DAG the end-to-end
estimate is the maximum over the paths that leave a module (§4.2). Everything the policies need
is the set of full paths, so that is the one representation kept here.

Splits that send a request down only some of their branches (``branches``, the pipeline
runtime's routing) need nothing more here: the branches are drawn when the split module hands
the request on, so at the split its path is not known yet and the estimate stays the maximum
over every path that leaves it (§4.2), and after the split every path that leaves a branch
module is one the request takes, up to the next split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from taskserver.pard.errors import UnknownModule

__all__ = ["PipelineGraph", "SupportsPaths"]


class SupportsPaths(Protocol):
    """A pipeline spec that lists its source-to-sink paths of module ids."""

    def paths(self) -> Iterable[Sequence[object]]: ...


class PipelineGraph:
    """Source-to-sink paths of a pipeline, with the downstream suffixes of each module."""

    __slots__ = ("_downstream", "_through", "modules", "paths")

    def __init__(self, paths: Iterable[Sequence[object]]) -> None:
        full = tuple(tuple(str(m) for m in path) for path in paths)
        if not full:
            raise ValueError("pipeline paths: need at least one path, got none")
        for path in full:
            if not path:
                raise ValueError(f"pipeline paths: a path is empty in {full!r}")
            if len(set(path)) != len(path):
                raise ValueError(f"pipeline paths: module repeated (a cycle) in {path!r}")
        self.paths: tuple[tuple[str, ...], ...] = tuple(dict.fromkeys(full))
        self.modules: tuple[str, ...] = tuple(dict.fromkeys(m for p in self.paths for m in p))
        downstream: dict[str, dict[tuple[str, ...], None]] = {m: {} for m in self.modules}
        through: dict[str, list[tuple[str, ...]]] = {m: [] for m in self.modules}
        for path in self.paths:
            for i, module in enumerate(path):
                downstream[module][path[i + 1 :]] = None
                through[module].append(path)
        self._downstream = {m: tuple(s) for m, s in downstream.items()}
        self._through = {m: tuple(p) for m, p in through.items()}

    @classmethod
    def chain(cls, *module_ids: str) -> PipelineGraph:
        """A linear pipeline M_1 -> ... -> M_N."""
        return cls([module_ids])

    @classmethod
    def from_spec(cls, spec: SupportsPaths) -> PipelineGraph:
        """From a pipeline spec's ``paths()``; ids become strings (``1`` -> ``"1"``)."""
        return cls(spec.paths())

    @classmethod
    def from_subs(cls, subs: Mapping[str, Sequence[str]]) -> PipelineGraph:
        """Build from ``{module: subsequent modules}`` (``subs``, §5.1); sinks may be absent."""
        nodes = dict.fromkeys([*subs, *(s for succ in subs.values() for s in succ)])
        has_pre = {s for succ in subs.values() for s in succ}
        sources = [m for m in nodes if m not in has_pre]
        if not sources:
            raise ValueError(f"pipeline subs: no source module (a cycle?) in {dict(subs)!r}")
        paths: list[tuple[str, ...]] = []
        stack: list[tuple[str, ...]] = [(m,) for m in reversed(sources)]
        while stack:
            path = stack.pop()
            succ = subs.get(path[-1], ())
            if not succ:
                paths.append(path)
                continue
            for nxt in reversed(succ):
                if nxt in path:
                    raise ValueError(f"pipeline subs: cycle through {nxt!r} in {dict(subs)!r}")
                stack.append((*path, nxt))
        return cls(paths)

    def downstream_paths(self, module_id: str) -> tuple[tuple[str, ...], ...]:
        """The distinct module sequences after `module_id` (``((),)`` for a sink)."""
        try:
            return self._downstream[module_id]
        except KeyError:
            raise UnknownModule(f"module {module_id!r} not in pipeline {self.modules!r}") from None

    def paths_through(self, module_id: str) -> tuple[tuple[str, ...], ...]:
        """The full source-to-sink paths that pass through `module_id`."""
        try:
            return self._through[module_id]
        except KeyError:
            raise UnknownModule(f"module {module_id!r} not in pipeline {self.modules!r}") from None

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._downstream

    def __repr__(self) -> str:
        return f"PipelineGraph({list(self.paths)!r})"
