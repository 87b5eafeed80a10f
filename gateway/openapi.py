"""The OpenAPI 3.1 document of the gateway's HTTP API (GET /openapi.json).

The request bodies' schemas come from their definitions in `gateway.requests`, the same
objects that validate them.
"""

from __future__ import annotations

from typing import Any

from gateway.auth import Access, access_of
from gateway.connections import PROBE_PATHS
from gateway.requests import REQUEST_BODIES
from gateway.server_listing import MAX_PAGE, STATES

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": ["string", "null"], "description": "path of the field at fault"},
            },
        }
    },
}

_TASK = {
    "type": "object",
    "properties": {
        "server": {"type": "string"},
        "status": {
            "type": "string",
            "enum": ["ok", "failed", "cancelled", "rejected", "lost", "timeout"],
        },
        "queue_ms": {"type": ["number", "null"]},
        "service_ms": {"type": ["number", "null"]},
        "post_queue_ms": {"type": ["number", "null"]},
        "server_ms": {"type": ["number", "null"], "description": "receipt to result on the server"},
        "missed_deadline": {"type": ["boolean", "null"]},
        "result": {},
        "error": {"type": "string"},
        "estimated_wait_ms": {
            "type": "number",
            "description": "the queue wait estimated before dispatch (predictive admission or "
            "[gateway] wait_estimates); queue_ms is the actual one",
        },
        "retries": {
            "type": "integer",
            "minimum": 1,
            "description": "times a busy server sent the task back and another took it "
            '(pools with dispatch = "retry"); absent when none',
        },
    },
}

_ANSWER = {
    "type": "object",
    "required": [
        "query_id",
        "fanout",
        "budget_ms",
        "unloaded_latency_ms",
        "latency_ms",
        "met_slo",
        "tasks",
    ],
    "properties": {
        "query_id": {"type": "string"},
        "request_id": {
            "type": "string",
            "description": "the X-Request-Id of the answer: the client's, or one made here",
        },
        "class": {"type": ["string", "null"]},
        "percentile": {"type": "number"},
        "slo_ms": {"type": "number"},
        "fanout": {"type": "integer"},
        "budget_ms": {"type": "number", "description": "T_b = SLO - x_p^u(k_f)"},
        "unloaded_latency_ms": {"type": "number", "description": "x_p^u(k_f)"},
        "estimate": {"type": "string", "enum": ["empirical", "tail-model"]},
        "latency_ms": {"type": "number"},
        "met_slo": {"type": "boolean"},
        "dispatch_ms": {"type": "number", "description": "arrival to last task handed to the wire"},
        "merge_ms": {"type": "number", "description": "deciding task outcome to answer ready"},
        "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/TaskOutcome"}},
        "error": _ERROR["properties"]["error"],
    },
}

_STAGE_ANSWER = {
    "type": "object",
    "required": [
        "stage",
        "query_id",
        "slo_ms",
        "remaining_ms",
        "budget_ms",
        "unloaded_latency_ms",
        "started_ms",
        "latency_ms",
        "fanout",
        "met_slo",
        "outcome",
        "tasks",
    ],
    "properties": {
        "stage": {"type": "integer", "description": "its index in the request's stages"},
        "query_id": {"type": "string"},
        "slo_ms": {
            "type": "number",
            "description": "the SLO the stage rule assigned it when it started (at most "
            "remaining_ms)",
        },
        "remaining_ms": {
            "type": "number",
            "description": "the request's SLO less started_ms: what was left when it started",
        },
        "budget_ms": {"type": "number", "description": "T_b = slo_ms - x_p^u(k_f)"},
        "unloaded_latency_ms": {
            "type": "number",
            "description": "x_p^u(k_f) over its servers, when it started",
        },
        "estimate": {"type": "string", "enum": ["empirical", "tail-model"]},
        "started_ms": {"type": "number", "description": "its start, from the request's arrival"},
        "latency_ms": {"type": "number"},
        "fanout": {"type": "integer"},
        "met_slo": {"type": "boolean", "description": "within its own slo_ms"},
        "outcome": {
            "type": "string",
            "enum": [
                "met",
                "missed_slo",
                "dropped",
                "draining",
                "timeout",
                "rejected",
                "failed",
                "invalid",
            ],
        },
        "cancelled_siblings": {"type": "integer"},
        "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/TaskOutcome"}},
        "error": _ERROR["properties"]["error"],
    },
}

_REQUEST_ANSWER = {
    "type": "object",
    "required": ["request_id", "slo_ms", "stage_rule", "latency_ms", "met_slo", "stages"],
    "properties": {
        "request_id": {"type": "string"},
        "class": {"type": ["string", "null"]},
        "percentile": {"type": "number"},
        "slo_ms": {"type": "number", "description": "the request's SLO, shared by its stages"},
        "stage_rule": {"type": "string", "enum": ["remaining", "proportional", "equal"]},
        "latency_ms": {"type": "number", "description": "arrival to answer"},
        "met_slo": {
            "type": "boolean",
            "description": "every stage succeeded and latency_ms <= slo_ms",
        },
        "stages": {
            "type": "array",
            "description": "the stages run, in order (on an error: those run so far)",
            "items": {"$ref": "#/components/schemas/StageAnswer"},
        },
        "stage": {"type": "integer", "description": "on an error: the stage that ended it"},
        "error": _ERROR["properties"]["error"],
    },
}

_SERVER = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "pool": {"type": "string"},
        "cluster": {"type": ["string", "null"]},
        "address": {"type": "string"},
        "slots": {"type": "integer"},
        "state": {
            "type": "string",
            "enum": ["connecting", "up", "down", "closed", "draining", "owned_elsewhere"],
        },
        "queueing": {"type": "string", "enum": ["server", "central"]},
        "executor": {
            "type": ["string", "null"],
            "description": "what the server runs, as its heartbeat names it (emulated, pipeline, "
            "sensing; null before the first reply)",
        },
        "owner": {
            "type": "string",
            "description": "the gateway that owns the server (central queueing), when one does",
        },
        "outstanding": {"type": "integer"},
        "registered_ago_s": {
            "type": "number",
            "description": "seconds since the server last registered or refreshed it",
        },
        "refresh_s": {
            "type": "number",
            "description": "in a registration's answer only: the least wait before the server "
            "refreshes its registration (longer with more servers registered)",
        },
        "post_queue_ms": {"type": "object", "additionalProperties": {"type": "number"}},
        "rtt_ms": {
            "type": ["number", "null"],
            "description": "heartbeat round trip, smoothed (null before the first)",
        },
        "dispatch_delay_ms": {
            "type": "number",
            "description": "what comes off each task's budgets for the way to the server: "
            "half the least of the last 16 heartbeat round trips",
        },
        "estimated_wait_ms": {
            "type": "number",
            "description": "estimated mean queue wait of a task joining at the back of the "
            "server's queue now (QLM's estimator: the tasks outstanding ahead of it, the busy "
            "slots and the server's post-queuing times)",
        },
        "estimated_wait_sd_ms": {
            "type": "number",
            "description": "standard deviation of that wait (its Normal approximation)",
        },
    },
}

_PROBE = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "ready", "starting", "draining"]},
        "gateway_id": {"type": "string", "description": "this replica's id"},
        "servers_up": {"type": "integer"},
        "servers": {"type": "integer"},
    },
}

SECURITY: dict[Access, list[dict[str, list[str]]]] = {
    Access.READ: [{}, {"adminToken": []}, {"readToken": []}],
    Access.QUERY: [{}, {"apiKey": []}, {"adminToken": []}],
    Access.REGISTER: [{}, {"registrationToken": []}, {"adminToken": []}],
    Access.ADMIN: [{}, {"adminToken": []}],
}
"""Each access class's credentials (gateway.auth); `{}`: open as configured ([auth]
read_routes and queries; write routes while no registration or admin token is set)."""

_AUTH_ANSWERS = {
    "401": "no credential, a malformed one or one the gateway does not know "
    "(WWW-Authenticate: Bearer; `field` is Authorization)",
    "403": "a valid credential without the right to this route (a tenant's API key on a "
    "write route, a read token on a query), or a query naming another tenant than its "
    "key's (`field` tenant)",
    "429": "the source keeps sending refused requests and is slowed down (code "
    "`slowed_down`), the API key is over its rate or in-flight limit (code "
    "`key_limited`), or a query's client has `max_in_flight_per_client` queries "
    "unanswered (code `client_in_flight_limited`, `limit` names it); Retry-After",
}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


def _err(description: str) -> dict[str, Any]:
    return _json("Error", description)


def _query_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An optional query-string parameter."""
    return {
        "name": name, "in": "query", "required": False, "description": description,
        "schema": schema,
    }  # fmt: skip


def _either(description: str, *schemas: str) -> dict[str, Any]:
    """A response whose body is one of these component schemas (anyOf, not oneOf: an
    answer with an `error` is an Error too, as Error allows more fields)."""
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in schemas]
    return {
        "description": description,
        "content": {"application/json": {"schema": {"anyOf": refs}}},
    }


_UNSUPPORTED = _err(
    "the body is not application/json (Content-Type names another type, or a charset other "
    "than utf-8); `field` is Content-Type. A body without Content-Type is read as JSON"
)

OPERATIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("post", "/v1/queries"): ("submitQuery", "queries"),
    ("post", "/v1/requests"): ("submitRequest", "queries"),
    ("get", "/v1/servers"): ("listServers", "servers"),
    ("post", "/v1/servers"): ("registerServer", "servers"),
    ("delete", "/v1/servers/{id}"): ("deregisterServer", "servers"),
    ("get", "/v1/classes"): ("listClasses", "admission"),
    ("get", "/v1/groups"): ("listGroups", "admission"),
    ("get", "/v1/tenants"): ("listTenants", "admission"),
    ("get", "/v1/admission"): ("getAdmission", "admission"),
    ("get", "/v1/autoscaler"): ("getAutoscaler", "autoscaling"),
    ("get", "/v1/history"): ("getHistory", "dashboard"),
    ("get", "/v1/dashboard"): ("getDashboardSnapshot", "dashboard"),
    ("get", "/dashboard"): ("getDashboardPage", "dashboard"),
    ("get", "/dashboard/{file}"): ("getDashboardFile", "dashboard"),
    ("get", "/healthz"): ("getHealth", "probes"),
    ("get", "/livez"): ("getLiveness", "probes"),
    ("get", "/readyz"): ("getReadiness", "probes"),
    ("get", "/metrics"): ("getMetrics", "metrics"),
    ("get", "/openapi.json"): ("getOpenApiDocument", "meta"),
}
"""Each operation's operationId and tag, by (method, path)."""

_RETRY_AFTER = {"$ref": "#/components/headers/RetryAfter"}


def _complete(paths: dict[str, Any]) -> None:
    """Every operation with its operationId and tag, its credentials and the access
    check's answers (gateway.auth), Retry-After on every 429 and 503, and the internal
    error any of them may answer (a bug, logged)."""
    for path, ops in paths.items():
        for method, op in ops.items():
            operation_id, tag = OPERATIONS[(method, path)]
            op["operationId"] = operation_id
            op["tags"] = [tag]
            responses = op["responses"]
            access = access_of(method, path)
            if access is Access.PUBLIC:
                op["security"] = []
            else:
                op["security"] = SECURITY[access]
                for status, description in _AUTH_ANSWERS.items():
                    responses.setdefault(status, _err(description))
            if "requestBody" in op:
                responses.setdefault(
                    "408", _err("the body did not arrive within `body_timeout_s` of the headers")
                )
            if path not in PROBE_PATHS:
                responses.setdefault(
                    "503",
                    _err(
                        "the gateway holds `max_connections` connections, all busy: this one "
                        "of its reserve answers only the probes (code `connection_limit`)"
                    ),
                )
            for status in ("429", "503"):
                if status in responses:
                    responses[status] = {
                        **responses[status],
                        "headers": {"Retry-After": _RETRY_AFTER},
                    }
            responses.setdefault("500", _err("internal error (a bug; code `internal`, logged)"))


def openapi_document() -> dict[str, Any]:
    """The document; its paths match the routes in gateway.app.ROUTES."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Tailgate gateway", "version": "0.1.0"},
        "paths": {
            "/v1/queries": {
                "post": {
                    "summary": "Submit a fanout query",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Query"}}
                        },
                    },
                    "responses": {
                        "200": _json("QueryAnswer", "every task succeeded"),
                        "400": _either(
                            "invalid body (names the field), including a task that breaks the "
                            "payload rules of its servers' executor where the gateway knows "
                            "them (edge agents' sensing tasks: `task.end` before `task.start`, "
                            "...); or a QueryAnswer (code `invalid_task`) when a server refused "
                            "its task as invalid (`field` names it: `task.start` before the "
                            "retention horizon, `task.sensor` unknown, ...)",
                            "Error",
                            "QueryAnswer",
                        ),
                        "413": _err("body too large"),
                        "415": _UNSUPPORTED,
                        "422": _err("SLO below the unloaded p-th latency for this fanout"),
                        "502": _json("QueryAnswer", "a task failed or its server was lost"),
                        "503": _err(
                            "no server can take the query, admission control rejected it "
                            "(code `admission_rejected`; the predictive rule adds `reason` "
                            "`predicted_miss`, `estimated_wait_ms`, `retry_after_s`, "
                            "`meet_probability`, `level` and `class`, and Retry-After is "
                            "derived from its estimate), the target servers take no task now "
                            "(codes `servers_down`, `servers_unavailable`, "
                            "`cluster_unavailable`, `no_servers`; `servers_registering` just after "
                            "the gateway started, while fewer servers than the fanout have "
                            "registered), the gateway is draining "
                            "(code `draining`) or another gateway owns the central pool "
                            "(code `pool_owned_elsewhere`); a task was dropped or refused "
                            "(a QueryAnswer, codes `task_dropped`, `task_rejected`). "
                            "Retry-After is an estimate where the gateway can make one "
                            "(`retry_after_s` in the body: the admission window's, the "
                            "servers', the drain's)"
                        ),
                        "504": _json("QueryAnswer", "not complete at SLO + grace"),
                    },
                }
            },
            "/v1/requests": {
                "post": {
                    "summary": "Submit a multi-query request: fanout queries in a row, one SLO",
                    "description": (
                        "TailGuard eq. (5): the request's SLO is additive over its stages. "
                        "Each stage's servers and x_p^u are fixed at arrival; each stage then "
                        "runs as an ordinary query (admission control included) with the SLO "
                        "its stage_rule assigns it from what is left of the request's when it "
                        "starts. The request ends at the first stage that does not succeed, "
                        "with that stage's status; every answer but a 400 or 413 lists the "
                        "stages run so far."
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/MultiQueryRequest"}
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            "RequestAnswer",
                            "every stage succeeded (met_slo: within the request's SLO)",
                        ),
                        "400": _either(
                            "invalid body (names the field, e.g. stages[1].targets.fanout), a "
                            "stage's targets cannot be picked or its task breaks its servers' "
                            "payload rules (stages[1].task.end); or a RequestAnswer when a "
                            "server refused a stage's task as invalid (code `invalid_task`)",
                            "Error",
                            "RequestAnswer",
                        ),
                        "413": _err("body too large"),
                        "415": _UNSUPPORTED,
                        "422": _json(
                            "RequestAnswer",
                            "the SLO is not above the sum of the stages' unloaded p-th "
                            "latencies (stages_unloaded_latency_ms lists them)",
                        ),
                        "502": _json(
                            "RequestAnswer", "a stage's task failed or its server was lost"
                        ),
                        "503": _json(
                            "RequestAnswer",
                            "the budget left cannot cover the next stage and those after it "
                            "even unloaded (code `request_budget_exhausted`, naming the stage "
                            "in `field` and `stage`), or a stage was refused as a query would "
                            "be (admission control, servers down, a task dropped or rejected, "
                            "draining, a pool owned elsewhere); Retry-After",
                        ),
                        "504": _json("RequestAnswer", "a stage not complete at its SLO + grace"),
                    },
                }
            },
            "/v1/servers": {
                "get": {
                    "summary": "List task servers",
                    "description": "Every registered server, in registration order, or those "
                    "the filters keep. With `limit` or `after` the answer is one page in "
                    "server-id order, with `total` and `next_after` (the `after` of the next "
                    "page; null on the last).",
                    "parameters": [
                        _query_param("pool", {"type": "string"}, "only this pool's servers"),
                        _query_param("cluster", {"type": "string"}, "only this cluster's"),
                        _query_param(
                            "state",
                            {"type": "string", "enum": list(STATES)},
                            "only servers in this state",
                        ),
                        _query_param(
                            "limit",
                            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                            "servers a page",
                        ),
                        _query_param(
                            "after",
                            {"type": "string"},
                            "only servers whose id sorts after this one",
                        ),
                    ],
                    "responses": {
                        "200": {
                            "description": "servers",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "servers": {
                                                "type": "array",
                                                "items": {"$ref": "#/components/schemas/Server"},
                                            },
                                            "total": {"type": "integer"},
                                            "next_after": {"type": ["string", "null"]},
                                        },
                                    }
                                }
                            },
                        },
                        "400": _err("bad state or limit"),
                    },
                },
                "post": {
                    "summary": "Register or refresh a task server",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Register"}
                            }
                        },
                    },
                    "responses": {
                        "200": _json("Server", "already registered"),
                        "201": _json("Server", "registered"),
                        "400": _err("invalid body"),
                        "413": _err("body too large"),
                        "415": _UNSUPPORTED,
                    },
                },
            },
            "/v1/servers/{id}": {
                "delete": {
                    "summary": "Deregister a task server",
                    "parameters": [
                        {
                            "name": "id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "drain_s",
                            "in": "query",
                            "required": False,
                            "description": "let outstanding tasks finish for up to this long",
                            "schema": {"type": "number", "minimum": 0, "maximum": 600},
                        },
                    ],
                    "responses": {
                        "200": {"description": "deleted"},
                        "400": _err("bad drain_s"),
                        "404": _err("no such server"),
                    },
                }
            },
            "/v1/classes": {
                "get": {
                    "summary": "Configured query classes",
                    "responses": {"200": {"description": "classes"}},
                }
            },
            "/v1/groups": {
                "get": {
                    "summary": "Request groups (QLM §4): queries by class, pool and cost bucket",
                    "description": (
                        "Per group: class, pool, cost_bucket [lo, hi) in ms of server time "
                        "(k_f x x_p^u), queries admitted, arrival_rate (per s, over the last "
                        "~10 s), mean_cost_ms, tasks_outstanding, mean_service_ms and "
                        "estimated_drain_ms (its outstanding tasks' service over the pool's "
                        "slots)."
                    ),
                    "responses": {"200": {"description": "groups"}},
                }
            },
            "/v1/tenants": {
                "get": {
                    "summary": "The allocation layer's flows (tenants or classes) and shares",
                    "description": (
                        "[allocation]: policy (none, drr, fair), flows_by (tenant or class), "
                        "share (windows, transfer or none), congestion; per flow: weight, "
                        "protected, queries admitted and admitted_cost_ms (k_f x x_p^u or the "
                        "cost hint), rejected by reason, queued_tasks in the central queues, "
                        "deficit_ms (DRR), miss_ratio (its own window, share = windows) and "
                        "share (recent admitted cost, debt, moves; share = transfer)."
                    ),
                    "responses": {"200": {"description": "flows"}},
                }
            },
            "/v1/admission": {
                "get": {
                    "summary": "Admission control: miss-ratio window, thresholds, decisions",
                    "responses": {"200": {"description": "state"}},
                }
            },
            "/v1/autoscaler": {
                "get": {
                    "summary": "Autoscaler: policy, thresholds, replicas, recent actions",
                    "description": (
                        "Times in unix seconds, the monotonic ones beside them as "
                        "`*_monotonic_s`. policy_state.decisions lists the policy's decisions "
                        "one entry per change: a run of equal holds is one entry with "
                        "`repeats` and its first and last decision (`time`, `last_time`); "
                        "every scaling step is an entry of its own."
                    ),
                    "responses": {"200": {"description": "state"}},
                }
            },
            "/v1/history": {
                "get": {
                    "summary": "Stored samples of the gateway's figures (the dashboard's history)",
                    "description": (
                        "One sample per history_interval_s, oldest first, at most 2000 (longer "
                        "ranges are thinned evenly): t (unix s), windowed miss ratio per class "
                        "(miss) and pool (pool_miss), latency at each class's SLO percentile "
                        "(tail_ms) and p99 (p99_ms), answered/rejected/deferred queries per "
                        "second, queue depth per pool and deepest servers, servers by state, "
                        "autoscaled replicas."
                    ),
                    "parameters": [
                        {
                            "name": "since_s",
                            "in": "query",
                            "required": False,
                            "description": "how far back, in seconds (default 3600)",
                            "schema": {"type": "number", "exclusiveMinimum": 0},
                        }
                    ],
                    "responses": {
                        "200": {"description": "samples"},
                        "400": _err("bad since_s"),
                    },
                }
            },
            "/v1/dashboard": {
                "get": {
                    "summary": "Live figures for the dashboard: servers and their state, "
                    "post-queuing CDFs, thresholds, SLOs, autoscaler actions",
                    "responses": {"200": {"description": "snapshot"}},
                }
            },
            "/dashboard": {
                "get": {
                    "summary": "The built-in dashboard (HTML)",
                    "responses": {"200": {"description": "text/html"}},
                }
            },
            "/dashboard/{file}": {
                "get": {
                    "summary": "The dashboard's script and style",
                    "parameters": [
                        {
                            "name": "file",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "enum": ["dashboard.js", "dashboard.css"]},
                        }
                    ],
                    "responses": {
                        "200": {"description": "text/javascript or text/css"},
                        "404": _err("no such file"),
                    },
                }
            },
            "/healthz": {
                "get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}
            },
            "/livez": {
                "get": {
                    "summary": "Liveness: the process serves HTTP (also while draining)",
                    "responses": {"200": _json("Probe", "serving")},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: admits queries (live servers are not required)",
                    "responses": {
                        "200": _json("Probe", "ready"),
                        "503": _json("Probe", "starting or draining (SIGTERM)"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "text format"}},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": {"description": "OpenAPI"}},
                }
            },
        },
        "components": {
            "headers": {
                "RetryAfter": {
                    "description": "whole seconds until a retry may succeed (at least 1): "
                    "an estimate from the reason of the 503 (when the admission window's "
                    "misses age out, the predictive rule's wait, when enough target servers "
                    "may take tasks again, what is left of a drain bound), else the "
                    "configured retry_after_s",
                    "schema": {"type": "integer", "minimum": 1},
                }
            },
            "securitySchemes": {
                "registrationToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the gateway's registration token (TAILGATE_AGENT_TOKEN): "
                    "registration and deregistration only",
                },
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an admin token ([auth] admin_tokens_file): every route",
                },
                "readToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a read token ([auth] read_tokens_file): the read-only "
                    'routes, when [auth] read_routes = "token"',
                },
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a tenant's API key ([tenants.NAME] api_keys_file): "
                    "queries, run as that tenant within the key's limits",
                },
            },
            "schemas": {
                "Error": _ERROR,
                "Probe": _PROBE,
                **{body.name: body.schema() for body in REQUEST_BODIES},
                "TaskOutcome": _TASK,
                "QueryAnswer": _ANSWER,
                "StageAnswer": _STAGE_ANSWER,
                "RequestAnswer": _REQUEST_ANSWER,
                "Server": _SERVER,
            },
        },
    }
    _complete(doc["paths"])
    return doc
