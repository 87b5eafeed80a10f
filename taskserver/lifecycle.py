"""A task server's life with its gateways: register, heartbeat, retire, drain and leave.

A server given gateway URLs registers with each of them and re-registers every interval
(the registration is its heartbeat). It leaves in one way, whether it was told to stop
(SIGTERM) or retires after idling (Swayam's passive scale-in): it stops re-registering,
tells every gateway it is draining (``DELETE /v1/servers/{id}?drain_s=...``: the gateway
takes it out of the selection at once and waits for its outstanding tasks), serves what
it has queued for at most ``drain_timeout_s``, sends whatever is left back REJECTED, and
stays connected until the gateways let go (or LEAVE_MARGIN_S more), answering any task
still sent REJECTED: every task's fate reaches its gateway before the connection closes.
A gateway that lists the server in its configuration instead of taking registrations
learns of the drain from its heartbeat (``ServerStatus.draining``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, Protocol

from taskserver.backoff import Backoff, RetryLog
from taskserver.registration import GatewayUnreachable, auth_headers, gateway_call, gateway_urls

if TYPE_CHECKING:
    from taskserver.config import TaskServerConfig
    from taskserver.tls import ReloadingContext


class Drainable(Protocol):
    """What the lifecycle reads and drives of a task service (`taskserver.server.TaskService`)."""

    busy: int
    queue: Sized
    draining: bool
    last_activity: float
    clock: Callable[[], float]

    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """Serve the queue within timeout_s; (finished, given up)."""
        ...


__all__ = ["drain_and_leave", "register_forever", "retire_when_idle"]

log = logging.getLogger(__name__)

MAX_REFRESH_S = 3600.0
"""The longest wait between registration refreshes a gateway's answer may ask for."""
REFRESH_JITTER = 0.25
"""A refresh the gateway spaced out comes 0 to this fraction later than it asked: servers
registered together spread out."""
LEAVE_MARGIN_S = 2.0
"""The gateway waits this much longer than the server drains: the server's own verdicts
(REJECTED) then reach it before it gives up on the link."""


async def register_forever(
    config: TaskServerConfig,
    address: str,
    slots: int,
    stop: asyncio.Event,
    rng: random.Random | None = None,
    *,
    tls: ReloadingContext | None = None,
) -> None:
    """Register with every gateway now and every interval, until `stop` is set.

    Idempotent, so a restarted gateway learns the server again. A registration in flight
    when `stop` is set completes before this returns (none may land after the DELETE).
    A failed one is tried again after a jittered backoff drawn from `rng`. An https gateway
    is called with `tls`'s newest context (taskserver.tls: its certificate is checked).
    """
    body: dict[str, Any] = {
        "id": config.server_id,
        "pool": config.pool,
        "address": address,
        "slots": slots,
    }
    if config.cluster:
        body["cluster"] = config.cluster
    headers = auth_headers(config)
    urls = [u + "/v1/servers" for u in gateway_urls(config.gateway_url)]
    rng = random.Random() if rng is None else rng
    await asyncio.gather(
        *(_register_with(url, body, headers, config, stop, rng, tls) for url in urls)
    )


REGISTER_RETRY_BASE_S = 0.25
"""After a failed registration the next try comes within this long, the bound doubling per
failure up to the registration interval (taskserver.backoff: full jitter). A gateway that
comes up later learns the server within one interval, as one that is up all along."""


async def _register_with(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    config: TaskServerConfig,
    stop: asyncio.Event,
    rng: random.Random,
    tls: ReloadingContext | None = None,
) -> None:
    """Register with one gateway every interval, retrying sooner (backoff) after a failure;
    log the first failure, a new error, at most one "still failing" line a minute and the
    recovery, instead of a line per try."""
    interval_s = config.register_interval_s
    backoff = Backoff(min(REGISTER_RETRY_BASE_S, interval_s), interval_s, rng)
    retry = RetryLog(f"server {config.server_id}: registration at {url}")
    extra = {"server_id": config.server_id, "pool": config.pool}
    while not stop.is_set():
        # urllib uses the context for an https URL only
        failure, asked_s = await _register(
            url, body, headers, None if tls is None else tls.current()
        )
        now = time.monotonic()
        if failure is None:
            backoff.reset()
            # A gateway with many servers asks for rarer refreshes (gateway.pacing).
            wait_s = interval_s
            if asked_s > interval_s:
                wait_s = asked_s * rng.uniform(1.0, 1.0 + REFRESH_JITTER)
            line = retry.succeeded(now)
            if line is not None:
                log.info("%s", line, extra=extra)
        else:
            level, error = failure
            wait_s = backoff.failed()
            line = retry.failed(error, now, wait_s)
            if line is not None:
                # Not reachable at first is how a server started before its gateway begins.
                level = level if retry.failures == 1 else max(level, logging.WARNING)
                log.log(level, "%s", line, extra=extra)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait_s)


async def _register(
    url: str, body: dict[str, Any], headers: dict[str, str], context: ssl.SSLContext | None
) -> tuple[tuple[int, str] | None, float]:
    """One registration: (None, the refresh wait its answer asks for, 0 if none) when it
    took, else ((log level, what went wrong), 0)."""
    try:
        # shorter than the drain's wait for it, so none lands after the DELETE
        status, text = await gateway_call(
            "POST", url, body, headers, timeout_s=LEAVE_MARGIN_S, context=context
        )
    except GatewayUnreachable as exc:
        # A certificate refused either way is no passing outage: say so loudly.
        level = logging.WARNING if exc.tls else logging.INFO
        return (level, f"gateway not reachable: {exc}"), 0.0
    if status == 401:
        return (logging.ERROR, "refused: wrong or missing token (401)"), 0.0
    if status >= 400:
        return (logging.WARNING, f"refused ({status}): {text}"), 0.0
    return None, asked_refresh_s(text)


def asked_refresh_s(answer: str) -> float:
    """The ``refresh_s`` a registration's answer asks for, within 0..MAX_REFRESH_S (0: none,
    or not a number: an older gateway, or a body that is not its answer)."""
    try:
        asked = json.loads(answer).get("refresh_s")
    except (ValueError, AttributeError):
        return 0.0
    if isinstance(asked, bool) or not isinstance(asked, int | float):
        return 0.0
    try:
        value = float(asked)
    except OverflowError:  # an integer beyond any float
        value = math.inf
    return 0.0 if math.isnan(value) else min(max(value, 0.0), MAX_REFRESH_S)


async def retire_when_idle(service: Drainable, config: TaskServerConfig) -> None:
    """Return once no task has come or gone for idle_exit_s (Swayam's passive scale-in)."""
    while True:
        await asyncio.sleep(min(1.0, config.idle_exit_s / 4))
        idle = service.busy == 0 and len(service.queue) == 0
        if idle and service.clock() - service.last_activity >= config.idle_exit_s:
            log.info(
                "task server %s idle for %.0f s: retiring", config.server_id, config.idle_exit_s
            )
            return


async def drain_and_leave(
    service: Drainable,
    config: TaskServerConfig,
    registration: asyncio.Task[None] | None,
    *,
    tls: ReloadingContext | None = None,
) -> None:
    """Tell the gateways, serve the queue within drain_timeout_s, give up on the rest.

    `registration` is the register_forever task, already told to stop; `tls` is its.
    """
    t0 = time.monotonic()
    service.draining = True  # from here on a new task is REJECTED ("server is draining")
    if registration is not None:
        # only a timeout is swallowed: a second signal (cancellation) still cuts the drain
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(registration, LEAVE_MARGIN_S + 0.5)
    leaving = [
        asyncio.create_task(_deregister(url, config, tls))
        for url in gateway_urls(config.gateway_url)
    ]
    pending = service.busy + len(service.queue)
    finished, given_up = await service.drain(config.drain_timeout_s)
    log.info(
        "task server %s drained in %.2f s: %d task(s) in hand, %d finished, %d given up",
        config.server_id,
        time.monotonic() - t0,
        pending,
        finished,
        given_up,
    )
    if leaving:
        # Connected until the gateways let go: a task a gateway still sends (one it held in
        # its own queue) is answered REJECTED instead of being lost with the connection.
        await asyncio.wait(leaving, timeout=LEAVE_MARGIN_S)


async def _deregister(url: str, config: TaskServerConfig, tls: ReloadingContext | None) -> None:
    drain_s = min(config.drain_timeout_s + LEAVE_MARGIN_S, 600.0)
    server_id = urllib.parse.quote(config.server_id, safe="")
    target = f"{url}/v1/servers/{server_id}?drain_s={drain_s:g}"
    try:
        status, text = await gateway_call(
            "DELETE",
            target,
            headers=auth_headers(config),
            timeout_s=drain_s + LEAVE_MARGIN_S,
            context=None if tls is None else tls.current(),
        )
    except GatewayUnreachable as exc:
        log.info("could not deregister at %s: %s", url, exc)
        return
    if status >= 400 and status != 404:
        log.warning("deregistration at %s refused (%s): %s", url, status, text)
