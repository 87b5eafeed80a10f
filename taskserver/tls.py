"""TLS on the Thrift links and the gateway's HTTP API: one ``[tls]`` table for every role.

Who verifies what::

    link (Thrift)      gateway = TLS client    checks the server's certificate against
                                               ca_file and the registered host (or
                                               server_name); shows its own cert_file
                       task server / agent     shows cert_file; with client_auth =
                       = TLS server            "required" refuses a gateway without a
                                               certificate from its ca_file (mutual TLS)
    registration       task server / agent     https gateway URL: checks the gateway's
    (HTTP)             = TLS client            certificate against ca_file; shows cert_file
                       gateway = TLS server    http_client_auth = "optional": asks for a
                                               certificate, and the routes that register
                                               or deregister a server need one from
                                               ca_file; "required": every client needs one

Each process holds one identity (a certificate good for both TLS server and client use)
and one set of trust anchors. Contexts are built from the files and rebuilt when they
change (`ReloadingContext`): a new connection takes the newest, an open one keeps its
session. A listener's context hands each handshake the newest one (`listening`), so a
renewed certificate is served without a restart.

Host names: the gateway dials the address a server registered (usually an IP address), and
Python checks an IP address against the certificate's IP subject alternative names; a
certificate that names hosts instead, or one shared by a fleet, is checked against
``server_name``.

Errors are `ConfigError` (taskserver.tomlconfig) naming the ``tls.*`` key, at start; a file
that changes into something unusable later keeps the previous context (one WARNING).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import re
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from taskserver.tomlconfig import ConfigError

__all__ = [
    "CLOSED_AT_HANDSHAKE",
    "HANDSHAKE_TIMEOUT_S",
    "ClientAuth",
    "ReloadingContext",
    "TlsConfig",
    "http_client_tls",
    "http_server_tls",
    "link_client_tls",
    "link_server_tls",
    "tls_argv",
    "tls_problem",
    "with_tls_options",
]

log = logging.getLogger(__name__)


class ClientAuth(enum.Enum):
    """What a TLS server asks of its clients' certificates."""

    NONE = "none"
    """Asks for none."""
    OPTIONAL = "optional"
    """Asks; one that is shown must be issued by the CA of ca_file."""
    REQUIRED = "required"
    """A client without a certificate from the CA of ca_file is refused at the handshake."""


HANDSHAKE_TIMEOUT_S = 10.0
"""A listener drops a connection whose TLS handshake has not finished by then (asyncio's
default is 60 s: a connection that never sends its ClientHello holds a descriptor)."""

_VERIFY = {
    ClientAuth.NONE: ssl.CERT_NONE,
    ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
    ClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The ``[tls]`` table: certificates of this process and the cluster's CA."""

    links: bool = False
    """The Thrift links over TLS: task servers and edge agents listen with TLS, the gateway
    dials with it (all of them must agree)."""
    http: bool = False
    """The gateway's HTTP API over TLS (https://); servers then register at an https URL."""
    cert_file: str | None = None
    """This process's certificate (PEM; its chain after it), shown to its peers."""
    key_file: str | None = None
    """The certificate's private key (PEM, unencrypted: readable by this process only)."""
    ca_file: str | None = None
    """Trust anchors that peers' certificates are checked against: the cluster's CA (PEM);
    None: the system's store (then mutual TLS is not possible)."""
    client_auth: ClientAuth = ClientAuth.NONE
    """Task servers and edge agents: "required" refuses a gateway without a certificate
    from ca_file on the Thrift port (mutual TLS); "optional" checks one that is shown."""
    http_client_auth: ClientAuth = ClientAuth.NONE
    """The gateway's HTTP API: "optional" asks clients for a certificate, and registering
    or deregistering a server needs one from ca_file (other routes do not); "required":
    every client needs one."""
    server_name: str | None = None
    """The name the gateway checks in every server's certificate; None: the host of the
    address the server registered (an IP address must then be an IP subject alt name)."""
    reload_check_s: float = 5.0
    """How often the certificate files are checked for a change (then reloaded)."""

    def __post_init__(self) -> None:
        for name in ("client_auth", "http_client_auth"):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, ClientAuth(value))
            except ValueError:
                raise ValueError(
                    f"{name}: must be one of none, optional, required, got {value!r}"
                ) from None
        for name in ("cert_file", "key_file", "ca_file", "server_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name}: must be a non-empty string, got {value!r}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file: give cert_file and key_file together")
        if (self.links or self.http) and self.cert_file is None:
            raise ValueError(
                "cert_file: TLS is on (links or http): every process needs its certificate "
                "(cert_file and key_file)"
            )
        if self.client_auth is not ClientAuth.NONE and not self.links:
            raise ValueError(
                f"client_auth: {self.client_auth.value!r} applies to TLS links: set links = true"
            )
        if self.http_client_auth is not ClientAuth.NONE and not self.http:
            raise ValueError(
                f"http_client_auth: {self.http_client_auth.value!r} applies to the HTTP API "
                "over TLS: set http = true"
            )
        for name in ("client_auth", "http_client_auth"):
            if getattr(self, name) is not ClientAuth.NONE and self.ca_file is None:
                raise ValueError(
                    f"{name}: checking peers' certificates needs ca_file (the cluster's CA)"
                )
        if not (math.isfinite(self.reload_check_s) and self.reload_check_s > 0):
            raise ValueError(f"reload_check_s: must be > 0, got {self.reload_check_s}")

    @property
    def files(self) -> tuple[str, ...]:
        """The files its contexts are built from."""
        return tuple(f for f in (self.cert_file, self.key_file, self.ca_file) if f is not None)


# -- contexts from files -------------------------------------------------------------------


def _load(action: Callable[[], object], key: str, what: str) -> None:
    """action(), its file errors as ConfigError naming the key."""
    try:
        action()
    except (OSError, ValueError) as exc:
        plain_os = isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError)
        reason = exc.strerror if plain_os and exc.strerror else str(exc)
        raise ConfigError(key, f"cannot load {what}: {reason}") from None


def _load_identity(ctx: ssl.SSLContext, config: TlsConfig) -> None:
    _load(
        lambda: ctx.load_cert_chain(config.cert_file, config.key_file),  # type: ignore[arg-type]
        "tls.cert_file",
        f"{config.cert_file!r} with key {config.key_file!r}",
    )


def server_context(config: TlsConfig, client_auth: ClientAuth) -> ssl.SSLContext:
    """A listener's context: shows cert_file; checks clients as `client_auth` says."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_identity(ctx, config)
    if client_auth is not ClientAuth.NONE:
        _load(
            lambda: ctx.load_verify_locations(cafile=config.ca_file),
            "tls.ca_file",
            repr(config.ca_file),
        )
        ctx.verify_mode = _VERIFY[client_auth]
    return ctx


def client_context(config: TlsConfig) -> ssl.SSLContext:
    """A dialer's context: checks the server against ca_file (else the system's store) and
    its name; shows cert_file when there is one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.ca_file is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load(
            lambda: ctx.load_verify_locations(cafile=config.ca_file),
            "tls.ca_file",
            repr(config.ca_file),
        )
    if config.cert_file is not None:
        _load_identity(ctx, config)
    return ctx


Stamp = tuple[tuple[int, int, int] | None, ...]


class ReloadingContext:
    """An `ssl.SSLContext` built from files, rebuilt when they change.

    `current()` is the context a new connection takes: at most every `check_every_s` it
    compares the files' (mtime, size, inode) with those the context was built from, and
    builds a new one when they differ. A change that does not load (a key written before
    its certificate) keeps the previous context and is logged once; the next change is
    tried again. The first build's errors are raised (ConfigError from the builders).
    """

    def __init__(
        self,
        build: Callable[[], ssl.SSLContext],
        files: Sequence[str],
        *,
        what: str = "TLS",
        check_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        stat: Callable[[str], os.stat_result] = os.stat,
    ) -> None:
        self._build = build
        self.files = tuple(files)
        self.what = what
        self.check_every_s = check_every_s
        self._clock = clock
        self._stat = stat
        self._stamp = self._stamps()
        self.context = build()
        self._checked_s = clock()
        self.reloads = 0
        """Contexts built after the first one."""
        self._listening: ssl.SSLContext | None = None

    def _stamps(self) -> Stamp:
        out: list[tuple[int, int, int] | None] = []
        for path in self.files:
            try:
                st = self._stat(path)
            except OSError:
                out.append(None)  # missing for now (being replaced): a change
            else:
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        """The newest context (rebuilt first if the files changed since the last build)."""
        now = self._clock()
        if now - self._checked_s < self.check_every_s:
            return self.context
        self._checked_s = now
        stamp = self._stamps()
        if stamp == self._stamp:
            return self.context
        self._stamp = stamp  # a broken change is reported once, and retried when it changes
        try:
            context = self._build()
        except Exception as exc:  # ConfigError, and whatever a half-written file raises
            log.warning(
                "%s: the certificate files changed but cannot be used (%s); "
                "new connections keep the previous certificate",
                self.what,
                exc,
            )
            return self.context
        self.context = context
        self.reloads += 1
        log.info("%s: certificate files reloaded (%s)", self.what, ", ".join(self.files))
        return context

    def listening(self) -> ssl.SSLContext:
        """The context to listen with: each handshake is handed the newest context (through
        the SNI callback, which runs for every ClientHello, with a server name or none)."""
        if self._listening is None:
            base = self._listening = self.context

            def newest(sslobj: Any, _name: str | None, _ctx: ssl.SSLContext) -> None:
                try:
                    context = self.current()
                except Exception:  # never fail a handshake over a reload check
                    log.exception("%s: checking the certificate files failed", self.what)
                    return
                if context is not sslobj.context:
                    sslobj.context = context

            base.sni_callback = newest
        return self._listening


def _reloading(
    config: TlsConfig, build: Callable[[], ssl.SSLContext], what: str
) -> ReloadingContext:
    return ReloadingContext(build, config.files, what=what, check_every_s=config.reload_check_s)


def link_server_tls(config: TlsConfig, what: str = "Thrift listener") -> ReloadingContext | None:
    """A task server's or edge agent's Thrift listener (None: TLS links are off)."""
    if not config.links:
        return None
    return _reloading(config, lambda: server_context(config, config.client_auth), what)


def link_client_tls(config: TlsConfig) -> ReloadingContext | None:
    """The gateway's links to servers (None: TLS links are off)."""
    if not config.links:
        return None
    return _reloading(config, lambda: client_context(config), "gateway links")


def http_server_tls(config: TlsConfig) -> ReloadingContext | None:
    """The gateway's HTTP listener (None: plain HTTP)."""
    if not config.http:
        return None
    return _reloading(config, lambda: server_context(config, config.http_client_auth), "HTTP API")


def http_client_tls(config: TlsConfig, urls: Sequence[str]) -> ReloadingContext | None:
    """A server's registration calls, if any of `urls` is https (None: all plain)."""
    if not any(u.lower().startswith("https://") for u in urls):
        return None
    return _reloading(config, lambda: client_context(config), "registration")


def tls_argv(config: TlsConfig) -> list[str]:
    """The ``tailgate taskserver`` / ``edge-agent run`` options that give a server this
    config's files, links and client_auth (a launcher's children: taskserver.spawn)."""
    if config.cert_file is None or config.key_file is None:
        return []
    argv = ["--tls-cert", config.cert_file, "--tls-key", config.key_file]
    if config.ca_file is not None:
        argv += ["--tls-ca", config.ca_file]
    if config.links:
        argv.append("--tls-links")
    if config.client_auth is not ClientAuth.NONE:
        argv += ["--tls-client-auth", config.client_auth.value]
    return argv


def with_tls_options(
    config: TlsConfig,
    *,
    cert: str | None = None,
    key: str | None = None,
    ca: str | None = None,
    links: bool | None = None,
    client_auth: str | None = None,
) -> TlsConfig:
    """`config` with the command line's --tls-* options on top (None: not given);
    ValueError naming the option when the result is not a valid config."""
    changes: dict[str, Any] = {}
    for name, value in (
        ("cert_file", cert),
        ("key_file", key),
        ("ca_file", ca),
        ("links", links),
        ("client_auth", client_auth),
    ):
        if value is not None:
            changes[name] = value
    if not changes:
        return config
    try:
        return replace(config, **changes)
    except ValueError as exc:
        name, _, message = str(exc).partition(": ")
        message = message.replace("links = true", "--tls-links")
        for key in ("cert_file", "key_file", "ca_file", "client_auth"):
            message = re.sub(rf"\b{key}\b", _OPTION_OF[key], message)
        raise ValueError(f"{_OPTION_OF.get(name, name)}: {message or exc}") from None


_OPTION_OF = {
    "cert_file": "--tls-cert",
    "key_file": "--tls-key",
    "ca_file": "--tls-ca",
    "links": "--tls-links",
    "client_auth": "--tls-client-auth",
}


# -- what went wrong -----------------------------------------------------------------------

CLOSED_AT_HANDSHAKE = (
    "TLS: the peer closed the connection at the handshake: if it asks for a client "
    "certificate, this process's tls.cert_file must be issued by the CA in the peer's "
    "tls.ca_file"
)
"""A TLS 1.3 server checks a client's certificate after the client's side of the handshake
is done, and refuses it by closing: the client sees the end of the stream, not a reason."""


def tls_problem(exc: BaseException) -> str | None:
    """What a TLS failure means for the people who read the log, or None if `exc` is none."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or str(exc)
        if exc.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
            hint = "the certificate must name that host or IP address (or set tls.server_name)"
        else:
            hint = "is it issued by the CA in tls.ca_file?"
        return f"TLS: the peer's certificate is refused: {reason} ({hint})"
    if isinstance(exc, ssl.SSLEOFError):
        return CLOSED_AT_HANDSHAKE
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "").lower()
        if any(k in reason for k in ("unknown_ca", "certificate_required", "bad_certificate")):
            return (
                f"TLS: the peer refuses this process's certificate ({reason.replace('_', ' ')}): "
                "tls.cert_file must be issued by the CA in the peer's tls.ca_file"
            )
        if "wrong_version_number" in reason or "record_layer_failure" in reason:
            return f"TLS: the peer does not speak TLS on this port ({reason.replace('_', ' ')})"
        return f"TLS: {exc}"
    return None
