"""The package boundaries of DESIGN.md, and no import cycles (tests/import_graph.py)."""

from __future__ import annotations

from tests.import_graph import cycles, imports, package_graph

ALLOWED = {
    "taskserver": set(),
    "admission": set(),
    "edge_agent": {"taskserver"},
    "onnx_models": {"taskserver"},
    "gateway": {"admission", "taskserver"},
    "loadtests": {"admission", "edge_agent", "gateway", "onnx_models", "taskserver"},
    "deploy": {"admission", "edge_agent", "gateway", "loadtests", "onnx_models", "taskserver"},
}


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(imports()) == []


def test_each_package_imports_only_what_it_may() -> None:
    graph = package_graph(imports())
    for package, deps in graph.items():
        assert deps <= ALLOWED[package], f"{package} imports {sorted(deps - ALLOWED[package])}"
    assert cycles(graph) == []


def test_the_policy_core_imports_no_shell() -> None:
    """The pure admission core reads no clock, socket or HTTP library of its own."""
    graph = imports()
    for mod in ("admission.gate", "admission.rules", "admission.controller"):
        assert not any(d.startswith(("gateway", "loadtests")) for d in graph[mod]), mod
