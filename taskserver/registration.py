"""Talking to the gateway's registration API with the standard library only.

A task server registers (POST /v1/servers) every interval, which doubles as its heartbeat,
and deregisters (DELETE) when it retires. The calls are rare and tiny, so they run through
urllib in a worker thread: edge agents on a Raspberry Pi then need no HTTP client library
in memory (aiohttp alone is about 10 MiB of resident memory).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import ssl
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from taskserver.tls import CLOSED_AT_HANDSHAKE, tls_problem

if TYPE_CHECKING:
    from taskserver.config import TaskServerConfig

__all__ = ["GatewayUnreachable", "auth_headers", "check_token", "gateway_call", "gateway_urls"]

MAX_TOKEN_LEN = 4096
_TOKEN_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_TOKEN_LEN}}}")


CLUSTER_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A cluster label: 1 to 64 letters, digits, dots, underscores or hyphens. One rule for the
gateway (registrations, targets, config) and the edge agents that carry the label."""


def check_cluster_name(name: object) -> str:
    """The name if it is a valid cluster label, else ValueError naming the value."""
    if not isinstance(name, str) or not CLUSTER_NAME_RE.fullmatch(name):
        raise ValueError(f"cluster: must be 1..64 characters of A-Z a-z 0-9 . _ -, got {name!r}")
    return name


def check_token(token: object) -> str:
    """The token if it can travel as a Bearer credential, else ValueError (not quoting it).

    Here, with the wire's other half, so the gateway, task servers and edge agents all
    hold tokens to one rule.
    """
    if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
        # The value is a secret: the message describes it without quoting it.
        raise ValueError(
            f"token: must be 1..{MAX_TOKEN_LEN} printable ASCII characters without spaces"
        )
    return token


class GatewayUnreachable(Exception):
    """The gateway did not answer (connection refused, timeout, bad URL, TLS refused)."""

    def __init__(self, message: str, *, tls: bool = False) -> None:
        super().__init__(message)
        self.tls = tls
        """A TLS handshake failed: a certificate was refused, by either side."""


def gateway_urls(spec: str | None) -> list[str]:
    """The gateways a server registers with: a URL, or several separated by commas.

    Several gateway replicas each need to know the server; behind one load-balanced
    address a registration would reach only one of them, so name each replica.
    """
    return [u.strip().rstrip("/") for u in (spec or "").split(",") if u.strip()]


def auth_headers(config: TaskServerConfig) -> dict[str, str]:
    """The registration credential, if this server has a token."""
    return {"Authorization": f"Bearer {config.token}"} if config.token else {}


def _call(
    method: str,
    url: str,
    body: Any,
    headers: dict[str, str],
    timeout_s: float,
    context: ssl.SSLContext | None,
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        # HTTPException: something answered, but not HTTP (e.g. a Thrift port)
        reason = getattr(exc, "reason", exc)
        problem = tls_problem(reason) if isinstance(reason, BaseException) else None
        if problem is not None:
            raise GatewayUnreachable(problem, tls=True) from exc
        if isinstance(exc, http.client.RemoteDisconnected) and url.lower().startswith("https:"):
            # Closed before any answer: over TLS, how a refused client certificate shows.
            raise GatewayUnreachable(CLOSED_AT_HANDSHAKE, tls=True) from exc
        raise GatewayUnreachable(str(reason) or repr(exc)) from exc


async def gateway_call(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 5.0,
    context: ssl.SSLContext | None = None,
) -> tuple[int, str]:
    """One HTTP call to the gateway: (status, body text); GatewayUnreachable if none came.
    An https URL is called with `context` (taskserver.tls; None: the system's defaults)."""
    return await asyncio.to_thread(_call, method, url, body, headers or {}, timeout_s, context)
