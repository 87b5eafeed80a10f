"""The shape of the code: import cycles, package edges, largest files and functions.

Run ``python -m tests.import_graph`` from the repository root for a report; the
architecture tests (`tests/unit/test_architecture.py`) assert on the same graph.

Imports are read with `ast`, not by importing: every ``import x`` / ``from x import y``
anywhere in a module counts, also inside functions and under TYPE_CHECKING (a deferred or
type-only import is still a dependency; it only hides a cycle from the interpreter). Only
a module's ``if __name__ == "__main__":`` block is left out: it runs when the module is
executed as a script, never when another module imports it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "gateway",
    "taskserver",
    "admission",
    "edge_agent",
    "onnx_models",
    "deploy",
    "loadtests",
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of our packages: dotted name -> file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` (a dotted import target) is or lies in."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from p import m`` counts p.m when a module)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        tree.body = [n for n in tree.body if not _is_main_guard(n)]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                hit = _resolve(t, known)
                if hit is not None and hit != mod:
                    deps.add(hit)
        graph[mod] = deps
    return graph


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at module level."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    t = node.test
    return (
        isinstance(t.left, ast.Name)
        and t.left.id == "__name__"
        and len(t.comparators) == 1
        and isinstance(t.comparators[0], ast.Constant)
        and t.comparators[0].value == "__main__"
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package -> the other top-level packages it imports."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        top = mod.split(".")[0]
        out.setdefault(top, set()).update(d.split(".")[0] for d in deps if d.split(".")[0] != top)
    return out


def largest_files(n: int = 10, root: Path = ROOT) -> list[tuple[int, str]]:
    """The n longest modules, by lines."""
    sizes = [
        (len(p.read_text().splitlines()), str(p.relative_to(root))) for p in modules(root).values()
    ]
    return sorted(sizes, reverse=True)[:n]


def largest_functions(n: int = 10, root: Path = ROOT) -> list[tuple[int, str]]:
    """The n longest functions and methods, by lines (nested functions count in their parent)."""
    found: list[tuple[int, str]] = []
    for mod, path in modules(root).items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _defs(tree.body, mod):
            found.append(node)
    return sorted(found, reverse=True)[:n]


def _defs(body: Iterable[ast.stmt], prefix: str) -> Iterable[tuple[int, str]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            yield node.end_lineno - node.lineno + 1, f"{prefix}.{node.name}"
        elif isinstance(node, ast.ClassDef):
            yield from _defs(node.body, f"{prefix}.{node.name}")


def main() -> None:
    graph = imports()
    print(f"{len(graph)} modules, {sum(len(d) for d in graph.values())} import edges")
    found = cycles(graph)
    print(f"\nmodule import cycles: {len(found)}")
    for comp in found:
        print(f"  ({len(comp)}) " + ", ".join(comp))
    pkgs = package_graph(graph)
    print("\npackage edges:")
    for top in sorted(pkgs):
        print(f"  {top} -> {', '.join(sorted(pkgs[top])) or '-'}")
    print(f"package cycles: {cycles(pkgs)}")
    print("\nlargest files (lines):")
    for lines, name in largest_files():
        print(f"  {lines:5d}  {name}")
    print("\nlargest functions (lines):")
    for lines, name in largest_functions():
        print(f"  {lines:5d}  {name}")


if __name__ == "__main__":
    main()
