"""Access control, the pure parts: which route needs what, whose credential it is, and each
API key's limits (refused requests are counted in `gateway.refusals`).

Every route has an `Access` class, from `ROUTE_ACCESS` or, for a route not listed there,
from its method: GET and HEAD are READ, every other method is ADMIN. So a route added
without a thought is closed to all but admin tokens, never open by mistake.

=========  ===========================================================  =====================
Access     routes                                                        credential
=========  ===========================================================  =====================
PUBLIC     /healthz, /livez, /readyz, /openapi.json, the dashboard's    none
           page and files (no data: the page reads READ routes)
READ       GET /v1/..., /metrics                                         none (read_routes =
                                                                         open) or admin, read
QUERY      POST /v1/queries, /v1/requests                                none (queries =
                                                                         open) or a tenant's
                                                                         API key, admin
REGISTER   POST /v1/servers, DELETE /v1/servers/{id} (drain)            registration token,
                                                                         admin
ADMIN      any other write route                                         admin
=========  ===========================================================  =====================

Write routes (REGISTER, ADMIN) are open only while neither a registration token nor an
admin token is configured, as the gateway was before admin tokens existed; ADMIN takes the
registration token while no admin token is set.

Credentials are compared as SHA-256 digests: the presented credential is hashed once (time
independent of any stored token), its digest picks the one candidate it could be, and
`hmac.compare_digest` confirms it (against a dummy digest when there is none, so both paths
do the same work). What a timing difference could reveal is then about digests of the
caller's own guesses, never about a stored token's bytes or length.

Nothing here reads a clock or a file: time comes in as `now`, file contents as text.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.config import (
    MAX_ROTATING_TOKENS,
    MAX_TENANT_KEYS,
    AuthConfig,
    GatewayConfig,
    TenantAccess,
)
from taskserver.registration import check_token

__all__ = [
    "ACCESS_STATUSES",
    "ROUTE_ACCESS",
    "Access",
    "Credentials",
    "Decision",
    "KeyLimiter",
    "Principal",
    "Role",
    "access_of",
    "bearer",
    "credentials_of",
    "decide",
    "is_loopback",
    "open_writes_warning",
    "parse_tokens",
    "source_of",
    "token_files",
]


class Access(enum.Enum):
    """What a route needs (see the module's table)."""

    PUBLIC = "public"
    READ = "read"
    QUERY = "query"
    REGISTER = "register"
    ADMIN = "admin"


ROUTE_ACCESS: dict[tuple[str, str], Access] = {
    ("GET", "/healthz"): Access.PUBLIC,
    ("GET", "/livez"): Access.PUBLIC,
    ("GET", "/readyz"): Access.PUBLIC,
    ("GET", "/openapi.json"): Access.PUBLIC,
    ("GET", "/dashboard"): Access.PUBLIC,
    ("GET", "/dashboard/{file}"): Access.PUBLIC,
    ("POST", "/v1/queries"): Access.QUERY,
    ("POST", "/v1/requests"): Access.QUERY,
    ("POST", "/v1/servers"): Access.REGISTER,
    ("DELETE", "/v1/servers/{id}"): Access.REGISTER,
}
"""Routes whose access is not their method's default (GET/HEAD: READ; others: ADMIN)."""

ACCESS_STATUSES: dict[Access, frozenset[int]] = {
    Access.PUBLIC: frozenset(),
    **{a: frozenset({401, 403, 429}) for a in Access if a is not Access.PUBLIC},
}
"""What the access check itself may answer on a route of each class: 401 (no or an unknown
credential), 403 (a credential without the right), 429 (a source slowed down after
failing, or a key over its limits)."""


def access_of(method: str, path: str) -> Access:
    """The access class of a route (method, its path as the router writes it)."""
    method = method.upper()
    if method == "HEAD":
        method = "GET"
    given = ROUTE_ACCESS.get((method, path))
    if given is not None:
        return given
    return Access.READ if method == "GET" else Access.ADMIN


# -- credentials -------------------------------------------------------------------------


class Role(enum.Enum):
    """What a credential is."""

    ADMIN = "admin"
    READ = "read"
    REGISTER = "register"
    TENANT = "tenant"


@dataclass(frozen=True, slots=True)
class Principal:
    """Whose credential a request carries (never the credential itself)."""

    role: Role
    tenant: str | None = None
    """The tenant of an API key."""
    digest: bytes = field(default=b"", repr=False)
    """The credential's SHA-256 digest: what per-key limits are kept by."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


_DUMMY = _digest("tailgate: no such credential")


def parse_tokens(text: str, limit: int) -> tuple[str, ...]:
    """The tokens of a token file: one per line, blank lines and `# ...` lines skipped;
    ValueError (naming the line, never quoting it) for a bad token, none or more than
    `limit`."""
    tokens: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            tokens.append(check_token(line))
        except ValueError as exc:
            raise ValueError(f"line {number}: {str(exc).removeprefix('token: ')}") from None
    if not tokens:
        raise ValueError("holds no token")
    if len(tokens) > limit:
        raise ValueError(f"holds {len(tokens)} tokens; at most {limit} may be valid at once")
    return tuple(tokens)


class Credentials:
    """Every credential the gateway knows, by the digest of its token."""

    def __init__(
        self,
        *,
        admin: Iterable[str] = (),
        read: Iterable[str] = (),
        register: str | None = None,
        tenants: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """ValueError if one token is given for two roles (not quoting it)."""
        self._by_digest: dict[bytes, Principal] = {}
        self.admin = self._add(admin, Role.ADMIN)
        self.read = self._add(read, Role.READ)
        self.register = self._add([] if register is None else [register], Role.REGISTER)
        self.keys = 0
        for tenant, keys in (tenants or {}).items():
            self.keys += self._add(keys, Role.TENANT, tenant)

    def _add(self, tokens: Iterable[str], role: Role, tenant: str | None = None) -> int:
        n = 0
        for token in tokens:
            d = _digest(token)
            principal = Principal(role, tenant, d)
            other = self._by_digest.get(d)
            if other is not None and other != principal:
                raise ValueError(f"one token is given for two roles: {_role(other)} and "
                                 f"{_role(principal)}")  # fmt: skip
            self._by_digest[d] = principal
            n += 1
        return n

    def __contains__(self, digest: object) -> bool:
        """Whether a credential of this digest is known (for state kept per key)."""
        return digest in self._by_digest

    def identify(self, credential: str) -> Principal | None:
        """The principal whose token this is, or None (see the module's note on timing)."""
        d = _digest(credential)
        candidate = self._by_digest.get(d)
        expected = _DUMMY if candidate is None else candidate.digest
        if hmac.compare_digest(d, expected) and candidate is not None:
            return candidate
        return None


def _role(p: Principal) -> str:
    return f"tenant {p.tenant}" if p.role is Role.TENANT else p.role.value


def credentials_of(
    config: GatewayConfig,
    files: Mapping[str, tuple[str, ...]],
) -> Credentials:
    """The credentials of a configuration, with what its token files hold now (`files`:
    path -> tokens; a file not in it counts as empty)."""
    auth = config.auth

    def given(inline: tuple[str, ...], path: str | None) -> tuple[str, ...]:
        return inline if path is None else files.get(path, ())

    return Credentials(
        admin=given(auth.admin_tokens, auth.admin_tokens_file),
        read=given(auth.read_tokens, auth.read_tokens_file),
        register=config.token,
        tenants={
            name: (*t.api_keys, *given((), t.api_keys_file)) for name, t in auth.tenants.items()
        },
    )


def token_files(auth: AuthConfig) -> dict[str, tuple[str, int]]:
    """The token files of [auth] and [tenants.*]: path -> (config key, most tokens)."""
    out: dict[str, tuple[str, int]] = {}
    if auth.admin_tokens_file is not None:
        out[auth.admin_tokens_file] = ("auth.admin_tokens_file", MAX_ROTATING_TOKENS)
    if auth.read_tokens_file is not None:
        out[auth.read_tokens_file] = ("auth.read_tokens_file", MAX_ROTATING_TOKENS)
    for name, t in auth.tenants.items():
        if t.api_keys_file is not None:
            limit = MAX_TENANT_KEYS - len(t.api_keys)
            out[t.api_keys_file] = (f"tenants.{name}.api_keys_file", limit)
    return out


# -- the decision ------------------------------------------------------------------------


def bearer(header: str | None) -> tuple[str | None, str | None]:
    """(the credential, None) of an `Authorization: Bearer <token>` header; (None, None)
    without the header; (None, problem) when it is there but not a Bearer token."""
    if header is None:
        return None, None
    scheme, _, credential = header.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None, "malformed credential: expected 'Bearer <token>'"
    return credential, None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the access check decided for one request."""

    status: int
    """200: go on; 401 or 403: refused."""
    principal: Principal | None = None
    """Whose credential it was (None: none, or not one the gateway knows)."""
    reason: str = ""
    """Why it was refused, as the answer says it (never the token)."""
    short: str = ""
    """The same in a few words, for the refusal log."""
    challenge: str = 'Bearer realm="tailgate"'
    """The WWW-Authenticate header of a refusal (RFC 6750 §3)."""

    @property
    def allowed(self) -> bool:
        """Whether the request goes on."""
        return self.status == 200


_ALLOWED = Decision(200)
_ROLES: dict[Access, frozenset[Role]] = {
    Access.READ: frozenset({Role.ADMIN, Role.READ}),
    Access.QUERY: frozenset({Role.ADMIN, Role.TENANT}),
    Access.REGISTER: frozenset({Role.ADMIN, Role.REGISTER}),
    Access.ADMIN: frozenset({Role.ADMIN}),
}
_NEEDS = {
    Access.READ: "an admin or read token",
    Access.QUERY: "a tenant's API key or an admin token",
    Access.REGISTER: "the registration token or an admin token",
    Access.ADMIN: "an admin token",
}


def decide(
    access: Access, header: str | None, credentials: Credentials, config: AuthConfig
) -> Decision:
    """Whether a request to a route of this access class may go on, given its
    Authorization header."""
    if access is Access.PUBLIC:
        return _ALLOWED
    if access is Access.READ and config.read_routes == "open":
        return _ALLOWED  # a stale credential on an open route does no harm
    credential, problem = bearer(header)
    principal = None if credential is None else credentials.identify(credential)
    writes_open = not (credentials.admin or credentials.register)
    if access is Access.QUERY and config.query_access == "open":
        # Open to all; a key still binds its tenant and limits, and a wrong one is refused
        # rather than silently run as the default tenant.
        if credential is not None and principal is None:
            return _unknown()
        return Decision(200, principal)
    if access in (Access.REGISTER, Access.ADMIN) and writes_open:
        return Decision(200, principal)
    roles = _ROLES[access]
    if access is Access.ADMIN and not credentials.admin:
        roles = roles | {Role.REGISTER}  # the one write credential configured
    if principal is not None and principal.role in roles:
        return Decision(200, principal)
    if principal is not None:
        return Decision(
            403,
            principal,
            f"this route needs {_NEEDS[access]}; the credential is {_role(principal)}'s",
            "403 " + _role(principal) + "'s credential",
            'Bearer realm="tailgate", error="insufficient_scope"',
        )
    if problem is not None:
        return _refused(problem, "401 malformed credential", "invalid_request")
    if credential is None:
        need = f"this route needs {_NEEDS[access]}: send 'Authorization: Bearer <token>'"
        return _refused(need, "401 no credential", None)
    return _unknown()


def _unknown() -> Decision:
    return _refused("unknown credential", "401 unknown credential", "invalid_token")


def _refused(reason: str, short: str, error: str | None) -> Decision:
    challenge = 'Bearer realm="tailgate"' + (f', error="{error}"' if error else "")
    return Decision(401, None, reason, short, challenge)


# -- where a request comes from and what the gateway says at start ------------------------


def source_of(remote: str | None) -> str:
    """The source refusals are counted by: the IPv4 address, the IPv6 /64 (one host owns a
    whole /64, so counting addresses would let it escape the count), else the text."""
    if not remote:
        return "unknown"
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote[:64]
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only ("" and 0.0.0.0 reach every
    interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_writes_warning(config: GatewayConfig) -> str | None:
    """The warning to log at start when write routes are open, else None."""
    if config.token is not None or config.auth.has_admin:
        return None
    where = f"{config.host or '0.0.0.0'}:{config.port}"
    if is_loopback(config.host):
        return (
            f"server registration is unauthenticated: any process on this machine can register, "
            f"remove or drain servers at {where} (configure a registration token)"
        )
    return (
        f"server registration is unauthenticated and {where} is not a loopback address: "
        f"ANYONE who can reach it can register, remove or drain servers; set "
        f"TAILGATE_AGENT_TOKEN (or a token file) and [auth] admin_tokens_file"
    )


# -- per-key limits ----------------------------------------------------------------------


class KeyLimiter:
    """One API key's limits: a token bucket of `rate_per_s` and `burst`, and at most
    `max_in_flight` queries at once (0: no such limit)."""

    def __init__(self, limits: TenantAccess, now: float) -> None:
        self.rate_per_s = limits.rate_per_s
        self.burst = float(limits.burst or max(1, math.ceil(limits.rate_per_s)))
        self.max_in_flight = limits.max_in_flight
        self.tokens = self.burst
        self.last = now
        self.in_flight = 0

    def admit(self, now: float) -> tuple[str, float] | None:
        """None, and the query counts as in flight; else (why, seconds until it may)."""
        if self.max_in_flight and self.in_flight >= self.max_in_flight:
            return f"at most {self.max_in_flight} queries of one key at once", 1.0
        if self.rate_per_s > 0:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate_per_s)
            self.last = now
            if self.tokens < 1.0:
                wait_s = (1.0 - self.tokens) / self.rate_per_s
                return f"at most {self.rate_per_s:g} queries per second of one key", wait_s
            self.tokens -= 1.0
        self.in_flight += 1
        return None

    def release(self) -> None:
        """A query admitted by `admit` was answered."""
        self.in_flight -= 1
