"""The OpenAPI document against the app's router and its handlers (no sockets).

Every route is an operation with an operationId and a tag; every 503 declares Retry-After;
and every status a handler can answer is documented for its operation. The statuses are
collected from the handlers' code: the ApiError classes they raise, the statuses they
set, QUERY_STATUS where they use it, a body read (413), followed through the gateway's
own functions they call by name, plus what the access check in front of every handler may
answer on the route (gateway.auth.ACCESS_STATUSES). The live drive
(tests/integration/test_api_answers.py) checks what the deeper paths (admission, targets,
the query path) answer.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from gateway.app import QUERY_STATUS, create_app
from gateway.auth import ACCESS_STATUSES, access_of
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.openapi import openapi_document
from gateway.service import GatewayService

DOC = openapi_document()


def _routes() -> dict[tuple[str, str], Callable[..., Any]]:
    """(method, path) -> handler, from the router of a built app."""
    app = create_app(GatewayService(GatewayConfig(storage_url="")))
    out = {}
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        out[(route.method.lower(), route.resource.canonical)] = route.handler  # type: ignore[union-attr]
    return out


ROUTES = _routes()


def _operation(method: str, path: str) -> dict[str, Any]:
    return DOC["paths"][path][method]


def test_every_route_is_an_operation_with_an_id_and_a_tag() -> None:
    documented = {(m, p) for p, ops in DOC["paths"].items() for m in ops}
    assert documented == set(ROUTES)
    ids = [op["operationId"] for ops in DOC["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    for (method, path), _ in ROUTES.items():
        op = _operation(method, path)
        assert isinstance(op.get("operationId"), str) and op["operationId"], (method, path)
        assert op.get("tags") and all(isinstance(t, str) for t in op["tags"]), (method, path)


def test_every_503_and_429_declares_retry_after() -> None:
    header = DOC["components"]["headers"]["RetryAfter"]
    assert header["schema"] == {"type": "integer", "minimum": 1}
    seen = 0
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            for status in ("429", "503"):
                if status in op["responses"]:
                    seen += 1
                    headers = op["responses"][status].get("headers", {})
                    assert headers.get("Retry-After") == {
                        "$ref": "#/components/headers/RetryAfter"
                    }, (method, path, status)
    assert seen >= 3  # queries, requests, readiness


def test_every_error_response_has_a_json_error_body() -> None:
    schemas = DOC["components"]["schemas"]
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if int(status) < 400 or path == "/readyz":
                    continue
                schema = response["content"]["application/json"]["schema"]
                refs = [s["$ref"] for s in schema.get("anyOf", [schema])]
                for ref in refs:
                    body = schemas[ref.rsplit("/", 1)[1]]
                    assert "error" in body["properties"], (method, path, status, ref)


def test_operations_that_take_a_json_body_document_413_and_415() -> None:
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            if "requestBody" in op:
                assert {"400", "413", "415"} <= set(op["responses"]), (method, path)


# -- the statuses in the handlers' code ---------------------------------------------------


def statuses_of(func: Callable[..., Any], seen: set[Any] | None = None) -> set[int]:
    """The statuses a function can answer with, from its code and the gateway functions it
    calls by name."""
    seen = set() if seen is None else seen
    func = inspect.unwrap(func)
    if func in seen:
        return set()
    seen.add(func)
    scope = dict(func.__globals__)
    if func.__closure__:  # a nested handler (gateway.dashboard.routes)
        scope.update(
            {
                name: cell.cell_contents
                for name, cell in zip(func.__code__.co_freevars, func.__closure__, strict=True)
            }
        )
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "QUERY_STATUS":
            out |= set(QUERY_STATUS.values())
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            target = node.exc.func
            cls = scope.get(target.id) if isinstance(target, ast.Name) else None
            if isinstance(cls, type) and issubclass(cls, ApiError):
                out.add(cls.status)
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("json_response", "Response"):
            status = next((k.value for k in node.keywords if k.arg == "status"), None)
            if status is None:
                out.add(200)
            else:
                out |= {
                    c.value
                    for c in ast.walk(status)
                    if isinstance(c, ast.Constant) and type(c.value) is int
                }
        if name == "read" and isinstance(f, ast.Attribute):
            out.add(413)  # aiohttp refuses a body over client_max_size as it reads it
        if isinstance(f, ast.Name):
            callee = scope.get(f.id)
            if inspect.isfunction(callee) and callee.__module__.startswith("gateway."):
                out |= statuses_of(callee, seen)
    return out


def answers(method: str, path: str) -> set[int]:
    """What a route can answer: its handler's statuses and its access check's."""
    return statuses_of(ROUTES[(method, path)]) | ACCESS_STATUSES[access_of(method, path)]


@pytest.mark.parametrize(("method", "path"), sorted(ROUTES))
def test_every_status_a_handler_answers_is_documented(method: str, path: str) -> None:
    statuses = answers(method, path)
    assert statuses, f"no status found in the handler of {method} {path}"
    documented = {int(s) for s in _operation(method, path)["responses"]}
    missing = statuses - documented
    assert not missing, f"{method.upper()} {path} can answer {sorted(missing)}, undocumented"


def test_the_collector_sees_what_the_query_handlers_answer() -> None:
    # The query handler reads a body (413, 415, 400), sets QUERY_STATUS (200, 400, 502,
    # 503, 504): a collector that missed any of these would let the test above pass idly.
    got = statuses_of(ROUTES[("post", "/v1/queries")])
    assert {200, 400, 413, 415, 502, 503, 504} <= got
    assert {200, 201, 400, 401, 403, 413, 415, 429} <= answers("post", "/v1/servers")
    assert {200, 400, 401, 403, 404, 429} <= answers("delete", "/v1/servers/{id}")
    assert answers("get", "/readyz") == {200, 503}
    # A query naming another tenant than its API key's is refused by the handler (403).
    assert 403 in statuses_of(ROUTES[("post", "/v1/queries")])
