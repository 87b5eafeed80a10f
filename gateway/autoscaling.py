"""The autoscaler loop: a policy decides, an actuator carries it out.

Threshold policy (TailGuard §III.E): the pool's task deadline-miss ratio over
its own window (shorter than admission's, so scaling reacts first) against
R_sth^U / R_sth^L. Swayam policy (§4): the pool's request rate and service
times; scale-out to the predicted need, scale-in left to idle servers that
retire themselves (`tailgate taskserver --idle-exit-s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from admission import MissRatioWindow, SwayamPolicy, ThresholdAutoscaler
from gateway.config import AutoscalingConfig
from taskserver.spawn import taskserver_argv

if TYPE_CHECKING:
    from admission.actuators import Actuator
    from gateway.view import GatewayView

log = logging.getLogger(__name__)


class AutoscalerLoop:
    """Runs the pool's autoscaling policy every `interval_s` and acts on its decisions."""

    def __init__(
        self,
        service: GatewayView,
        config: AutoscalingConfig,
        actuator: Actuator,
        clock: Callable[[], float],
    ) -> None:
        self.service = service
        self.config = config
        self.actuator = actuator
        self.clock = clock
        self.window = MissRatioWindow(window_tasks=config.window_tasks)
        self.policy: ThresholdAutoscaler | SwayamPolicy
        if config.policy == "threshold":
            self.policy = ThresholdAutoscaler(
                upper=config.upper,
                lower=config.lower,
                min_replicas=config.min_replicas,
                max_replicas=config.max_replicas,
                up_cooldown_s=config.up_cooldown_s,
                down_cooldown_s=config.down_cooldown_s,
            )
        else:
            cls = min(service.config.classes, key=lambda c: c.latency_ms)
            pool = next((p for p in service.config.pools if p.name == config.pool), None)
            self.policy = SwayamPolicy(
                setup_s=config.setup_s,
                burst=config.burst,
                percentile=cls.percentile,
                target_ms=cls.latency_ms,
                min_backends=config.min_replicas,
                max_backends=config.max_replicas,
                # The gateway's queue hands a task to the first free server (M/M/n), where
                # server queueing is Swayam's random dispatch with retries.
                dispatch="central" if pool is not None and pool.queueing == "central" else "retry",
            )
        self.tasks_seen = 0
        self.last_error = ""
        self.actions: deque[dict[str, Any]] = deque(maxlen=100)
        self.decisions: Counter[str] = Counter()
        """Decisions taken, by action: up, down or hold."""
        self._task: asyncio.Task[None] | None = None
        self._last_tick = clock()
        self._tasks_at_tick = 0

    def record_task(self, missed: bool, pool: str) -> None:
        """One task result of any pool (only this pool's count)."""
        if pool == self.config.pool:
            self.window.record(missed, self.clock())
            self.tasks_seen += 1

    def start(self) -> None:
        """Start deciding in the background."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop deciding and release the actuator (a local one stops its processes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.actuator.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.tick()
            except Exception as exc:  # an actuator failure must not stop the loop
                self.last_error = str(exc)
                log.warning("autoscaler: %s", exc)

    async def tick(self) -> dict[str, Any] | None:
        """Decide once and act; returns the action taken, if any."""
        now = self.clock()
        replicas = await self.actuator.replicas()
        if isinstance(self.policy, ThresholdAutoscaler):
            ratio = self.window.ratio(now)
            decision = self.policy.decide(ratio, replicas, now)
        else:
            ratio = self.window.ratio(now)
            elapsed = max(now - self._last_tick, 1e-9)
            rate = (self.tasks_seen - self._tasks_at_tick) / elapsed
            self._last_tick, self._tasks_at_tick = now, self.tasks_seen
            quantiles = self._service_quantiles()
            if quantiles:
                self.policy.observe(now, rate, quantiles)
            decision = self.policy.decide(now, replicas)
        action_name = "up" if decision.delta > 0 else "down" if decision.delta < 0 else "hold"
        self.decisions[action_name] += 1
        if decision.delta == 0:
            return None
        target = decision.replicas
        now_replicas = await self.actuator.scale_to(target)
        action = {
            "time_s": round(now, 3),
            "miss_ratio": ratio,
            "from": replicas,
            "to": now_replicas,
            "reason": decision.reason,
        }
        self.actions.append(action)
        log.info("autoscaler: %s replicas %d -> %d", decision.reason, replicas, now_replicas)
        # Misses that led to this step say nothing about the new capacity.
        self.window = MissRatioWindow(window_tasks=self.config.window_tasks)
        return action

    def replicas_now(self) -> int:
        """Servers of the scaled pool registered now."""
        return len(self.service.pool_members.get(self.config.pool, []))

    def _service_quantiles(self) -> list[float]:
        members = self.service.pool_members.get(self.config.pool, [])
        if not members:
            return []
        cdf = self.service.book.cdf_of(members[0])
        return [cdf.quantile((i + 0.5) / 100) for i in range(100)]

    def snapshot(self) -> dict[str, Any]:
        """GET /v1/autoscaler."""
        now = self.clock()
        c = self.config
        return {
            "enabled": True,
            "policy": c.policy,
            "pool": c.pool,
            "actuator": self.actuator.name,
            "thresholds": {"upper": c.upper, "lower": c.lower},
            "replicas": {
                "min": c.min_replicas,
                "max": c.max_replicas,
                "now": len(self.service.pool_members.get(c.pool, [])),
            },
            "window": self.window.snapshot(now),
            "policy_state": self.policy.snapshot(now),
            "actions": list(self.actions),
            "last_error": self.last_error,
        }


def local_spawn(
    pool: str = "default",
    slots: int = 1,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
) -> Callable[[str, int | None], list[str]]:
    """The command line of a task server the local actuator starts: it leaves with this
    gateway (``--exit-with-parent``) and registers itself through the actuator."""

    def spawn(server_id: str, metrics_port: int | None) -> list[str]:
        return taskserver_argv(
            server_id,
            host=host,
            pool=pool,
            slots=slots,
            metrics_port=metrics_port,
            exit_with_parent=True,
            extra_args=extra_args,
        )

    return spawn


def make_actuator(
    config: AutoscalingConfig,
    gateway_url: str,
    extra_args: list[str],
    slots: int = 1,
    *,
    token: str | None = None,
    metrics_port_base: int | None = None,
) -> Actuator:
    """The actuator the config names; the local one registers its servers here, with the token."""
    from admission.actuators import KubernetesActuator, LocalActuator

    if config.actuator == "local":
        return LocalActuator(
            gateway_url=gateway_url,
            spawn=local_spawn(config.pool, slots, extra_args),
            pool=config.pool,
            id_prefix="ts",
            slots=slots,
            token=token,
            metrics_port_base=metrics_port_base,
        )
    return KubernetesActuator(
        name=config.k8s_name, namespace=config.k8s_namespace, kind=config.k8s_kind
    )
