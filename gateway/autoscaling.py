"""The autoscaler loop: a policy decides, an actuator carries it out.

Threshold policy (TailGuard §III.E): the pool's task deadline-miss ratio over
its own window (shorter than admission's, so scaling reacts first) against
R_sth^U / R_sth^L. Swayam policy (§4): the pool's request rate and service
times; scale-out to the predicted need, scale-in left to idle servers that
retire themselves (`tailgate taskserver --idle-exit-s`); the pool routes by the policy's
ordered backend prefix (gateway.targets), n_B meets each request group's own task target
(class SLO at the percentile its fanout needs), and an SLA violation decides at once.
With several gateway replicas in front of the pool, each publishes its local rate on its
heartbeats and feeds the policy the sum over all of them (taskserver.frontends, §4.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from admission import MissRatioWindow, ScaleDecision, SwayamPolicy, ThresholdAutoscaler
from gateway.config import AutoscalingConfig
from taskserver.backoff import RetryLog
from taskserver.frontends import FrontendRates
from taskserver.spawn import taskserver_argv

if TYPE_CHECKING:
    from admission.actuators import Actuator
    from gateway.view import GatewayView

log = logging.getLogger(__name__)

MIN_VIOLATION_GAP_S = 0.1
"""Least time between two decisions, so a burst of SLA violations decides once."""
MIN_SAMPLE_FRACTION = 0.5
"""Swayam: a rate sample spans at least this share of the decision period."""
FRONTEND_HORIZON_TIMEOUTS = 3.0
"""Swayam: another gateway no server has listed for this many heartbeat timeouts is
forgotten (its rate leaves the global rate)."""


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
                retry_delay_ms=pool.retry_delay_ms if pool is not None else 1.0,
                history_s=config.history_s,
                **(
                    {}
                    if config.link_delay_ms is None
                    else {"send_ms": config.link_delay_ms, "reply_ms": config.link_delay_ms}
                ),
            )
        self.tasks_seen = 0
        self.tasks_offered = 0
        """Tasks of the queries that arrived for the pool, admitted or not: Swayam's request
        rate is the demand at the front end, not what admission let through."""
        self.last_error = ""
        self._failures = RetryLog("autoscaler", every_s=60.0)
        """What to log of failing ticks: the first, a new error, one line a minute."""
        self.actions: deque[dict[str, Any]] = deque(maxlen=100)
        self.decisions: Counter[str] = Counter()
        """Decisions taken, by action: up, down or hold."""
        self._task: asyncio.Task[None] | None = None
        self._last_tick = clock()
        self._tasks_at_tick = 0
        self.frontends = FrontendRates(
            FRONTEND_HORIZON_TIMEOUTS * service.config.heartbeat_timeout_s
        )
        """Swayam: the gateways in front of the pool and their local rates, as the pool's
        servers list them in their heartbeat replies."""
        self._own_id: str | None = None
        self._delays: dict[str, Any] = {
            "source": "default" if config.link_delay_ms is None else "configured",
            "servers": 0,
        }
        """Swayam: where d1 and d2 came from at the last tick (`_measure_delays`)."""
        self._rates: dict[str, Any] = {}
        """Swayam: the frontends and rates the last tick fed the policy (for the snapshot)."""
        self._groups: dict[tuple[float, float, int], float] = {}
        """Request groups (percentile, SLO ms, fanout) of the pool -> when last seen."""
        self._wake = asyncio.Event()
        """Set by an SLA violation: decide now, not at the next period."""
        self._beyond_since: float | None = None
        """Swayam without self-retiring servers: since when replicas exceed the prefix n."""
        self._beyond_n = 0
        self._last_decision_s = -math.inf

    def record_tasks(self, misses: int, total: int, pool: str) -> None:
        """Several task results of any pool at once (a frame; only this pool's count)."""
        if pool == self.config.pool and total:
            self.window.record_many(misses, total, self.clock())
            self.tasks_seen += total

    def record_arrival(self, fanout: int, pool: str) -> None:
        """A query arrived for the pool (before admission): its tasks count in the rate."""
        if pool == self.config.pool:
            self.tasks_offered += fanout

    def record_query(self, percentile: float, slo_ms: float, fanout: int, pool: str) -> None:
        """A query dispatched on the pool: its request group, for Swayam's per-group task
        targets (admission.swayam.task_targets)."""
        if pool == self.config.pool:
            self._groups[(percentile, slo_ms, fanout)] = self.clock()

    def note_violation(self, pool: str) -> None:
        """A query of the pool is still running at its SLO: with Swayam, decide at once
        (Algorithm 1, lines 4-5 and 12), at most once per MIN_VIOLATION_GAP_S."""
        if pool != self.config.pool or not isinstance(self.policy, SwayamPolicy):
            return
        self.policy.violations += 1
        self._wake.set()

    def _recent_groups(self, now: float) -> list[tuple[float, float, int]]:
        """The groups seen within the predictor's history (older ones are forgotten)."""
        horizon = self.policy.predictor.history_s if isinstance(self.policy, SwayamPolicy) else 0
        self._groups = {g: t for g, t in self._groups.items() if now - t <= horizon}
        return list(self._groups)

    def start(self) -> None:
        """Start deciding in the background; the rate is measured from now on (time spent
        building the pool before would read as a lower rate)."""
        if self._task is None:
            self._last_tick, self._tasks_at_tick = self.clock(), self.tasks_offered
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
            # Every interval, or at once after an SLA violation (not twice within the gap).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.interval_s)
            self._wake.clear()
            gap = MIN_VIOLATION_GAP_S - (self.clock() - self._last_decision_s)
            if gap > 0:
                await asyncio.sleep(gap)
            self._last_decision_s = self.clock()
            try:
                await self.tick()
            except Exception as exc:  # an actuator failure must not stop the loop
                self.last_error = str(exc)
                line = self._failures.failed(str(exc), self.clock())
                if line is not None:
                    log.warning("%s", line, extra={"pool": self.config.pool})
            else:
                line = self._failures.succeeded(self.clock())
                if line is not None:
                    log.info("%s", line, extra={"pool": self.config.pool})

    async def tick(self) -> dict[str, Any] | None:
        """Decide once and act; returns the action taken, if any."""
        now = self.clock()
        replicas = await self.actuator.replicas()
        if isinstance(self.policy, ThresholdAutoscaler):
            ratio = self.window.ratio(now)
            decision = self.policy.decide(ratio, replicas, now)
        else:
            ratio = self.window.ratio(now)
            elapsed = now - self._last_tick
            # A decision woken early by an SLA violation adds no rate sample: a rate measured
            # over a fraction of the period is noise the regression would extrapolate.
            if elapsed >= MIN_SAMPLE_FRACTION * self.config.interval_s:
                rate = (self.tasks_offered - self._tasks_at_tick) / elapsed
                self._last_tick, self._tasks_at_tick = now, self.tasks_offered
                global_rate = self._share_rate(now, rate)
                self._measure_delays()
                quantiles = self._service_quantiles()
                groups = self._recent_groups(now)
                if groups:
                    self.policy.set_groups(groups)
                if quantiles:
                    self.policy.observe(now, global_rate, quantiles)
            decision = self.policy.decide(now, replicas)
            if decision.delta == 0 and not self.actuator.self_retiring:
                decision = self._retire_beyond_prefix(decision, now, replicas)
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
        log_scaling(self.config.pool, replicas, target, now_replicas, decision.reason)
        # Misses that led to this step say nothing about the new capacity.
        self.window = MissRatioWindow(window_tasks=self.config.window_tasks)
        return action

    def _retire_beyond_prefix(
        self, decision: ScaleDecision, now: float, replicas: int
    ) -> ScaleDecision:
        """Passive scale-in where servers cannot retire themselves (a StatefulSet restarts a
        pod that exits): once the replicas beyond the prefix n have had no task for idle_s
        (they get none while n stays below them), scale down to n. The StatefulSet removes
        its highest ordinals, which are exactly those beyond the prefix (backend order is
        the pods' natural order). Beyond the paper, whose backends leave by themselves."""
        assert isinstance(self.policy, SwayamPolicy)
        n = max(self.policy.in_use, self.config.min_replicas)
        if replicas <= n:
            self._beyond_since = None
            return decision
        if self._beyond_since is None or self._beyond_n != n:
            self._beyond_since, self._beyond_n = now, n
            return decision
        if now - self._beyond_since < self.config.idle_s:
            return decision
        self._beyond_since = None
        return ScaleDecision(n - replicas, "passive_scale_in", n)

    def _share_rate(self, now: float, rate: float) -> float:
        """Publish this gateway's local rate λ_i on the pool's heartbeats and return the global
        rate λ: ours plus every other gateway's latest, as the pool's servers list them.

        Swayam §4.2 gossips n_F through backend replies and takes λ = n_F · λ_i; summing the
        rates instead is beyond the paper: it holds when gateways see uneven shares. With one
        gateway, λ = λ_i.
        """
        for link in self.service.links.values():
            if link.pool != self.config.pool:
                continue
            link.load_per_s = rate
            self._own_id = link.gateway_id or self._own_id
            if link.frontends_s is not None:
                self.frontends.merge(link.frontends, link.frontends_s)
        own = self._own_id
        global_rate = self.frontends.global_rate(own, rate, now)
        ids = self.frontends.ids(now, own)
        self._rates = {
            "frontends": {
                "count": max(len(ids), 1),
                "ids": ids,
                "rates_per_s": {**self.frontends.rates(now), **({own: rate} if own else {})},
            },
            "local_rate_per_s": rate,
            "global_rate_per_s": global_rate,
        }
        return global_rate

    def _measure_delays(self) -> None:
        """Swayam's d1 and d2 from the pool's links, unless the config fixes them: each link's
        one-way delay is half its least recent heartbeat round trip (links.RoundTrips); the
        median over the pool's servers that have one. The paper takes d1 and d2 as known
        network delays; measuring them is ours."""
        assert isinstance(self.policy, SwayamPolicy)
        if self.config.link_delay_ms is not None:
            self._delays = {"source": "configured", "servers": 0}
            return
        one_way = [
            link.one_way_ms
            for link in self.service.links.values()
            if link.pool == self.config.pool and link.rtt_ms is not None
        ]
        if not one_way:
            self._delays = {"source": "default", "servers": 0}
            return
        median = statistics.median(one_way)
        self.policy.set_delays(median, median)
        self._delays = {"source": "measured", "servers": len(one_way)}

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
            "policy_state": {
                **self.policy.snapshot(now),
                **self._rates,
                **({"link_delays": self._delays} if isinstance(self.policy, SwayamPolicy) else {}),
            },
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


def log_scaling(pool: str, was: int, target: int, now: int, reason: str) -> None:
    """One line per scaling action: up or down, from and to how many servers, and why."""
    direction = "up" if target > was else "down"
    short = "" if now == target else f" (asked for {target})"
    log.info(
        "autoscaler: scale %s pool %s from %d to %d servers%s: %s",
        direction,
        pool,
        was,
        now,
        short,
        reason,
        extra={"pool": pool, "outcome": f"scale-{direction}", "from": was, "to": now},
    )
