"""Access control on the HTTP API: the aiohttp shell over `gateway.auth`.

`Guard.middleware` classifies each request by its route (`auth.access_of`), decides on its
`Authorization: Bearer` credential (`auth.decide`), and answers a refusal as 401 or 403
(JSON naming the field `Authorization`, with `WWW-Authenticate`), or as 429 with
Retry-After once the source keeps failing. A query with a tenant's API key runs as that
tenant, within the key's rate and in-flight limits.

Refusals are logged by `refusals.RefusalLog`: a line for the first one of a quiet source, then
one line per source and interval with a count; a token never reaches the log. The token and
key files are re-read every `reload_interval_s` and on SIGHUP: a change takes effect
without a restart; a file that cannot be used keeps the tokens it held before (a WARNING
says so once), so a half-written file never locks everyone out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gateway.auth import (
    Access,
    Credentials,
    KeyLimiter,
    Principal,
    Role,
    access_of,
    credentials_of,
    decide,
    parse_tokens,
    source_of,
    token_files,
)
from gateway.config import GatewayConfig
from gateway.errors import Forbidden, TooManyRequests, Unauthorized
from gateway.refusals import RefusalLog

__all__ = ["PRINCIPAL_KEY", "Guard", "bind_tenant", "read_token_file"]

log = logging.getLogger(__name__)

PRINCIPAL_KEY: Any = (
    web.RequestKey("principal", Principal) if hasattr(web, "RequestKey") else "tailgate.principal"
)
"""The request's `auth.Principal`, when a tenant's API key identified it (a query); a typed
request key where aiohttp has them (3.14), which warns of plain string keys."""


def read_token_file(path: str, limit: int) -> tuple[str, ...]:
    """The tokens of a token file; ValueError saying what is wrong (never quoting a token)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"cannot read {path!r}: {reason}") from None
    try:
        return parse_tokens(text, limit)
    except ValueError as exc:
        raise ValueError(f"{path!r} {exc}") from None


def bind_tenant(request: web.Request, body: Any) -> Any:
    """The query body as the request's API key may send it: its tenant is the key's (403 if
    the body names another)."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is None or not isinstance(body, dict):
        return body
    named = body.get("tenant", principal.tenant)
    if named != principal.tenant:
        raise Forbidden(
            f"this API key is tenant {principal.tenant!r}'s; it cannot query as {named!r:.80}",
            field="tenant",
        )
    return {**body, "tenant": principal.tenant}


class Guard:
    """The gateway's access control: credentials, their files, refusals and key limits."""

    def __init__(
        self,
        config: GatewayConfig,
        clock: Callable[[], float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        """ValueError if a token file cannot be used at start (deploy.config checks first)."""
        self.config = config
        self.auth = config.auth
        self.clock = clock
        self.files = token_files(config.auth)
        self._tokens: dict[str, tuple[str, ...]] = {}
        for path, (key, limit) in self.files.items():
            try:
                self._tokens[path] = read_token_file(path, limit)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        self.credentials: Credentials = credentials_of(config, self._tokens)
        self._problems: dict[str, str] = {}
        self.refusals = RefusalLog(
            self.auth.refusal_interval_s,
            self.auth.refusal_sources,
            self.auth.slowdown_after,
            self.auth.slowdown_max_s,
        )
        self.limiters: dict[bytes, KeyLimiter] = {}
        self.refused = Counter(
            "tailgate_auth_refused",
            "Requests refused by access control, by answer (401, 403, 429 slowed down)",
            ["status"],
            registry=registry,
        )
        self.limited = Counter(
            "tailgate_auth_key_limited",
            "Queries refused (429) because their API key was over its limits, by tenant",
            ["tenant"],
            registry=registry,
        )
        self._task: asyncio.Task[None] | None = None
        self._sighup = False

    # -- the middleware -------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Refuse what the request's credential does not allow; run the rest."""
        info = request.match_info
        resource = info.route.resource
        if resource is None or info.http_exception is not None:
            return await handler(request)  # no route: 404 or 405, as before
        path = resource.canonical
        access = access_of(request.method, path)
        decision = decide(access, request.headers.get("Authorization"), self.credentials, self.auth)
        if not decision.allowed:
            self._refuse(request, path, decision.status, decision.short, decision.reason,
                         decision.challenge)  # fmt: skip
        principal = decision.principal
        if access is not Access.QUERY or principal is None or principal.role is not Role.TENANT:
            return await handler(request)
        limiter = self._limiter(principal)
        over = limiter.admit(self.clock())
        if over is not None:
            why, wait_s = over
            self.limited.labels(principal.tenant).inc()
            raise TooManyRequests(
                f"tenant {principal.tenant!r}: {why}",
                field="Authorization",
                code="key_limited",
                headers={"Retry-After": str(max(1, int(-(-wait_s // 1))))},
            )
        request[PRINCIPAL_KEY] = principal
        try:
            return await handler(request)
        finally:
            limiter.release()

    def _refuse(
        self, request: web.Request, path: str, status: int, short: str, reason: str,
        challenge: str,
    ) -> None:  # fmt: skip
        """Count and maybe log the refusal, then raise the answer (429 once slowed down)."""
        source = source_of(request.remote)
        verdict = self.refusals.refuse(source, f"{request.method} {path}: {short}", self.clock())
        for line in verdict.lines:
            log.warning("%s", line)
        if verdict.retry_after_s is not None:
            self.refused.labels("429").inc()
            raise TooManyRequests(
                f"too many refused requests from {source}: try again in "
                f"{verdict.retry_after_s} s with a valid credential",
                field="Authorization",
                code="slowed_down",
                headers={"Retry-After": str(verdict.retry_after_s)},
            )
        self.refused.labels(str(status)).inc()
        error = Unauthorized if status == 401 else Forbidden
        raise error(reason, field="Authorization", headers={"WWW-Authenticate": challenge})

    def _limiter(self, principal: Principal) -> KeyLimiter:
        limiter = self.limiters.get(principal.digest)
        if limiter is None:
            assert principal.tenant is not None
            limits = self.auth.tenants[principal.tenant]
            limiter = self.limiters[principal.digest] = KeyLimiter(limits, self.clock())
        return limiter

    # -- token files and the refusal log ----------------------------------------------------

    def reload(self) -> bool:
        """Re-read every token file; True when the credentials changed. A file that cannot
        be used keeps what it held (a WARNING once per problem)."""
        tokens = dict(self._tokens)
        for path, (key, limit) in self.files.items():
            try:
                fresh = read_token_file(path, limit)
            except ValueError as exc:
                self._problem(path, f"{key}: {exc}; keeping the {len(tokens[path])} "
                              f"token(s) it held before")  # fmt: skip
                continue
            self._problems.pop(path, None)
            if fresh != tokens[path]:
                tokens[path] = fresh
                log.info("%s: %s now holds %d token(s)", key, path, len(fresh))
        if tokens == self._tokens:
            return False
        try:
            credentials = credentials_of(self.config, tokens)
        except ValueError as exc:
            self._problem("", f"token files not applied: {exc}")
            return False
        self._problems.pop("", None)
        self._tokens, self.credentials = tokens, credentials
        self.limiters = {d: lim for d, lim in self.limiters.items() if d in credentials}
        return True

    def _problem(self, path: str, message: str) -> None:
        if self._problems.get(path) != message:
            self._problems[path] = message
            log.warning("%s", message)

    def flush(self, final: bool = False) -> None:
        """Log the refusal lines of every interval that closed (`final`: of every one)."""
        for line in self.refusals.flush(self.clock(), final):
            log.warning("%s", line)

    async def start(self) -> None:
        """Re-read the files every reload_interval_s and on SIGHUP; flush the refusal log."""
        self._task = asyncio.create_task(self._run(), name="auth-reload")
        if self.files:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True

    def _on_sighup(self) -> None:
        log.info("SIGHUP: re-reading the token files")
        self.reload()

    async def stop(self) -> None:
        """Stop re-reading; log what the refusal log still counts, so no count is lost."""
        if self._sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.flush(final=True)

    async def _run(self) -> None:
        period_s = min(self.auth.reload_interval_s, self.auth.refusal_interval_s)
        while True:
            await asyncio.sleep(period_s)
            if self.files:
                self.reload()
            self.flush()
