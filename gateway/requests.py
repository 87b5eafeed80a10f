"""Validation of API request bodies into typed requests.

Every rejection is a BadRequest naming the field path (``targets.fanout``,
``slo.latency_ms``) and what is wrong with the value it got.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.config import GatewayConfig, check_cluster_name, parse_address
from gateway.errors import BadRequest

_QUERY_FIELDS = {"class", "slo", "targets", "task", "priority"}
_TARGET_FIELDS = {"servers", "pool", "fanout", "all", "cluster", "per_cluster", "exclude_cluster"}
_REGISTER_FIELDS = {"id", "pool", "address", "slots", "cluster"}


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
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "null" if v is None else "number"
    )


def _unknown(obj: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise BadRequest(
                f"unknown field {key!r} (allowed: {', '.join(sorted(allowed))})",
                field=f"{prefix}{key}",
            )


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
        if not isinstance(cls_name, str):
            raise BadRequest(f"must be a string, got {_type_name(cls_name)}", field="class")
        cls = config.class_named(cls_name)
        if cls is None:
            known = ", ".join(c.name for c in config.classes)
            raise BadRequest(f"unknown class {cls_name!r} (known: {known})", field="class")
        percentile, slo_ms, priority = cls.percentile, cls.latency_ms, cls.priority
    if "priority" in body:
        priority = body["priority"]
        if not _is_int(priority) or not -1000 <= priority <= 1000:
            raise BadRequest(
                f"must be an integer in -1000..1000, got {priority!r}", field="priority"
            )
    if "targets" not in body:
        raise BadRequest("required", field="targets")
    targets = _parse_targets(body["targets"], config)
    task = body.get("task", {})
    try:
        payload = json.dumps(task, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:
        raise BadRequest(f"not encodable as JSON: {exc}", field="task") from exc
    return QueryRequest(cls_name, percentile, slo_ms, priority, targets, payload)


def _parse_slo(slo: Any) -> tuple[float, float]:
    if not isinstance(slo, dict):
        raise BadRequest(f"must be an object, got {_type_name(slo)}", field="slo")
    _unknown(slo, {"percentile", "latency_ms"}, "slo.")
    for key in ("percentile", "latency_ms"):
        if key not in slo:
            raise BadRequest("required", field=f"slo.{key}")
        if not _is_number(slo[key]) or not math.isfinite(slo[key]):
            raise BadRequest(f"must be a number, got {slo[key]!r}", field=f"slo.{key}")
    percentile, latency_ms = float(slo["percentile"]), float(slo["latency_ms"])
    if not 0 < percentile < 100:
        raise BadRequest(f"must be in (0, 100), got {slo['percentile']}", field="slo.percentile")
    if latency_ms <= 0:
        raise BadRequest(f"must be > 0, got {slo['latency_ms']}", field="slo.latency_ms")
    return percentile, latency_ms


def _parse_targets(t: Any, config: GatewayConfig) -> Targets:
    if not isinstance(t, dict):
        raise BadRequest(f"must be an object, got {_type_name(t)}", field="targets")
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
    if not isinstance(pool, str):
        raise BadRequest(f"must be a string, got {_type_name(pool)}", field="targets.pool")
    if config.pool_named(pool) is None:
        known = ", ".join(p.name for p in config.pools)
        raise BadRequest(f"unknown pool {pool!r} (known: {known})", field="targets.pool")
    all_ = t.get("all", False)
    if not isinstance(all_, bool):
        raise BadRequest(f"must be a boolean, got {all_!r}", field="targets.all")
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
        if not _is_int(per_cluster) or per_cluster < 1:
            raise BadRequest(
                f"must be an integer >= 1, got {per_cluster!r}", field="targets.per_cluster"
            )
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
        if not _is_int(fanout) or fanout < 1:
            raise BadRequest(f"must be an integer >= 1, got {fanout!r}", field="targets.fanout")
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
    if not isinstance(sid, str) or not sid or len(sid) > 200:
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
    slots = body.get("slots", 1)
    if not _is_int(slots) or not 1 <= slots <= 100_000:
        raise BadRequest(f"must be an integer in 1..100000, got {slots!r}", field="slots")
    cluster = body.get("cluster")
    if cluster is not None:
        try:
            check_cluster_name(cluster)
        except ValueError as exc:
            raise BadRequest(str(exc).removeprefix("cluster: "), field="cluster") from exc
    return RegisterRequest(sid, pool, address, slots, cluster)
