"""The built-in dashboard: a page, its script and style, and the JSON it polls.

``GET /dashboard`` serves ``static/dashboard.html``; its script draws uPlot charts (the
library is vendored under ``static/vendor/uplot/`` and served from here: no CDN) from
``GET /v1/history`` (the stored samples, gateway.history), ``GET /v1/dashboard`` (what only
the present shows: servers and their state, each server's post-queuing CDF, thresholds,
SLOs and the autoscaler's recent actions) and, with autoscaling on, ``GET /v1/autoscaler``.
Every poll reads figures the gateway already keeps; nothing is computed per poll beyond
the snapshot below.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.errors import BadRequest, NotFound

if TYPE_CHECKING:
    from gateway.view import GatewayView

ServiceOf = Callable[[web.Request], "GatewayView"]

STATIC_FILES = {
    "dashboard.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    # uPlot 1.6.32, vendored unchanged (static/vendor/uplot/README.md).
    "vendor/uplot/uPlot.iife.min.js": "text/javascript",
    "vendor/uplot/uPlot.min.css": "text/css",
    "vendor/uplot/LICENSE": "text/plain",
}
"""The files under gateway/static/ the gateway serves (paths relative to it), with their
media types; nothing else under /dashboard/ is served."""
CDF_CURVES = 24
"""Most CDF curves the live snapshot carries (servers sharing a CDF share a curve)."""
CDF_LEVELS = (*(i / 50 for i in range(1, 50)), 0.99, 0.995, 0.999)
"""F levels at which each curve is given."""
SERVER_ROWS = 200
"""Most servers the live snapshot lists."""
WALK_SLICE = 1000
"""Servers the snapshot walks before it lets the event loop run."""


@functools.cache
def static_file(name: str) -> bytes:
    """The bytes of one packaged static file (read once)."""
    return resources.files("gateway").joinpath("static", *name.split("/")).read_bytes()


def since_param(raw: str | None, default_s: float) -> float:
    """The since_s query parameter in seconds, or BadRequest naming it."""
    if raw is None:
        return default_s
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadRequest(f"must be a number of seconds > 0, got {raw!r}", field="since_s")
    return value


async def live_snapshot(service: GatewayView, wall: float) -> dict[str, Any]:
    """Everything the dashboard shows that the history does not keep.

    Its walk over every server (which CDF each one shares) goes a slice at a time with the
    event loop run between slices: at 10,000 servers the snapshot held the loop ~40 ms."""
    config = service.config
    now = service.clock()
    windows = service.server_windows
    windows.update(now)
    book = service.book
    links = sorted(service.links.values(), key=lambda lk: lk.server_id)
    servers = [
        {
            **service.server_view(lk),
            "miss_ratio": round(windows.server_ratio(lk.server_id, lk.pool, now), 6),
            # Since the server last sent anything: an edge agent's staleness.
            "silent_s": round(lk.silent_s, 3),
        }
        for lk in links[:SERVER_ROWS]
    ]
    # Servers that share a CDF (pool or cluster rows of the book) share one curve.
    curves: dict[int, dict[str, Any]] = {}
    for i, lk in enumerate(links):
        if i and not i % WALK_SLICE:
            await asyncio.sleep(0)
        if not book.has_server(lk.server_id):
            continue
        cdf = book.cdf_of(lk.server_id)
        curve = curves.get(id(cdf))
        if curve is None:
            if len(curves) >= CDF_CURVES:
                continue
            points = [[round(cdf.quantile(f), 4), f] for f in CDF_LEVELS]
            curve = curves[id(cdf)] = {"servers": [], "pool": lk.pool, "points": points}
        curve["servers"].append(lk.server_id)
    a, s = config.admission, config.autoscaling
    scaler = service.autoscaler
    actions = []
    if scaler is not None:
        for act in scaler.actions:
            # Actions carry the service clock; the page draws wall-clock time (`t`, unix
            # seconds), and the service clock's value is named for what it is.
            entry = {k: v for k, v in act.items() if k != "time_s"}
            entry["time_monotonic_s"] = act["time_s"]
            actions.append({**entry, "t": round(wall - (now - act["time_s"]), 3)})
    return {
        "now": round(wall, 3),
        "history": {
            "interval_s": config.history_interval_s,
            "retention_s": config.history_retention_s,
            "storage": service.history.where,
            "samples_written": service.history.samples_written,
            "last_error": service.history.last_error,
        },
        "heartbeat": {"interval_s": config.heartbeat_s, "timeout_s": config.heartbeat_timeout_s},
        "classes": [
            {"name": c.name, "percentile": c.percentile, "latency_ms": c.latency_ms}
            for c in config.classes
        ],
        "thresholds": {
            "admission": a.threshold if a.policy != "none" else None,
            "admission_release": (a.release_threshold or a.threshold)
            if a.policy != "none"
            else None,
            "autoscale_upper": s.upper,
            "autoscale_lower": s.lower,
        },
        "admission": {
            "rule": a.rule if a.policy != "none" else "none",
            "miss_ratio": round(service.gate.window.ratio(now), 6),
            "overloaded": service.gate.controller.overloaded,
        },
        "servers": servers,
        "servers_total": len(links),
        "cdfs": list(curves.values()),
        "autoscaler": {
            "enabled": scaler is not None,
            "policy": s.policy,
            "pool": s.pool,
            "replicas": scaler.replicas_now() if scaler is not None else None,
            "actions": actions,
        },
    }


def routes(service_of: ServiceOf) -> list[tuple[str, str, Any]]:
    """The dashboard's routes (method, path, handler); service_of finds the service."""

    async def page(request: web.Request) -> web.Response:
        """GET /dashboard."""
        return _static("dashboard.html")

    async def asset(request: web.Request) -> web.Response:
        """GET /dashboard/{file}: the page's script, style and the vendored chart library."""
        name = request.match_info["file"]
        if name not in STATIC_FILES or name == "dashboard.html":
            raise NotFound(f"no dashboard file {name!r}", field="file")
        return _static(name)

    async def dashboard(request: web.Request) -> web.Response:
        """GET /v1/dashboard: the live snapshot."""
        return web.json_response(await live_snapshot(service_of(request), time.time()))

    async def history(request: web.Request) -> web.Response:
        """GET /v1/history?since_s=3600: stored samples, oldest first."""
        service = service_of(request)
        since_s = since_param(request.query.get("since_s"), 3600.0)
        samples = await service.history.since(since_s)
        return web.json_response(
            {
                "now": round(time.time(), 3),
                "interval_s": service.config.history_interval_s,
                "retention_s": service.config.history_retention_s,
                "samples": samples,
            }
        )

    return [
        ("GET", "/dashboard", page),
        ("GET", "/dashboard/{file:.+}", asset),
        ("GET", "/v1/dashboard", dashboard),
        ("GET", "/v1/history", history),
    ]


def _static(name: str) -> web.Response:
    return web.Response(
        body=static_file(name),
        content_type=STATIC_FILES[name],
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )
