"""Registration needs a client certificate: the HTTP half of mutual TLS (taskserver.tls).

With ``[tls] http_client_auth = "optional"`` the gateway's listener asks every client for a
certificate and the TLS handshake refuses one the cluster's CA did not issue; this
middleware then refuses a request without any to a route that registers or deregisters a
server (`auth.Access.REGISTER`), so only servers holding a certificate from the CA can join
a pool, while people and dashboards without one still query and read. It runs after the
access check (gateway.guard): the credential is checked first, the certificate second.
With ``"required"`` every client has one by the time a request is read: nothing is left
to check here.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.auth import Access, access_of
from gateway.errors import Forbidden
from taskserver.tls import ClientAuth, TlsConfig

__all__ = ["client_cert_middlewares", "peer_certificate"]


def peer_certificate(request: web.Request) -> dict[str, Any] | None:
    """The client's certificate as the handshake checked it (None: none was shown, or the
    connection is not TLS)."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    return cert or None


def client_cert_middlewares(tls: TlsConfig) -> list[Any]:
    """The middleware that asks registration for a certificate, when the config needs it."""
    if not (tls.http and tls.http_client_auth is ClientAuth.OPTIONAL):
        return []

    @web.middleware
    async def registration_needs_certificate(
        request: web.Request, handler: Any
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and access_of(request.method, resource.canonical) is (
            Access.REGISTER
        ):
            if peer_certificate(request) is None:
                raise Forbidden(
                    "registering or deregistering a server needs a TLS client certificate "
                    "issued by the cluster's CA (the gateway's tls.ca_file); none was shown: "
                    "give the server tls.cert_file and tls.key_file",
                    code="client_certificate_required",
                )
        return await handler(request)

    return [registration_needs_certificate]
