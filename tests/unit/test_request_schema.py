"""The request bodies' OpenAPI schemas and their validation come from one definition.

For single-field changes to a valid body (types, bounds, lengths, patterns, unknown keys),
the schema published at GET /openapi.json and the gateway's own validation must agree on
accept or reject, and a rejection names the field.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from gateway.config import GatewayConfig
from gateway.errors import BadRequest
from gateway.openapi import openapi_document
from gateway.requests import QUERY_BODY, REGISTER_BODY, parse_query, parse_register

CONFIG = GatewayConfig(storage_url="")
DOC = openapi_document()


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(schema)


QUERY_OK = {
    "slo": {"percentile": 99, "latency_ms": 200},
    "priority": 3,
    "targets": {"pool": "default", "fanout": 2},
    "task": {"x": 1},
}
REGISTER_OK = {"id": "ts-1", "address": "127.0.0.1:9101", "slots": 4, "cluster": "lab"}

QUERY_CASES: list[tuple[str, Any]] = [
    ("priority", -1000), ("priority", 1000), ("priority", -1001), ("priority", 1001),
    ("priority", 1.5), ("priority", True), ("priority", "1"),
    ("slo.percentile", 0), ("slo.percentile", 100), ("slo.percentile", 0.001),
    ("slo.percentile", 99.999), ("slo.percentile", "99"),
    ("slo.latency_ms", 0), ("slo.latency_ms", -1), ("slo.latency_ms", 0.001),
    ("slo.latency_ms", None), ("slo.extra", 1),
    ("targets.fanout", 0), ("targets.fanout", 1), ("targets.fanout", "2"),
    ("targets.pool", 7), ("targets.cluster", "bad name"), ("targets.cluster", "lab-1"),
    ("targets.exclude_cluster", "x" * 65), ("targets.surprise", 1),
    ("unknown", 1),
]  # fmt: skip
QUERY_BY_CLASS = {"class": "B", "targets": {"pool": "default", "all": True}}
REGISTER_CASES: list[tuple[str, Any]] = [
    ("slots", 0), ("slots", 1), ("slots", 100_000), ("slots", 100_001), ("slots", "4"),
    ("id", ""), ("id", "a" * 200), ("id", "a" * 201), ("id", 5),
    ("cluster", "bad name"), ("cluster", "ok_1.x"), ("cluster", ""),
    ("address", 9101), ("unknown", 1),
]  # fmt: skip


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return out


def _check(
    name: str, parse: Any, valid: dict[str, Any], path: str, value: Any
) -> tuple[bool, bool, str | None]:
    body = _with(valid, path, value)
    schema_ok = _validator(name).is_valid(body)
    try:
        parse(body, CONFIG)
    except BadRequest as exc:
        return schema_ok, False, exc.field
    return schema_ok, True, None


@pytest.mark.parametrize(("path", "value"), QUERY_CASES)
def test_query_schema_and_validation_agree(path: str, value: Any) -> None:
    schema_ok, parse_ok, field = _check("Query", parse_query, QUERY_OK, path, value)
    assert schema_ok == parse_ok, f"{path}={value!r}: schema {schema_ok}, validation {parse_ok}"
    if not parse_ok:
        assert field == path, field


@pytest.mark.parametrize(("path", "value"), [("class", 5), ("class", "B"), ("targets.all", "yes")])
def test_query_by_class_schema_and_validation_agree(path: str, value: Any) -> None:
    schema_ok, parse_ok, field = _check("Query", parse_query, QUERY_BY_CLASS, path, value)
    assert schema_ok == parse_ok, f"{path}={value!r}: schema {schema_ok}, validation {parse_ok}"
    if not parse_ok:
        assert field == path


@pytest.mark.parametrize(("path", "value"), REGISTER_CASES)
def test_register_schema_and_validation_agree(path: str, value: Any) -> None:
    schema_ok, parse_ok, field = _check("Register", parse_register, REGISTER_OK, path, value)
    assert schema_ok == parse_ok, f"{path}={value!r}: schema {schema_ok}, validation {parse_ok}"
    if not parse_ok:
        assert field == path


def test_the_valid_bodies_are_valid_and_the_document_uses_the_definitions() -> None:
    assert _validator("Query").is_valid(QUERY_OK)
    assert _validator("Register").is_valid(REGISTER_OK)
    parse_query(QUERY_OK, CONFIG)
    parse_register(REGISTER_OK, CONFIG)
    schemas = DOC["components"]["schemas"]
    assert schemas["Query"] == QUERY_BODY.schema()
    assert schemas["Register"] == REGISTER_BODY.schema()
    jsonschema.Draft202012Validator.check_schema(schemas["Query"])


def test_a_cost_hint_reaches_the_request_and_a_bad_one_names_the_field() -> None:
    config = GatewayConfig()
    body = {
        "slo": {"latency_ms": 10, "percentile": 99},
        "targets": {"pool": "default", "fanout": 1},
    }
    assert parse_query(body, config).cost_hint_ms is None
    assert parse_query({**body, "cost_hint": 3.5}, config).cost_hint_ms == 3.5
    for bad in (0, -1.0, "big", True):
        with pytest.raises(BadRequest) as err:
            parse_query({**body, "cost_hint": bad}, config)
        assert err.value.field == "cost_hint"
