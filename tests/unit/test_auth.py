"""Access control's pure parts: routes' access classes, credentials and rotation, the
decision, refusals aggregated per source with a slowdown, per-key limits (no sockets)."""

from __future__ import annotations

import hmac
from typing import Any

import pytest

from gateway import auth
from gateway.auth import (
    Access,
    Credentials,
    KeyLimiter,
    Role,
    access_of,
    credentials_of,
    decide,
    is_loopback,
    open_writes_warning,
    parse_tokens,
    source_of,
)
from gateway.config import AuthConfig, GatewayConfig, TenantAccess
from gateway.refusals import MAX_REASONS, RefusalLog

ADMIN, ADMIN_NEXT, READ, REG, KEY = "adm-0123", "adm-4567", "rd-0123", "reg-0123", "key-acme-1"


def _auth(**kw: Any) -> AuthConfig:
    defaults: dict[str, Any] = {
        "admin_tokens": (ADMIN,),
        "read_tokens": (READ,),
        "tenants": {"acme": TenantAccess(api_keys=(KEY,))},
    }
    return AuthConfig(**{**defaults, **kw})


def _credentials(config: AuthConfig, register: str | None = REG) -> Credentials:
    return credentials_of(GatewayConfig(token=register, auth=config), {})


def _status(
    access: Access, header: str | None, config: AuthConfig, register: str | None = REG
) -> int:
    return decide(access, header, _credentials(config, register), config).status


def _bearer(token: str) -> str:
    return f"Bearer {token}"


# -- which route needs what ---------------------------------------------------------------


def test_routes_not_listed_are_read_when_get_and_admin_otherwise() -> None:
    assert access_of("GET", "/healthz") is Access.PUBLIC
    assert access_of("post", "/v1/queries") is Access.QUERY
    assert access_of("DELETE", "/v1/servers/{id}") is Access.REGISTER
    assert access_of("GET", "/v1/servers") is Access.READ
    assert access_of("HEAD", "/v1/servers") is Access.READ
    # A route added tomorrow is closed to all but admin tokens until someone says otherwise.
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert access_of(method, "/v1/admission/threshold") is Access.ADMIN
    assert access_of("GET", "/v1/anything-new") is Access.READ


# -- credentials, rotation and the constant-time compare ---------------------------------


def test_token_files_skip_comments_and_blank_lines_and_hold_at_most_the_limit() -> None:
    assert parse_tokens(f"# rotated 2024-05\n{ADMIN}\n\n  {ADMIN_NEXT}  \n", 2) == (
        ADMIN,
        ADMIN_NEXT,
    )
    with pytest.raises(ValueError, match="at most 2"):
        parse_tokens("a1\nb2\nc3\n", 2)
    with pytest.raises(ValueError, match="holds no token"):
        parse_tokens("# nothing yet\n\n", 2)
    with pytest.raises(ValueError) as err:
        parse_tokens("good-one\nhas a space\n", 2)
    assert "line 2" in str(err.value) and "has a space" not in str(err.value)


def test_rotation_two_valid_at_once_then_the_old_one_is_refused() -> None:
    config = GatewayConfig(auth=AuthConfig(admin_tokens_file="/etc/tailgate/admin.tokens"))
    path = "/etc/tailgate/admin.tokens"
    before = credentials_of(config, {path: (ADMIN,)})
    during = credentials_of(config, {path: (ADMIN, ADMIN_NEXT)})
    after = credentials_of(config, {path: (ADMIN_NEXT,)})
    assert before.identify(ADMIN) is not None and before.identify(ADMIN_NEXT) is None
    assert during.identify(ADMIN) is not None and during.identify(ADMIN_NEXT) is not None
    assert after.identify(ADMIN) is None
    principal = after.identify(ADMIN_NEXT)
    assert principal is not None and principal.role is Role.ADMIN


def test_credentials_are_compared_as_digests_with_compare_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    creds = _credentials(_auth())
    assert creds.identify(KEY) is not None
    assert creds.identify("k") is None  # a guess of another length
    assert creds.identify(KEY + "x" * 500) is None
    # Every attempt, right or wrong, does one compare of two 32-byte digests: neither the
    # stored token's length nor its bytes decide how long a refusal takes.
    assert calls == [(32, 32)] * 3


def test_one_token_cannot_hold_two_roles_and_the_message_does_not_quote_it() -> None:
    with pytest.raises(ValueError) as err:
        _credentials(_auth(), register=ADMIN)
    assert "admin and register" in str(err.value) and ADMIN not in str(err.value)
    tenants = {"a": TenantAccess(api_keys=(KEY,)), "b": TenantAccess(api_keys=(KEY,))}
    with pytest.raises(ValueError, match="tenant a and tenant b"):
        _credentials(_auth(tenants=tenants))


def test_a_principal_names_its_role_and_tenant_never_its_token() -> None:
    principal = _credentials(_auth()).identify(KEY)
    assert principal is not None and (principal.role, principal.tenant) == (Role.TENANT, "acme")
    assert KEY not in repr(principal)
    assert ADMIN not in repr(_auth()) and KEY not in repr(_auth())


# -- the decision -------------------------------------------------------------------------


def test_with_nothing_configured_everything_is_open_as_before() -> None:
    config = AuthConfig()
    for access in Access:
        assert _status(access, None, config, register=None) == 200


def test_a_registration_token_alone_guards_the_write_routes_and_nothing_else() -> None:
    config = AuthConfig()
    assert _status(Access.REGISTER, None, config) == 401
    assert _status(Access.REGISTER, _bearer(REG), config) == 200
    # The one write credential configured also guards admin routes, until admin tokens exist.
    assert _status(Access.ADMIN, None, config) == 401
    assert _status(Access.ADMIN, _bearer(REG), config) == 200
    assert _status(Access.READ, None, config) == 200
    assert _status(Access.QUERY, None, config) == 200


def test_each_credential_opens_its_routes_and_gets_403_elsewhere() -> None:
    config = _auth(read_routes="token")
    table = {
        ADMIN: {a: 200 for a in Access},
        READ: {Access.PUBLIC: 200, Access.READ: 200, Access.QUERY: 403, Access.REGISTER: 403,
               Access.ADMIN: 403},
        REG: {Access.PUBLIC: 200, Access.READ: 403, Access.QUERY: 403, Access.REGISTER: 200,
              Access.ADMIN: 403},
        KEY: {Access.PUBLIC: 200, Access.READ: 403, Access.QUERY: 200, Access.REGISTER: 403,
              Access.ADMIN: 403},
    }  # fmt: skip
    for token, expected in table.items():
        got = {a: _status(a, _bearer(token), config) for a in Access}
        assert got == expected, token
    for header in (None, _bearer("not-a-token"), "Basic abc", "Bearer"):
        got = {a: _status(a, header, config) for a in Access}
        assert got == {a: 200 if a is Access.PUBLIC else 401 for a in Access}, header


def test_401_and_403_carry_their_rfc_6750_challenges() -> None:
    config, creds = _auth(), _credentials(_auth())
    assert decide(Access.ADMIN, None, creds, config).challenge == 'Bearer realm="tailgate"'
    wrong = decide(Access.ADMIN, _bearer("nope"), creds, config)
    assert wrong.challenge.endswith('error="invalid_token"')
    assert decide(Access.ADMIN, "Basic x", creds, config).challenge.endswith(
        'error="invalid_request"'
    )
    scope = decide(Access.ADMIN, _bearer(KEY), creds, config)
    assert scope.status == 403 and scope.challenge.endswith('error="insufficient_scope"')
    assert "tenant acme" in scope.reason and KEY not in scope.reason


def test_queries_need_a_key_once_a_tenant_has_one_unless_said_open() -> None:
    assert _auth().query_access == "key"
    assert AuthConfig().query_access == "open"
    opened = _auth(queries="open")
    assert _status(Access.QUERY, None, opened) == 200
    # Open, but a key still binds its tenant, and a wrong key is not run as the default one.
    ok = decide(Access.QUERY, _bearer(KEY), _credentials(opened), opened)
    assert ok.status == 200 and ok.principal is not None and ok.principal.tenant == "acme"
    assert _status(Access.QUERY, _bearer("typo"), opened) == 401


def test_read_routes_follow_the_setting() -> None:
    assert _status(Access.READ, None, _auth()) == 200
    assert _status(Access.READ, _bearer("stale"), _auth()) == 200  # open: the header is moot
    assert _status(Access.READ, None, _auth(read_routes="token")) == 401


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"admin_tokens": ("a1", "a2", "a3")}, "admin_tokens: at most 2"),
        ({"admin_tokens": ("two words",)}, "admin_tokens[0]: must be 1..4096"),
        ({"admin_tokens": ("a1",), "admin_tokens_file": "f"}, "not both"),
        ({"read_routes": "token"}, "read_routes: 'token' needs"),
        ({"read_routes": "closed"}, "read_routes: must be 'open' or 'token'"),
        ({"queries": "key"}, "queries: 'key' needs"),
        ({"tenants": {"bad name": TenantAccess(api_keys=("k1",))}}, "tenant name"),
        ({"slowdown_after": 0}, "slowdown_after: must be >= 1"),
    ],
)
def test_bad_auth_settings_name_the_field_and_never_quote_a_token(
    kw: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError) as err:
        AuthConfig(**kw)
    assert words in str(err.value)
    assert "two words" not in str(err.value)


def test_a_tenant_needs_keys_and_sane_limits() -> None:
    with pytest.raises(ValueError, match="give api_keys or api_keys_file"):
        TenantAccess()
    with pytest.raises(ValueError, match="rate_per_s"):
        TenantAccess(api_keys=("k1",), rate_per_s=-1)


# -- where refusals come from and the start-up warning ------------------------------------


def test_sources_are_addresses_and_ipv6_slash_64s() -> None:
    assert source_of("10.1.2.3") == "10.1.2.3"
    assert source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9")
    assert source_of("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert source_of("::ffff:10.1.2.3") == "10.1.2.3"
    assert source_of(None) == "unknown"


def test_open_write_routes_are_warned_about_louder_beyond_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("10.0.0.1")
    local = open_writes_warning(GatewayConfig())
    assert local is not None and "registration is unauthenticated" in local
    exposed = open_writes_warning(GatewayConfig(host="0.0.0.0", port=8080))
    assert exposed is not None and "0.0.0.0:8080 is not a loopback address" in exposed
    assert open_writes_warning(GatewayConfig(host="0.0.0.0", token=REG)) is None
    assert open_writes_warning(GatewayConfig(host="0.0.0.0", auth=_auth())) is None


# -- the refusal log ----------------------------------------------------------------------


def test_a_flood_from_one_source_logs_one_line_per_interval_with_its_count() -> None:
    refusals = RefusalLog(interval_s=60.0, slowdown_after=10**9)
    lines: list[str] = []
    for i in range(31_176):  # the flood: 8 minutes of unauthenticated attempts
        now = i * (480.0 / 31_176)
        lines += refusals.refuse("10.0.0.9", "POST /v1/servers: 401 no credential", now).lines
        lines += refusals.flush(now)
    lines += refusals.flush(480.0)
    assert 8 <= len(lines) <= 9  # the first refusal, then one line a minute
    assert lines[0].startswith("refused POST /v1/servers: 401 no credential from 10.0.0.9")
    counted = sum(int(line.split()[1]) for line in lines[1:])
    assert counted == 31_176 - 1
    assert "x" in lines[1] and "in the last 60 s" in lines[1]


def test_a_quiet_source_is_forgotten_and_logged_at_once_when_it_fails_again() -> None:
    refusals = RefusalLog(interval_s=60.0)
    assert len(refusals.refuse("a", "r", 0.0).lines) == 1
    assert refusals.refuse("a", "r", 1.0).lines == ()
    assert refusals.flush(60.0) == ["refused 1 more requests from a in the last 60 s (r x1)"]
    assert refusals.flush(120.0) == [] and "a" not in refusals.sources
    assert len(refusals.refuse("a", "r", 121.0).lines) == 1


def test_a_source_that_keeps_failing_is_slowed_down_doubling_to_the_bound() -> None:
    refusals = RefusalLog(interval_s=3600.0, slowdown_after=3, slowdown_max_s=4.0)
    got = [refusals.refuse("s", "r", 0.0).retry_after_s for _ in range(4)]
    assert got == [None, None, None, 1]  # 3 failures: slowed for 1 s
    assert refusals.refuse("s", "r", 0.5).retry_after_s == 1
    # The penalty ends; three more failures double it, and so on up to slowdown_max_s.
    penalties = []
    now = 1.0
    for _ in range(4):
        for _ in range(3):
            assert refusals.refuse("s", "r", now).retry_after_s is None
        penalty = refusals.refuse("s", "r", now).retry_after_s
        penalties.append(penalty)
        now += penalty or 0
    assert penalties == [2, 4, 4, 4]


def test_the_source_table_is_bounded_and_the_rest_are_counted_together() -> None:
    refusals = RefusalLog(interval_s=10.0, max_sources=100)
    lines: list[str] = []
    for i in range(10_000):
        lines += refusals.refuse(f"10.0.{i // 250}.{i % 250}", "r", i / 1000).lines
    assert len(refusals.sources) == 100
    assert len(lines) == 101  # each tracked source once, and one line for the rest
    assert "more than 100 sources" in lines[-1]
    summary = refusals.flush(10.1)  # the others' window opened with the 101st source
    overflow = [line for line in summary if "beyond the 100" in line]
    assert overflow and overflow[0].startswith("refused 9899 more requests")


def test_reasons_per_source_are_bounded() -> None:
    refusals = RefusalLog(interval_s=10.0)
    for i in range(50):
        refusals.refuse("s", f"GET /v1/x{i}: 401 no credential", 0.0)
    (line,) = refusals.flush(10.0)
    assert "other x" in line and line.count(" x") <= MAX_REASONS + 1


# -- per-key limits -----------------------------------------------------------------------


def test_a_key_gets_its_rate_and_burst_then_waits_exactly() -> None:
    limiter = KeyLimiter(TenantAccess(api_keys=("k1",), rate_per_s=2.0, burst=3), now=0.0)
    for _ in range(3):
        assert limiter.admit(0.0) is None
        limiter.release()
    over = limiter.admit(0.0)
    assert over is not None and over[1] == pytest.approx(0.5)
    assert limiter.admit(0.5) is None


def test_a_key_gets_its_in_flight_limit() -> None:
    limiter = KeyLimiter(TenantAccess(api_keys=("k1",), max_in_flight=2), now=0.0)
    assert limiter.admit(0.0) is None and limiter.admit(0.0) is None
    over = limiter.admit(0.0)
    assert over is not None and "at most 2 queries" in over[0]
    limiter.release()
    assert limiter.admit(0.0) is None


def test_the_final_flush_logs_every_count_still_open() -> None:
    refusals = RefusalLog(interval_s=60.0)
    refusals.refuse("a", "r", 0.0)
    refusals.refuse("a", "r", 1.0)
    assert refusals.flush(2.0) == []
    assert refusals.flush(2.0, final=True) == [
        "refused 1 more requests from a in the last 2 s (r x1)"
    ]
