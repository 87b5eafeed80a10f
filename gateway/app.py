"""The gateway's HTTP API (aiohttp): a thin shell over GatewayService."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway import dashboard
from gateway.access_log import access_log_options
from gateway.client_certs import client_cert_middlewares
from gateway.connections import app_runner
from gateway.errors import (
    ApiError,
    BadRequest,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from gateway.guard import Guard, bind_tenant
from gateway.limits import LIMITS_KEY, ClientLimits, read_body
from gateway.openapi import openapi_document
from gateway.queries import QueryOutcome
from gateway.request_ids import caller_of, stamp_response
from gateway.request_path import RequestPath
from gateway.requests import parse_multi_query, parse_query, parse_register
from gateway.retry_after import delta_seconds
from gateway.server_listing import ServerQuery, encode_listing, list_servers_spread
from gateway.service import GatewayService
from taskserver import jsonbody
from taskserver.tls import http_server_tls

log = logging.getLogger(__name__)

SERVICE_KEY: web.AppKey[GatewayService] = web.AppKey("service", GatewayService)
SERVER_HEADER = "tailgate"
"""The Server header of every answer."""
REQUESTS_KEY: web.AppKey[RequestPath] = web.AppKey("requests", RequestPath)
GUARD_KEY: web.AppKey[Guard] = web.AppKey("guard", Guard)


QUERY_STATUS = {
    QueryOutcome.MET: 200,
    QueryOutcome.MISSED_SLO: 200,
    QueryOutcome.DROPPED: 503,
    QueryOutcome.DRAINING: 503,
    QueryOutcome.REJECTED: 503,
    QueryOutcome.TIMEOUT: 504,
    QueryOutcome.FAILED: 502,
    QueryOutcome.INVALID: 400,
}
"""The HTTP status of each way a query ends."""
assert set(QUERY_STATUS) == set(QueryOutcome)


def retry_after_s(exc: ApiError | None, configured_s: int) -> int:
    """Retry-After seconds for a 503: the error's own estimate when it has one (its
    `retry_after_s`: the admission window's, the predictive rule's, the servers' or the
    drain's, gateway.retry_after), else the configured seconds."""
    estimate = None if exc is None else exc.extra.get("retry_after_s")
    if isinstance(estimate, bool) or not isinstance(estimate, int | float):
        estimate = None
    # HTTP delta-seconds (RFC 9110 §10.2.3) are whole; at least 1, so no retry at once.
    return delta_seconds(estimate, configured_s)


def _retry_after(request: web.Request, exc: ApiError | None = None) -> dict[str, str]:
    """The Retry-After header of a 503."""
    configured_s = request.app[SERVICE_KEY].config.retry_after_s
    return {"Retry-After": str(retry_after_s(exc, configured_s))}


def _error_response(exc: ApiError, request: web.Request | None = None) -> web.Response:
    headers = dict(exc.headers)
    if exc.status == 503 and request is not None and SERVICE_KEY in request.app:
        headers = {**_retry_after(request, exc), **headers}  # every 503 says when to try again
    return web.json_response(exc.body(), status=exc.status, headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error leaves as JSON naming the problem (`field` null when no field is at
    fault); nothing crashes the gateway."""
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc, request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _error_response(PayloadTooLarge(exc.text or "request body too large", field=""))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        body = {"error": {"code": code, "message": exc.reason, "field": None}}
        headers = {}
        if isinstance(exc, web.HTTPMethodNotAllowed):
            # RFC 9110 §15.5.6: a 405 lists the methods the resource takes.
            headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return web.json_response(body, status=exc.status, headers=headers)
    except Exception:  # a bug: answered as JSON too, and logged with its traceback
        log.exception("internal error on %s %s", request.method, request.path)
        return _error_response(ApiError("internal error; see the gateway's log"))


@web.middleware
async def _close_when_draining(request: web.Request, handler: Any) -> web.StreamResponse:
    """While draining, answer with `Connection: close`: clients reconnect, through the load
    balancer, to another replica."""
    response = await handler(request)
    if request.app[SERVICE_KEY].draining:
        response.force_close()
    return response


JSON_MEDIA_TYPE = "application/json"
"""What a request body must be; a charset parameter, if any, must be utf-8 (RFC 8259 §8.1)."""


def check_media_type(content_type: str | None) -> None:
    """UnsupportedMediaType (415) unless a request body's Content-Type is JSON.

    `application/json`, with any parameters but a charset other than utf-8, is JSON. A
    body without Content-Type is taken as JSON too: RFC 9110 §8.3 lets a recipient examine
    the data then, and the body is parsed as JSON (400 if it is not). A form (what
    `curl -d` sends), text or anything else named is refused, naming what was sent.
    """
    if content_type is None:
        return
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media != JSON_MEDIA_TYPE:
        shown = media or "(empty)"
        raise UnsupportedMediaType(
            f"Content-Type {shown[:100]!r} is not supported: send the body as "
            f"{JSON_MEDIA_TYPE} (curl: -H 'Content-Type: {JSON_MEDIA_TYPE}', or --json)",
            field="Content-Type",
            headers={"Accept-Post": JSON_MEDIA_TYPE},
        )
    for param in params.split(";"):
        name, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(
                f"charset {charset[:40]!r} is not supported: JSON is UTF-8 (RFC 8259)",
                field="Content-Type",
                headers={"Accept-Post": JSON_MEDIA_TYPE},
            )


async def _json_body(request: web.Request) -> Any:
    raw = await read_body(request)  # 408 past body_timeout_s
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object", field="")
    check_media_type(request.headers.get("Content-Type"))
    try:
        return jsonbody.loads(raw)
    except jsonbody.JsonError as exc:
        raise BadRequest(f"malformed JSON: {exc}", field="") from exc


async def post_query(request: web.Request) -> web.Response:
    """POST /v1/queries: fan a query out and answer with every task's outcome."""
    service = request.app[SERVICE_KEY]
    t0 = service.clock()
    caller = caller_of(request)
    body = bind_tenant(request, await _json_body(request))
    req = parse_query(body, service.config)
    answer = await service.run_query(req, t0, caller=caller)
    status = QUERY_STATUS[answer.outcome]
    headers = _retry_after(request) if answer.outcome.may_retry else None
    # Rendered once, task results embedded as their servers wrote them (gateway.queries).
    return web.Response(
        body=answer.render(request_id=caller.request_id),
        status=status,
        headers=headers,
        content_type="application/json",
        charset="utf-8",
    )


async def post_request(request: web.Request) -> web.Response:
    """POST /v1/requests: run M queries one after another under one SLO (TailGuard eq. (5)).

    Each stage is a query of its own, admitted, answered and counted as one; its status is
    the request's when it ends the request (QUERY_STATUS), and every answer lists the stages
    run so far.
    """
    service = request.app[SERVICE_KEY]
    t0 = service.clock()
    body = bind_tenant(request, await _json_body(request))
    req = parse_multi_query(body, service.config)
    answer = await request.app[REQUESTS_KEY].run(req, t0, caller=caller_of(request))
    headers = _retry_after(request) if answer.outcome.may_retry else None
    return web.json_response(answer.body, status=QUERY_STATUS[answer.outcome], headers=headers)


async def get_servers(request: web.Request) -> web.Response:
    """GET /v1/servers: filtered by pool, cluster and state, paged (gateway.server_listing)."""
    service = request.app[SERVICE_KEY]
    q = ServerQuery.parse(request.query)
    body = await list_servers_spread(service.links.values(), q, service.server_view)
    return web.Response(body=encode_listing(body), content_type="application/json", charset="utf-8")


async def get_groups(request: web.Request) -> web.Response:
    """GET /v1/groups."""
    return web.json_response({"groups": request.app[SERVICE_KEY].groups_view()})


async def get_tenants(request: web.Request) -> web.Response:
    """GET /v1/tenants."""
    return web.json_response(request.app[SERVICE_KEY].tenants_view())


async def post_server(request: web.Request) -> web.Response:
    """POST /v1/servers: register (or refresh) a task server."""
    service = request.app[SERVICE_KEY]
    req = parse_register(await _json_body(request), service.config)
    created, view = await service.register(req)
    return web.json_response(view, status=201 if created else 200)


async def delete_server(request: web.Request) -> web.Response:
    """DELETE /v1/servers/{id}."""
    service = request.app[SERVICE_KEY]
    server_id = request.match_info["id"]
    if server_id not in service.links:
        raise NotFound(f"no server {server_id!r}", field="id")
    raw = request.query.get("drain_s", "0")
    try:
        drain_s = float(raw)
    except ValueError:
        drain_s = -1.0
    if not 0 <= drain_s <= 600:
        raise BadRequest(f"must be a number of seconds in 0..600, got {raw!r}", field="drain_s")
    return web.json_response(await service.deregister(server_id, drain_s))


async def get_classes(request: web.Request) -> web.Response:
    """GET /v1/classes."""
    service = request.app[SERVICE_KEY]
    classes = [
        {
            "name": c.name,
            "percentile": c.percentile,
            "latency_ms": c.latency_ms,
            "priority": c.priority,
        }
        for c in service.config.classes
    ]
    return web.json_response({"classes": classes})


MONOTONIC_KEYS = frozenset(
    {
        "now",
        "time",
        "time_s",
        "last_time",
        "overloaded_since",
        "last_scale_s",
        "last_up_s",
        "last_change_s",
    }
)
"""Keys of the policy snapshots that hold the service clock's (monotonic) seconds."""
COUNT_TABLES = frozenset({"replicas"})
"""Tables whose `now` is a count, not a time."""


def wall_clock(obj: Any, offset_s: float) -> Any:
    """The snapshot with every monotonic time (MONOTONIC_KEYS) turned into unix seconds
    (monotonic + offset_s), the monotonic value kept beside it as `<key>_monotonic_s`: API
    answers speak wall-clock time; the policies keep their injected clock."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if key in MONOTONIC_KEYS and isinstance(value, int | float) and math.isfinite(value):
                out[key] = round(value + offset_s, 3)
                out[f"{key}_monotonic_s"] = value
            elif key in COUNT_TABLES:
                out[key] = value
            else:
                out[key] = wall_clock(value, offset_s)
        return out
    if isinstance(obj, list):
        return [wall_clock(v, offset_s) for v in obj]
    return obj


def _wall_offset(service: GatewayService) -> float:
    """Unix seconds minus the service clock's seconds, now."""
    return time.time() - service.clock()


async def get_admission(request: web.Request) -> web.Response:
    """GET /v1/admission: window, thresholds, counters and recent decisions."""
    service = request.app[SERVICE_KEY]
    return web.json_response(wall_clock(service.gate.snapshot(), _wall_offset(service)))


async def get_autoscaler(request: web.Request) -> web.Response:
    """GET /v1/autoscaler: policy, thresholds, replicas and recent actions."""
    service = request.app[SERVICE_KEY]
    if service.autoscaler is not None:
        return web.json_response(wall_clock(service.autoscaler.snapshot(), _wall_offset(service)))
    c = service.config.autoscaling
    return web.json_response(
        {
            "enabled": False,
            "policy": c.policy,
            "pool": c.pool,
            "thresholds": {"upper": c.upper, "lower": c.lower},
            "replicas": {"min": c.min_replicas, "max": c.max_replicas},
            "actions": [],
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the gateway is serving; says how many servers are up."""
    service = request.app[SERVICE_KEY]
    up = sum(1 for lk in service.links.values() if lk.is_up)
    return web.json_response({"status": "ok", "servers_up": up, "servers": len(service.links)})


async def livez(request: web.Request) -> web.Response:
    """GET /livez: the process serves HTTP (also while draining)."""
    service = request.app[SERVICE_KEY]
    status = "draining" if service.draining else "ok"
    return web.json_response({"status": status, "gateway_id": service.instance_id})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 200 while the gateway admits queries, 503 while starting or draining.

    Live servers are not required: they register after the gateway is up, and a query with
    none gets its own 503.
    """
    service = request.app[SERVICE_KEY]
    up = sum(1 for lk in service.links.values() if lk.is_up)
    ready = service.started and not service.draining
    status = "ready" if ready else "draining" if service.draining else "starting"
    body = {
        "status": status,
        "gateway_id": service.instance_id,
        "servers_up": up,
        "servers": len(service.links),
    }
    if ready:
        return web.json_response(body)
    return web.json_response(body, status=503, headers=_retry_after(request))  # every 503


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics in the Prometheus text format."""
    service = request.app[SERVICE_KEY]
    return web.Response(
        body=await service.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def openapi(request: web.Request) -> web.Response:
    """GET /openapi.json."""
    return web.json_response(openapi_document())


ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/queries", post_query),
    ("POST", "/v1/requests", post_request),
    ("GET", "/v1/servers", get_servers),
    ("POST", "/v1/servers", post_server),
    ("DELETE", "/v1/servers/{id}", delete_server),
    ("GET", "/v1/groups", get_groups),
    ("GET", "/v1/tenants", get_tenants),
    ("GET", "/v1/classes", get_classes),
    ("GET", "/v1/admission", get_admission),
    ("GET", "/v1/autoscaler", get_autoscaler),
    ("GET", "/healthz", healthz),
    ("GET", "/livez", livez),
    ("GET", "/readyz", readyz),
    ("GET", "/metrics", metrics),
    ("GET", "/openapi.json", openapi),
    *dashboard.routes(lambda request: request.app[SERVICE_KEY]),
]


def create_app(service: GatewayService) -> web.Application:
    """The aiohttp application; starts and stops the service with the app.

    Every route passes the access check (gateway.guard; what each needs: gateway.auth)
    before its handler runs, so nothing of a refused request is read or revealed.
    """
    guard = Guard(service.config, service.clock, service.registry)
    limits = ClientLimits(service.config, service.registry)
    app = web.Application(
        middlewares=[
            _close_when_draining,
            _errors,
            guard.middleware,
            *client_cert_middlewares(service.config.tls),
            limits.middleware,  # after the access check: only admitted requests count
        ],
        client_max_size=service.config.max_body_bytes,
    )
    app[SERVICE_KEY] = service
    app[GUARD_KEY] = guard
    app[LIMITS_KEY] = limits
    app[REQUESTS_KEY] = RequestPath(
        service, f"req-{uuid.uuid4().hex[:8]}", tracer=service.query.tracer
    )
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)

    async def server_header(_: web.Request, response: web.StreamResponse) -> None:
        # No library or interpreter versions on the wire (aiohttp's default names both).
        response.headers["Server"] = SERVER_HEADER

    app.on_response_prepare.append(server_header)
    # X-Request-Id and traceparent on every answer, errors included (gateway.request_ids).
    app.on_response_prepare.append(stamp_response)

    async def lifecycle(_: web.Application) -> Any:
        await service.start()
        await guard.start()
        yield
        await guard.stop()
        await service.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


async def serve(
    service: GatewayService,
    ready: Callable[[str], None] | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the API on the configured host and port until `stop` is set, or cancelled.

    Setting `stop` (SIGTERM, SIGINT in the CLI) drains: /readyz turns 503, new queries get
    503 `draining`, the queries in flight are answered (service.drain), and only then does
    the listener close; /metrics and the other read-only endpoints serve throughout.
    """
    config = service.config
    stop = asyncio.Event() if stop is None else stop
    tls = http_server_tls(config.tls)  # certificates load before anything listens
    # Handlers still running after the drain are registration calls: a short wait is plenty.
    runner = app_runner(  # header deadline and connection limit (gateway.connections)
        create_app(service),
        config,
        service.registry,
        **access_log_options(config.access_log),
        shutdown_timeout=5.0,
    )
    await runner.setup()
    try:
        ssl_context = None if tls is None else tls.listening()
        site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context)
        await site.start()
        port = runner.addresses[0][1]  # the real one when port 0 asked for any
        url = f"{'http' if tls is None else 'https'}://{config.host}:{port}"
        log.info("gateway listening on %s", url)
        if config.autoscaling.enabled:
            await service.enable_autoscaler(url, [])
        if ready is not None:
            ready(json.dumps({"url": url}))
        await stop.wait()
        report = await service.drain()
        log.info(
            "gateway drained %d queries in %.2f s%s",
            report.queries,
            report.seconds,
            f" ({report.cut} cut at the drain bound)" if report.cut else "",
        )
    finally:
        await runner.cleanup()
