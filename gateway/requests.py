"""Validation of API request bodies into typed requests.

Every rejection is a BadRequest naming the field path (``targets.fanout``,
``slo.latency_ms``) and what is wrong with the value it got.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from gateway.config import TENANT_PATTERN, GatewayConfig, parse_address
from gateway.errors import BadRequest
from gateway.stages import STAGE_RULES
from taskserver.abc import InvalidTask
from taskserver.registration import CLUSTER_NAME_RE, check_cluster_name
from taskserver.sensing_payload import SENSING_EXECUTOR, check_sensing_task, parse_payload

CLUSTER_PATTERN = f"^{CLUSTER_NAME_RE.pattern}$"
"""What check_cluster_name accepts, as a JSON Schema pattern."""
_TENANT_RE = re.compile(TENANT_PATTERN)
DEFAULT_TENANT = "default"
"""The tenant of a query that names none."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a request body: its JSON Schema and the checks that go with it.

    The body definitions below are the one source of both the validation here and the
    request schemas of the OpenAPI document (gateway.openapi). `check` covers the type and
    range and words its error as the API always has; the rules across fields, and the
    checks against the configuration (known classes, pools, max_fanout), stay in the
    parse functions.
    """

    name: str
    kind: str
    """JSON type: string, integer, number, boolean, object, array, or "" for any value."""
    description: str = ""
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    max_length: int | None = None
    pattern: str | None = None
    ref: str | None = None
    """A component schema this field is (``#/components/schemas/NAME``)."""
    extra: tuple[tuple[str, Any], ...] = ()
    """More JSON Schema keywords (items, minItems...)."""

    def schema(self) -> dict[str, Any]:
        """The field's JSON Schema."""
        if self.ref is not None:
            return {"$ref": f"#/components/schemas/{self.ref}"}
        out: dict[str, Any] = {"type": self.kind} if self.kind else {}
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("exclusiveMinimum", self.exclusive_minimum),
            ("exclusiveMaximum", self.exclusive_maximum),
            ("minLength", 1 if self.max_length else None),
            ("maxLength", self.max_length),
            ("pattern", self.pattern),
        ):
            if value is not None:
                out[key] = value
        out.update(self.extra)
        if self.description:
            out["description"] = self.description
        return out

    def check(self, value: Any, path: str) -> Any:
        """The value (an integer field's as an int) if it has this field's type and range;
        BadRequest naming `path` if not."""
        if self.kind == "integer":
            lo, hi = self.minimum, self.maximum
            ok = _is_int(value) and (lo is None or value >= lo) and (hi is None or value <= hi)
            if not ok:
                want = f"in {lo:g}..{hi:g}" if lo is not None and hi is not None else f">= {lo:g}"
                raise BadRequest(f"must be an integer {want}, got {value!r}", field=path)
            return int(value)
        elif self.kind == "number":
            if not _is_number(value) or not math.isfinite(value):
                raise BadRequest(f"must be a number, got {value!r}", field=path)
            lo, hi = self.exclusive_minimum, self.exclusive_maximum
            if (lo is not None and not value > lo) or (hi is not None and not value < hi):
                want = f"in ({lo:g}, {hi:g})" if lo is not None and hi is not None else f"> {lo:g}"
                raise BadRequest(f"must be {want}, got {value}", field=path)
        elif self.kind == "boolean":
            if not isinstance(value, bool):
                raise BadRequest(f"must be a boolean, got {value!r}", field=path)
        elif self.kind == "string":
            if not isinstance(value, str):
                raise BadRequest(f"must be a string, got {_type_name(value)}", field=path)
        elif self.kind == "object" and not isinstance(value, dict):
            raise BadRequest(f"must be an object, got {_type_name(value)}", field=path)
        return value


@dataclass(frozen=True, slots=True)
class Body:
    """A JSON object of fields (a request body, or an object inside one)."""

    name: str
    """Its component name in the OpenAPI document."""
    fields: tuple[Field, ...]
    description: str = ""
    exclusive: tuple[str, ...] = ()
    """Fields of which at most one may be given (a query's class and slo)."""

    @property
    def names(self) -> set[str]:
        """The field names it allows."""
        return {f.name for f in self.fields}

    def __getitem__(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema (no field beyond those listed)."""
        out: dict[str, Any] = {"type": "object"}
        if self.description:
            out["description"] = self.description
        required = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        out["properties"] = {f.name: f.schema() for f in self.fields}
        out["additionalProperties"] = False
        if self.exclusive:
            out["not"] = {"anyOf": [{"required": list(pair)} for pair in _pairs(self.exclusive)]}
        return out


def _pairs(names: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


SLO_BODY = Body(
    "Slo",
    (
        Field("percentile", "number", required=True, exclusive_minimum=0, exclusive_maximum=100),
        Field("latency_ms", "number", required=True, exclusive_minimum=0),
    ),
)
TARGETS_BODY = Body(
    "Targets",
    (
        Field(
            "servers",
            "array",
            extra=(("items", {"type": "string", "minLength": 1}), ("minItems", 1)),
        ),
        Field("pool", "string"),
        Field("fanout", "integer", minimum=1, description="at most max_fanout"),
        Field("all", "boolean"),
        Field("per_cluster", "integer", minimum=1, description="at most max_fanout"),
        Field("cluster", "string", pattern=CLUSTER_PATTERN),
        Field("exclude_cluster", "string", pattern=CLUSTER_PATTERN),
    ),
    "Either explicit servers, or a pool with one of fanout (k random servers), all, or "
    "per_cluster (k random servers from each cluster). cluster narrows fanout or all to "
    "one cluster; exclude_cluster leaves one out. An unknown cluster is 400; a cluster "
    "with no live server is 503 (Retry-After).",
)
QUERY_BODY = Body(
    "Query",
    (
        Field("class", "string", description="a configured class (GET /v1/classes)"),
        Field("slo", "object", ref="Slo"),
        Field(
            "priority",
            "integer",
            minimum=-1000,
            maximum=1000,
            description="PRIQ priority, smaller first",
        ),
        Field("targets", "object", required=True, ref="Targets"),
        Field("task", "", description="task payload handed to every task's executor"),
        Field(
            "cost_hint",
            "number",
            exclusive_minimum=0,
            description="the client's own estimate of the query's cost in ms of server time; "
            "the cost ladder buckets it instead of k_f x x_p^u",
        ),
        Field(
            "tenant",
            "string",
            max_length=64,
            pattern=TENANT_PATTERN,
            description="who the query is for; the allocation layer ([allocation]) shares the "
            "pools between tenants by weight (absent: tenant 'default')",
        ),
    ),
    "Give a class or an slo, not both; with neither, the gateway's default_class (400 "
    "naming `class` when none is configured).",
    exclusive=("class", "slo"),
)
REGISTER_BODY = Body(
    "Register",
    (
        Field("id", "string", required=True, max_length=200),
        Field("pool", "string"),
        Field("address", "string", required=True, description="host:port of the Thrift listener"),
        Field("slots", "integer", minimum=1, maximum=100_000),
        Field(
            "cluster",
            "string",
            pattern=CLUSTER_PATTERN,
            description="cluster label (edge agents: the Pi cluster)",
        ),
    ),
)

_QUERY_FIELDS = QUERY_BODY.names
_TARGET_FIELDS = TARGETS_BODY.names
_REGISTER_FIELDS = REGISTER_BODY.names


@dataclass(frozen=True, slots=True)
class Targets:
    """Which servers a query fans out to."""

    servers: tuple[str, ...] | None = None
    pool: str | None = None
    fanout: int | None = None
    all: bool = False
    cluster: str | None = None
    """Pick only among the pool's servers of this cluster."""
    per_cluster: int | None = None
    """Pick this many servers from each cluster of the pool."""
    exclude_cluster: str | None = None
    """Pick only among the pool's servers outside this cluster."""


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """A validated POST /v1/queries body."""

    class_name: str | None
    percentile: float
    slo_ms: float
    priority: int
    targets: Targets
    payload: bytes
    cost_hint_ms: float | None = None
    """The client's cost estimate (ms of server time), for the cost ladder's buckets."""
    tenant: str = DEFAULT_TENANT
    """Who the query is for (the allocation layer's flow)."""


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """A validated POST /v1/servers body."""

    id: str
    pool: str
    address: str
    slots: int
    cluster: str | None = None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    """An integer as JSON Schema has it: a number without a fractional part (2, 2.0)."""
    if isinstance(v, float):
        return v.is_integer()
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "null" if v is None else "number"
    )


def _unknown(obj: dict[str, Any], allowed: set[str], prefix: str) -> None:
    """BadRequest for a field not in `allowed`, or a typed field given as null (the
    document gives each field a type; leaving a field out is how to take its default)."""
    for key, value in obj.items():
        if key not in allowed:
            raise BadRequest(
                f"unknown field {key!r} (allowed: {', '.join(sorted(allowed))})",
                field=f"{prefix}{key}",
            )
        if value is None and key not in _ANY_VALUE:
            raise BadRequest("must not be null (leave it out for its default)", field=prefix + key)


def parse_query(body: Any, config: GatewayConfig) -> QueryRequest:
    """Validate a query body against the configured classes and limits."""
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {_type_name(body)}", field="")
    _unknown(body, _QUERY_FIELDS, "")
    cls_name = body.get("class")
    slo = body.get("slo")
    if cls_name is not None and slo is not None:
        raise BadRequest("give either 'class' or 'slo', not both", field="slo")
    priority = 0
    if slo is not None:
        percentile, slo_ms = _parse_slo(slo)
        cls_name = None
    else:
        if cls_name is None:
            cls_name = config.default_class
        if cls_name is None:
            raise BadRequest("a query needs a 'class' or an 'slo'", field="class")
        QUERY_BODY["class"].check(cls_name, "class")
        cls = config.class_named(cls_name)
        if cls is None:
            known = ", ".join(c.name for c in config.classes)
            raise BadRequest(f"unknown class {cls_name!r} (known: {known})", field="class")
        percentile, slo_ms, priority = cls.percentile, cls.latency_ms, cls.priority
    if "priority" in body:
        priority = QUERY_BODY["priority"].check(body["priority"], "priority")
    if "targets" not in body:
        raise BadRequest("required", field="targets")
    targets = _parse_targets(body["targets"], config)
    task = body.get("task", {})
    try:
        payload = json.dumps(task, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:
        raise BadRequest(f"not encodable as JSON: {exc}", field="task") from exc
    cost_hint = None
    if "cost_hint" in body:
        cost_hint = float(QUERY_BODY["cost_hint"].check(body["cost_hint"], "cost_hint"))
    tenant = DEFAULT_TENANT
    if "tenant" in body:
        tenant = QUERY_BODY["tenant"].check(body["tenant"], "tenant")
        if not _TENANT_RE.fullmatch(tenant):
            raise BadRequest(
                f"must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or "
                f"digit, got {tenant!r}",
                field="tenant",
            )
    return QueryRequest(cls_name, percentile, slo_ms, priority, targets, payload, cost_hint, tenant)


def check_task(payload: bytes, executors: Iterable[str | None]) -> None:
    """A query's task against the payload rules of the executors its servers run, where the
    gateway knows them (edge agents: `taskserver.sensing_payload`); BadRequest naming
    ``task.<field>`` if it breaks them. Other executors judge their own payloads."""
    if SENSING_EXECUTOR not in set(executors):
        return
    try:
        check_sensing_task(parse_payload(payload))
    except InvalidTask as exc:
        field = "task" if exc.field == "payload" else f"task.{exc.field}"
        raise BadRequest(f"{exc.problem} (a sensing task for edge agents)", field=field) from exc


def _parse_slo(slo: Any) -> tuple[float, float]:
    QUERY_BODY["slo"].check(slo, "slo")
    _unknown(slo, SLO_BODY.names, "slo.")
    for f in SLO_BODY.fields:
        if f.name not in slo:
            raise BadRequest("required", field=f"slo.{f.name}")
        f.check(slo[f.name], f"slo.{f.name}")
    return float(slo["percentile"]), float(slo["latency_ms"])


def _parse_targets(t: Any, config: GatewayConfig) -> Targets:
    QUERY_BODY["targets"].check(t, "targets")
    _unknown(t, _TARGET_FIELDS, "targets.")
    if "servers" in t:
        if any(k in t for k in _TARGET_FIELDS - {"servers"}):
            raise BadRequest("give either 'servers' or a 'pool', not both", field="targets.servers")
        servers = t["servers"]
        if not isinstance(servers, list) or not servers:
            raise BadRequest("must be a non-empty array of server ids", field="targets.servers")
        if len(servers) > config.max_fanout:
            raise BadRequest(
                f"fanout {len(servers)} exceeds max_fanout {config.max_fanout}",
                field="targets.servers",
            )
        seen: set[str] = set()
        for i, sid in enumerate(servers):
            if not isinstance(sid, str) or not sid:
                raise BadRequest(
                    f"must be a server id string, got {sid!r}", field=f"targets.servers[{i}]"
                )
            if sid in seen:
                raise BadRequest(f"duplicate server id {sid!r}", field=f"targets.servers[{i}]")
            seen.add(sid)
        return Targets(servers=tuple(servers))
    pool = t.get("pool")
    if pool is None:
        raise BadRequest("give 'servers' or a 'pool'", field="targets.pool")
    TARGETS_BODY["pool"].check(pool, "targets.pool")
    if config.pool_named(pool) is None:
        known = ", ".join(p.name for p in config.pools)
        raise BadRequest(f"unknown pool {pool!r} (known: {known})", field="targets.pool")
    all_ = TARGETS_BODY["all"].check(t.get("all", False), "targets.all")
    fanout = t.get("fanout")
    per_cluster = t.get("per_cluster")
    cluster = _cluster_field(t, "cluster")
    exclude = _cluster_field(t, "exclude_cluster")
    if cluster is not None and exclude is not None:
        raise BadRequest(
            "give either 'cluster' or 'exclude_cluster', not both", field="targets.exclude_cluster"
        )
    if all_ and fanout is not None:
        raise BadRequest("give either 'fanout' or 'all', not both", field="targets.fanout")
    if per_cluster is not None:
        if all_ or fanout is not None:
            raise BadRequest(
                "give one of 'fanout', 'all' or 'per_cluster'", field="targets.per_cluster"
            )
        if cluster is not None:
            raise BadRequest(
                "'per_cluster' picks from every cluster; to pick from one, give 'cluster' "
                "with 'fanout'",
                field="targets.per_cluster",
            )
        per_cluster = TARGETS_BODY["per_cluster"].check(per_cluster, "targets.per_cluster")
        if per_cluster > config.max_fanout:
            raise BadRequest(
                f"per_cluster {per_cluster} exceeds max_fanout {config.max_fanout}",
                field="targets.per_cluster",
            )
    elif not all_:
        if fanout is None:
            raise BadRequest(
                "required unless 'all' is true or 'per_cluster' is given", field="targets.fanout"
            )
        fanout = TARGETS_BODY["fanout"].check(fanout, "targets.fanout")
        if fanout > config.max_fanout:
            raise BadRequest(
                f"fanout {fanout} exceeds max_fanout {config.max_fanout}", field="targets.fanout"
            )
    return Targets(
        pool=pool,
        fanout=fanout,
        all=all_,
        cluster=cluster,
        per_cluster=per_cluster,
        exclude_cluster=exclude,
    )


def _cluster_field(t: dict[str, Any], key: str) -> str | None:
    value = t.get(key)
    if value is None:
        return None
    try:
        return check_cluster_name(value)
    except ValueError as exc:
        raise BadRequest(str(exc).removeprefix("cluster: "), field=f"targets.{key}") from exc


def parse_register(body: Any, config: GatewayConfig) -> RegisterRequest:
    """Validate a server registration body."""
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {_type_name(body)}", field="")
    _unknown(body, _REGISTER_FIELDS, "")
    sid = body.get("id")
    max_id = REGISTER_BODY["id"].max_length or 0
    if not isinstance(sid, str) or not sid or len(sid) > max_id:
        raise BadRequest(f"must be a non-empty string, got {sid!r}", field="id")
    pool = body.get("pool", config.pools[0].name)
    if not isinstance(pool, str) or config.pool_named(pool) is None:
        known = ", ".join(p.name for p in config.pools)
        raise BadRequest(f"unknown pool {pool!r} (known: {known})", field="pool")
    address = body.get("address")
    if not isinstance(address, str):
        raise BadRequest(f"must be a host:port string, got {address!r}", field="address")
    try:
        parse_address(address)
    except ValueError as exc:
        raise BadRequest(str(exc).removeprefix("address: "), field="address") from exc
    slots = REGISTER_BODY["slots"].check(body.get("slots", 1), "slots")
    cluster = body.get("cluster")
    if cluster is not None:
        try:
            check_cluster_name(cluster)
        except ValueError as exc:
            raise BadRequest(str(exc).removeprefix("cluster: "), field="cluster") from exc
    return RegisterRequest(sid, pool, address, slots, cluster)


# -- multi-query requests (POST /v1/requests) ----------------------------------------------

MAX_STAGES = 16
"""Most queries (stages) one multi-query request may run."""

STAGE_BODY = Body(
    "Stage",
    (
        QUERY_BODY["targets"],
        QUERY_BODY["task"],
        QUERY_BODY["priority"],
        QUERY_BODY["cost_hint"],
    ),
    "One query of a multi-query request, checked as a query body is. Its SLO is not given: "
    "the request's stage_rule assigns it when the stage starts.",
)
MULTI_QUERY_BODY = Body(
    "MultiQueryRequest",
    (
        QUERY_BODY["class"],
        QUERY_BODY["slo"],
        replace(
            QUERY_BODY["tenant"],
            description="who the request is for; each stage counts as one of its queries "
            "(absent: tenant 'default')",
        ),
        Field(
            "stage_rule",
            "string",
            description="how the SLO left is shared between the stages left when each starts "
            "(gateway.stages): remaining (default), proportional or equal",
            extra=(("enum", list(STAGE_RULES)),),
        ),
        Field(
            "stages",
            "array",
            required=True,
            description="the queries, run one after another",
            extra=(
                ("items", {"$ref": "#/components/schemas/Stage"}),
                ("minItems", 1),
                ("maxItems", MAX_STAGES),
            ),
        ),
    ),
    "M fanout queries in a row under one SLO (TailGuard eq. (5)). Give a class or an slo, "
    "not both; with neither, the gateway's default_class (400 naming `class` when none is "
    "configured).",
    exclusive=("class", "slo"),
)
REQUEST_BODIES = (QUERY_BODY, SLO_BODY, TARGETS_BODY, REGISTER_BODY, MULTI_QUERY_BODY, STAGE_BODY)
"""Every request body and object in one, for the OpenAPI document's components."""
_ANY_VALUE = frozenset(f.name for body in REQUEST_BODIES for f in body.fields if not f.kind)
"""Fields that take any JSON value, null included (a query's task)."""

_STAGE_FIELDS = STAGE_BODY.names
_MULTI_QUERY_FIELDS = MULTI_QUERY_BODY.names
_SHARED_FIELDS = ("class", "slo", "tenant")
"""The request's fields that every stage's query takes as its own."""


@dataclass(frozen=True, slots=True)
class MultiQueryRequest:
    """A validated POST /v1/requests body: M queries run one after another under one SLO."""

    class_name: str | None
    percentile: float
    slo_ms: float
    """The request's SLO, which its stages share (TailGuard eq. (5))."""
    tenant: str
    stage_rule: str
    """How each stage's SLO is assigned when it starts (gateway.stages.STAGE_RULES)."""
    stages: tuple[QueryRequest, ...]
    """Each stage as the query it runs, with the request's class, percentile and tenant; its
    slo_ms is the request's until the stage starts and is assigned its own."""


def parse_multi_query(body: Any, config: GatewayConfig) -> MultiQueryRequest:
    """Validate a multi-query request body against the configured classes and limits.

    Each stage is checked as the query body it becomes (the request's class or slo and
    tenant, the stage's own fields), so a stage accepts exactly what POST /v1/queries does;
    a stage's error names its path under ``stages[i]``.
    """
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {_type_name(body)}", field="")
    _unknown(body, _MULTI_QUERY_FIELDS, "")
    rule = MULTI_QUERY_BODY["stage_rule"].check(body.get("stage_rule", "remaining"), "stage_rule")
    if rule not in STAGE_RULES:
        raise BadRequest(
            f"must be one of {', '.join(STAGE_RULES)}, got {rule!r}", field="stage_rule"
        )
    if "stages" not in body:
        raise BadRequest("required", field="stages")
    stages = body["stages"]
    if not isinstance(stages, list) or not stages:
        raise BadRequest(f"must be a non-empty array of stages, got {stages!r:.80}", field="stages")
    if len(stages) > MAX_STAGES:
        raise BadRequest(f"at most {MAX_STAGES} stages, got {len(stages)}", field="stages")
    shared = {k: body[k] for k in _SHARED_FIELDS if k in body}
    queries: list[QueryRequest] = []
    for i, stage in enumerate(stages):
        path = f"stages[{i}]"
        if not isinstance(stage, dict):
            raise BadRequest(f"must be an object, got {_type_name(stage)}", field=path)
        _unknown(stage, _STAGE_FIELDS, f"{path}.")
        try:
            queries.append(parse_query({**shared, **stage}, config))
        except BadRequest as exc:
            # parse_query names a query's paths; the stage's own fields live under stages[i].
            head = (exc.field or "").split(".", 1)[0].split("[", 1)[0]
            if head in _STAGE_FIELDS:
                raise BadRequest(exc.message, field=f"{path}.{exc.field}") from exc
            raise
    first = queries[0]
    return MultiQueryRequest(
        first.class_name, first.percentile, first.slo_ms, first.tenant, rule, tuple(queries)
    )
