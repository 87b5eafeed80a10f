"""Property tests of the parsers that take input from outside: request bodies, targets and
configuration, driven by Hypothesis (a fixed derandomized search, no example database).

What must hold for every input, well-formed or not:

- a parser answers with its own error (``BadRequest`` naming a field, ``ConfigError`` naming
  a key, ``AgentConfigError`` naming an option) or a value, never another exception;
- a body the gateway accepts is one its OpenAPI document allows, so a client generated from
  the document is never refused what the gateway would take, and a body the document
  forbids is never carried out;
- a body built within the document and this configuration is accepted, with the values sent.
"""

from __future__ import annotations

import math
from typing import Any

import jsonschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deploy.config import parse_config
from edge_agent.config import AgentConfigError, load_agent_config
from gateway.config import GatewayConfig
from gateway.errors import BadRequest
from gateway.openapi import openapi_document
from gateway.requests import (
    MultiQueryRequest,
    QueryRequest,
    RegisterRequest,
    parse_multi_query,
    parse_query,
    parse_register,
)
from taskserver.tomlconfig import ConfigError

CONFIG = GatewayConfig(storage_url="")
DOC = openapi_document()
CLASSES = [c.name for c in CONFIG.classes]
POOL = CONFIG.pools[0].name

SETTINGS = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(schema)


QUERY_SCHEMA = _validator("Query")
REGISTER_SCHEMA = _validator("Register")
REQUEST_SCHEMA = _validator("MultiQueryRequest")

# -- strategies --------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.sampled_from(["", "A", "default", "lab", "x y", "é", "a" * 65, "ts-1"]) | st.text(
    max_size=10
)
numbers = (
    st.integers(min_value=-5, max_value=2000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, 100, 99.9, 1e-300, 1e300, True, "5"])
)


def _maybe(draw: st.DrawFn, key: str, values: st.SearchStrategy[Any], out: dict[str, Any]) -> None:
    if draw(st.booleans()):
        out[key] = draw(values)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


payloads = json_values.filter(_finite)


@st.composite
def valid_targets(draw: st.DrawFn) -> dict[str, Any]:
    how = draw(st.sampled_from(["fanout", "all", "per_cluster", "servers", "cluster"]))
    if how == "servers":
        ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
        return {"servers": ids}
    t: dict[str, Any] = {"pool": POOL}
    if how == "all":
        t["all"] = True
    elif how == "cluster":
        t["fanout"] = draw(st.integers(1, CONFIG.max_fanout))
        t[draw(st.sampled_from(["cluster", "exclude_cluster"]))] = draw(
            st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)
        )
    else:
        t[how] = draw(st.integers(1, CONFIG.max_fanout))
    return t


@st.composite
def valid_queries(draw: st.DrawFn) -> dict[str, Any]:
    """A query within the document and this gateway's configuration."""
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["class"] = draw(st.sampled_from(CLASSES))
    else:
        out["slo"] = {
            "percentile": draw(st.floats(0.01, 99.99)),
            "latency_ms": draw(st.floats(0.01, 1e6)),
        }
    out["targets"] = draw(valid_targets())
    _maybe(draw, "priority", st.integers(-1000, 1000), out)
    _maybe(draw, "task", payloads, out)
    _maybe(draw, "cost_hint", st.floats(0.01, 1e6), out)
    _maybe(draw, "tenant", st.sampled_from(["default", "t-1", "team.a"]), out)
    return out


@st.composite
def valid_registrations(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": draw(st.text(min_size=1, max_size=20)),
        "address": draw(st.sampled_from(["127.0.0.1:9101", "ts-1:1", "[::1]:65535"])),
    }
    _maybe(draw, "pool", st.just(POOL), out)
    _maybe(draw, "slots", st.integers(1, 100_000), out)
    _maybe(draw, "cluster", st.sampled_from(["lab", "wet-lab", "a.b_c"]), out)
    return out


@st.composite
def valid_requests(draw: st.DrawFn) -> dict[str, Any]:
    out = draw(valid_queries())
    stages = []
    for _ in range(draw(st.integers(1, 3))):
        stage = {"targets": draw(valid_targets())}
        _maybe(draw, "task", payloads, stage)
        stages.append(stage)
    return {
        **{k: v for k, v in out.items() if k in ("class", "slo", "tenant")},
        "stages": stages,
        **draw(st.fixed_dictionaries({}, optional={"stage_rule": st.sampled_from(["equal"])})),
    }


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A valid body with up to three changes: a value replaced (by anything JSON, null
    included), a key dropped, or a key added, anywhere in the body."""
    body = draw(valid)
    if draw(st.integers(0, 29)) == 0:
        return draw(json_values)
    for _ in range(draw(st.integers(0, 3))):
        node: Any = body
        # Walk down a few levels into objects and arrays.
        while isinstance(node, dict | list) and node and draw(st.integers(0, 2)) == 0:
            child = _pick(draw, node)
            if not isinstance(child[1], dict | list):
                break
            node = child[1]
        if isinstance(node, dict):
            what = draw(st.sampled_from(["replace", "drop", "add"]))
            if what == "add" or not node:
                node[draw(st.sampled_from(["class", "slo", "pool", "all", "x", "servers"]))] = draw(
                    json_values
                )
            elif what == "drop":
                del node[_pick(draw, node)[0]]
            else:
                node[_pick(draw, node)[0]] = draw(json_values | numbers | names)
        elif isinstance(node, list) and node:
            node[_pick(draw, node)[0]] = draw(json_values)
    return body


def _pick(draw: st.DrawFn, node: dict[str, Any] | list[Any]) -> tuple[Any, Any]:
    keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
    key = draw(st.sampled_from(keys))
    return key, node[key]


# -- request bodies ------------------------------------------------------------------------


def _outcome(parse: Any, body: Any) -> tuple[bool, BadRequest | None]:
    try:
        parse(body, CONFIG)
    except BadRequest as exc:
        assert isinstance(exc.field, str), exc
        return False, exc
    return True, None


@SETTINGS
@given(mutated(valid_queries()))
@example({"class": "A", "slo": {"percentile": 99, "latency_ms": 5}, "targets": {"servers": ["x"]}})
@example({"class": None, "slo": {"percentile": 99, "latency_ms": 5}, "targets": {"all": True}})
@example({"class": "A", "targets": {"pool": POOL, "all": True, "fanout": None}})
def test_a_query_body_is_accepted_only_if_the_document_allows_it(body: Any) -> None:
    accepted, _ = _outcome(parse_query, body)
    allowed = QUERY_SCHEMA.is_valid(body)
    assert allowed or not accepted, f"accepted a body the document forbids: {body!r}"


@SETTINGS
@given(valid_queries())
def test_a_query_within_the_document_and_the_config_is_accepted_as_sent(body: Any) -> None:
    assert QUERY_SCHEMA.is_valid(body), body
    q = parse_query(body, CONFIG)
    assert isinstance(q, QueryRequest)
    if "slo" in body:
        assert (q.percentile, q.slo_ms) == (body["slo"]["percentile"], body["slo"]["latency_ms"])
    t = body["targets"]
    if "servers" in t:
        assert q.targets.servers == tuple(t["servers"])
    else:
        assert (q.targets.pool, q.targets.all) == (POOL, t.get("all", False))
        assert q.targets.fanout == t.get("fanout")
        assert q.targets.per_cluster == t.get("per_cluster")


@SETTINGS
@given(mutated(valid_registrations()))
@example({"id": "ts-1", "address": "127.0.0.1:9101", "cluster": None})
def test_a_registration_is_accepted_only_if_the_document_allows_it(body: Any) -> None:
    accepted, _ = _outcome(parse_register, body)
    assert REGISTER_SCHEMA.is_valid(body) or not accepted, body
    if accepted:
        r = parse_register(body, CONFIG)
        assert isinstance(r, RegisterRequest) and r.address == body["address"]


@SETTINGS
@given(mutated(valid_requests()))
def test_a_multi_query_request_is_accepted_only_if_the_document_allows_it(body: Any) -> None:
    accepted, _ = _outcome(parse_multi_query, body)
    assert REQUEST_SCHEMA.is_valid(body) or not accepted, body
    if accepted:
        assert isinstance(parse_multi_query(body, CONFIG), MultiQueryRequest)


def test_the_document_says_a_query_takes_a_class_or_an_slo_not_both() -> None:
    """Found by schemathesis: the gateway refused {class, slo} that the document allowed."""
    both = {"class": "A", "slo": {"percentile": 99, "latency_ms": 5}, "targets": {"all": True}}
    assert not QUERY_SCHEMA.is_valid(both)
    assert not REQUEST_SCHEMA.is_valid({**both, "stages": [{"targets": {"all": True}}]})
    for one in ({"class": "A"}, {"slo": both["slo"]}, {}):
        assert QUERY_SCHEMA.is_valid({**one, "targets": {"pool": POOL, "all": True}})
    assert "default_class" in DOC["components"]["schemas"]["Query"]["description"]


def test_a_typed_field_given_as_null_is_refused_naming_it() -> None:
    """Found by the property tests above: null was taken as "absent" for some fields (a
    query's class, slo and target fields, a registration's cluster), where the document
    gives only a type, so a body the document forbids was carried out."""
    slo = {"percentile": 99, "latency_ms": 5}
    cases = [
        (parse_query, {"class": None, "slo": slo, "targets": {"all": True}}, "class"),
        (parse_query, {"class": "A", "slo": None, "targets": {"all": True}}, "slo"),
        (parse_query, {"class": "A", "targets": {"pool": POOL, "all": True, "fanout": None}},
         "targets.fanout"),
        (parse_query, {"class": "A", "targets": {"pool": POOL, "fanout": 1, "cluster": None}},
         "targets.cluster"),
        (parse_register, {"id": "ts-1", "address": "h:1", "cluster": None}, "cluster"),
        (parse_multi_query, {"slo": slo, "class": None, "stages": [{"targets": {"all": True}}]},
         "class"),
    ]  # fmt: skip
    for parse, body, field in cases:
        accepted, error = _outcome(parse, body)
        assert not accepted and error is not None, body
        assert (error.field, error.message) == (
            field,
            "must not be null (leave it out for its default)",
        )
    # A task takes any JSON value, null included.
    q = parse_query({"class": "A", "targets": {"pool": POOL, "all": True}, "task": None}, CONFIG)
    assert q.payload == b"null"


def test_an_integer_field_takes_a_number_without_a_fraction_as_json_schema_does() -> None:
    """Found by schemathesis: it sends an integer as -300.0 at times, which JSON Schema
    counts as an integer and the document allows; the gateway answered 400."""
    body = {"class": "A", "priority": -300.0, "targets": {"pool": POOL, "fanout": 2.0}}
    assert QUERY_SCHEMA.is_valid(body)
    q = parse_query(body, CONFIG)
    assert (q.priority, q.targets.fanout) == (-300, 2)
    assert type(q.priority) is int and type(q.targets.fanout) is int
    per = parse_query({"class": "A", "targets": {"pool": POOL, "per_cluster": 3.0}}, CONFIG)
    assert per.targets.per_cluster == 3 and type(per.targets.per_cluster) is int
    reg = parse_register({"id": "ts-1", "address": "h:1", "slots": 4.0}, CONFIG)
    assert reg.slots == 4 and type(reg.slots) is int
    for bad in (1.5, math.nan, math.inf, True):
        accepted, error = _outcome(parse_query, {**body, "priority": bad})
        assert not accepted and error is not None and error.field == "priority", bad
        assert not QUERY_SCHEMA.is_valid({**body, "priority": bad}), bad


# -- configuration -------------------------------------------------------------------------

_GATEWAY_KEYS = [
    "port", "host", "grace_ms", "max_fanout", "max_body_bytes", "max_frame_bytes", "token",
    "default_class", "heartbeat_timeout_s", "storage_url", "surprise",
]  # fmt: skip
_TASKSERVER_KEYS = [
    "server_id", "port", "slots", "policy", "max_queue", "max_frame_bytes", "task_grace_s",
    "max_task_s", "emulation", "token", "service", "surprise",
]  # fmt: skip
toml_scalars = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["fifo", "tf-edfq", "", "0.0.0.0", "sleep", "A"])
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def toml_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["gateway"] = draw(
            st.dictionaries(st.sampled_from(_GATEWAY_KEYS), toml_values, max_size=3)
        )
    if draw(st.booleans()):
        doc["taskserver"] = draw(
            st.dictionaries(st.sampled_from(_TASKSERVER_KEYS), toml_values, max_size=3)
        )
    if draw(st.booleans()):
        cls = st.fixed_dictionaries(
            {"name": st.sampled_from(["A", "", "b c"]) | toml_scalars},
            optional={"percentile": toml_scalars, "latency_ms": toml_scalars},
        )
        doc["classes"] = draw(st.lists(cls | toml_values, max_size=3) | toml_scalars)
    if draw(st.booleans()):
        pool = st.fixed_dictionaries(
            {"name": st.sampled_from(["default", ""]) | toml_scalars},
            optional={
                "kind": toml_scalars,
                "queueing": st.sampled_from(["server", "central"]) | toml_scalars,
                "servers": toml_values,
            },
        )
        doc["pools"] = draw(st.lists(pool | toml_values, max_size=2) | toml_scalars)
    for section in ("admission", "autoscaling", "allocation", "tracing", "nonsense"):
        if draw(st.integers(0, 4)) == 0:
            doc[section] = draw(toml_values)
    return doc


@SETTINGS
@given(toml_documents())
def test_a_config_file_loads_or_names_the_bad_key(doc: dict[str, Any]) -> None:
    try:
        parse_config(doc, "tailgate.toml", env={})
    except ConfigError as exc:
        assert str(exc).startswith("tailgate.toml: "), exc


_AGENT_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "id": names,
    "cluster": names,
    "pool": names,
    "host": names,
    "port": st.integers(-10, 70_000),
    "gateway": st.sampled_from(["http://gw:8080", "ftp://x", ""]) | names,
    "reader": st.sampled_from(["simulated", "iio", "command", "x"]),
    "sensors": st.sampled_from(["temperature", "temperature,humidity", "", ",", "x"]),
    "iio_device": names,
    "reader_command": st.sampled_from(["", " ", "echo {}"]),
    "sample_interval_s": numbers.filter(lambda v: isinstance(v, float)),
    "retention_days": st.floats(allow_nan=True, allow_infinity=True),
    "policy": st.sampled_from(["fifo", "tf-edfq", "nope", ""]),
    "slots": st.integers(-2, 10),
    "profile": st.sampled_from(["none", "wet-lab", "x"]),
    "read_sample": st.floats(allow_nan=True, allow_infinity=True),
    "time_scale": st.floats(allow_nan=True, allow_infinity=True),
    "metrics_port": st.integers(-10, 70_000),
    "max_frame_bytes": st.integers(-1, 2**31),
}


@SETTINGS
@given(st.fixed_dictionaries({}, optional=_AGENT_OPTIONS))
def test_the_edge_agent_options_load_or_name_the_bad_option(args: dict[str, Any]) -> None:
    args.setdefault("id", "pi-1")
    args.setdefault("cluster", "lab")
    try:
        load_agent_config(args, {})
    except AgentConfigError as exc:
        assert exc.option.startswith("--"), exc
