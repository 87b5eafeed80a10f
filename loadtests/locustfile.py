"""Locust users for a Tailgate gateway: the fanout, Sensing-as-a-Service and pipeline mixes.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080            # web UI on :8089
    locust -f loadtests/locustfile.py --host http://127.0.0.1:8080 \\
        --headless -u 8 -r 8 -t 60s --csv tailgate --only-summary            # closed loop
    locust -f loadtests/locustfile.py --host ... --headless -u 4 -t 60s --rate 40   # open loop
    locust -f loadtests/locustfile.py --host ... FanoutUser SaasUser         # choose mixes
    TAILGATE_API_KEY=... locust -f loadtests/locustfile.py --host ...       # queries need a key

Users (named on the command line to choose; with none named, only FanoutUser runs, the
one mix plain `tailgate up` serves):

- FanoutUser: emulated tasks over pool ``default`` (``--fanout-pool``), fanout 1 and 10
  as class A and every server as class B (weights 6:3:1); fanout 10 shrinks to the pool.
- SaasUser: the Sensing-as-a-Service A/B/C mix over pool ``edge`` (``loadtests.saas``);
  needs edge agents, e.g. ``tailgate --config deploy/saas.toml up --servers 0
  --edge-agents 32``.
- BurstUser: fanout-1 queries (class A) over pool ``default``, open loop at the rate of a
  piecewise-linear trace (``--trace "0:20,60:20,65:60,100:60,105:20,200:20"``: seconds
  since the start : queries/s; the last rate holds after its corner), so an autoscaler
  can be watched scaling out ahead of a burst and back in after it.
- PipelineUser: one ONNX pipeline request per query to pool ``pipeline``
  (``--pipeline-pool``) under an explicit SLO (``--pipeline-slo-ms``); needs pipeline
  task servers registered in that pool.

Closed loop (the default): each user sends a query, waits for its answer, thinks up to
50 ms. Open loop (``--rate R`` or ``TAILGATE_RATE``): arrivals are Poisson at R queries/s
over this process's users (each worker of a distributed run sends R) whatever the
answers take; a user holds at most ``--max-in-flight`` queries and counts an arrival
beyond that as a failure (``client overrun``) rather than silently slowing down.

Accounting: a 503 (admission rejection, a server or cluster down, a pipeline's drop)
is the gateway working as designed, so its request is a success; every query also
fires one custom event of type ``SLO class <class>`` named after its outcome (met,
missed, rejected, dropped, timeout, failed; loadtests.locust_mix), with the gateway's
latency for answered queries. Failures (502, 504, 4xx, no answer) are counted once, on
the HTTP row, so locust exits 1 when any query failed. The SLO rows also count in
Locust's "Aggregated" line. At the end a per-class SLO summary is printed;
``--check-slo`` makes locust exit 3 when a class missed its SLO (and nothing failed).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

from gevent.pool import Pool
from locust import FastHttpUser, events, task
from locust.env import Environment
from locust.runners import WorkerRunner
from locust.stats import StatsEntry

from loadtests.locust_mix import (
    FANOUTS,
    OUTCOMES,
    ClassTally,
    classify,
    fanout_query,
    format_summary,
    pipeline_query,
)
from loadtests.saas import make_query as saas_query

log = logging.getLogger("tailgate.locust")

SLO_PREFIX = "SLO class "
THINK_S = 0.05
"""Closed loop: a user thinks up to this long between an answer and its next query."""


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    g = parser.add_argument_group("Tailgate")
    g.add_argument(
        "--rate",
        type=float,
        default=0.0,
        env_var="TAILGATE_RATE",
        help="open loop: Poisson arrivals at this many queries/s in all (0: closed loop)",
    )
    g.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="open loop: queries one user may have outstanding (256)",
    )
    g.add_argument(
        "--api-key",
        default="",
        env_var="TAILGATE_API_KEY",
        help="sent as 'Authorization: Bearer KEY' with every request: a tenant's API key or "
        "an admin token, for a gateway whose queries need one (none: queries are open)",
    )
    g.add_argument("--fanout-pool", default="default", help="FanoutUser: pool (default)")
    g.add_argument(
        "--service-ms",
        type=float,
        default=0.0,
        help="FanoutUser: emulated service time per task (0: the server's distribution)",
    )
    g.add_argument(
        "--trace",
        default="0:20,60:20,65:60,100:60,105:20,200:20",
        help="BurstUser: rate trace 't_s:queries_per_s,...' (piecewise linear)",
    )
    g.add_argument("--pipeline-pool", default="pipeline", help="PipelineUser: pool (pipeline)")
    g.add_argument(
        "--pipeline-slo-ms", type=float, default=400.0, help="PipelineUser: p99 SLO (400)"
    )
    g.add_argument(
        "--check-slo",
        action="store_true",
        default=False,
        help="exit with status 3 when a class misses its SLO",
    )


class _Gateway:
    """What this process learnt from the gateway at test start."""

    classes: dict[str, tuple[float, float]] = {}
    """Class -> (percentile, latency_ms), from GET /v1/classes."""
    pool_sizes: dict[str, int] = {}
    """Pool -> servers registered, from GET /v1/servers."""


def _auth(environment: Environment) -> dict[str, str]:
    """The Authorization header of --api-key (none without one)."""
    key = str(getattr(environment.parsed_options, "api_key", "") or "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _get_json(url: str, headers: dict[str, str]) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
        return json.loads(r.read())


@events.init.add_listener
def _default_users(environment: Environment, **_: Any) -> None:
    """With no user class named on the command line, run only those not marked opt-in."""
    named = getattr(environment.parsed_options, "user_classes", None)
    if named:
        return
    chosen = [u for u in environment.user_classes if not getattr(u, "opt_in", False)]
    if chosen:
        environment.user_classes[:] = chosen


@events.test_start.add_listener
def _learn_gateway(environment: Environment, **_: Any) -> None:
    """Fetch the classes' SLO targets and the pools' sizes (best effort)."""
    host = (environment.host or "").rstrip("/")
    try:
        headers = _auth(environment)
        classes = _get_json(host + "/v1/classes", headers)["classes"]
        servers = _get_json(host + "/v1/servers", headers)["servers"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cannot read the gateway's classes and servers at %s: %s", host, exc)
        return
    _Gateway.classes = {c["name"]: (c["percentile"], c["latency_ms"]) for c in classes}
    sizes: dict[str, int] = {}
    for s in servers:
        sizes[s["pool"]] = sizes.get(s["pool"], 0) + 1
    _Gateway.pool_sizes = sizes


class TailgateUser(FastHttpUser):
    """Sends one mix's queries to POST /v1/queries, closed or open loop."""

    abstract = True
    opt_in = False
    """Runs only when named on the command line."""
    concurrency = 64
    """Connections per user (open loop: queries in flight share them)."""
    network_timeout = 120.0

    def on_start(self) -> None:
        """Set up the user's random stream and its open-loop schedule."""
        opts = self.environment.parsed_options
        self.rng = random.Random()
        self.rate_per_s = float(getattr(opts, "rate", 0.0) or 0.0)
        self.in_flight = Pool(max(1, int(getattr(opts, "max_in_flight", 256))))
        self._next_at = time.monotonic()
        self.headers = _auth(self.environment)

    def on_stop(self) -> None:
        """Abandon the open-loop queries still in flight."""
        self.in_flight.kill(block=True, timeout=2.0)

    def wait_time(self) -> float:
        """Closed loop: a short think time; open loop: until the next Poisson arrival."""
        if self.rate_per_s <= 0:
            return self.rng.uniform(0.0, THINK_S)
        runner = self.environment.runner
        users = max(1, runner.target_user_count if runner is not None else 1)
        self._next_at += self.rng.expovariate(self.rate_per_s / users)
        return max(0.0, self._next_at - time.monotonic())

    def next_query(self) -> tuple[str, dict[str, Any], str]:
        """(request name, query body, SLO class label) of the next query."""
        raise NotImplementedError

    @task
    def query(self) -> None:
        """Send the next query (open loop: without waiting for its answer)."""
        name, body, label = self.next_query()
        if self.rate_per_s <= 0:
            self.send(name, body, label)
        elif self.in_flight.full():
            self.environment.events.request.fire(
                request_type="client",
                name="overrun",
                response_time=0.0,
                response_length=0,
                exception=RuntimeError(
                    f"{self.in_flight.size} queries already in flight: the arrival is lost"
                ),
                context={},
            )
        else:
            self.in_flight.spawn(self.send, name, body, label)

    def send(self, name: str, body: dict[str, Any], label: str) -> None:
        """POST one query; record its HTTP outcome and its SLO outcome."""
        t0 = time.perf_counter()
        with self.client.post(
            "/v1/queries", json=body, name=name, headers=self.headers, catch_response=True
        ) as resp:
            status = resp.status_code or 0
            try:
                answer = resp.json() if status else None
            except ValueError:
                answer = None
            outcome = classify(status, answer, str(getattr(resp, "error", "") or ""))
            if outcome.ok:
                resp.success()
            else:
                resp.failure(outcome.message)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        if isinstance(answer, dict) and isinstance(answer.get("class"), str):
            label = answer["class"]
        self.environment.events.request.fire(
            request_type=SLO_PREFIX + label,
            name=outcome.name,
            response_time=outcome.latency_ms if outcome.latency_ms is not None else elapsed_ms,
            response_length=0,
            exception=None,
            context={},
        )


class FanoutUser(TailgateUser):
    """Emulated tasks over one pool: fanout 1 and 10 (class A) and all (class B)."""

    _WEIGHTS = (("fanout 1", 6), ("fanout 10", 3), ("fanout all", 1))

    def next_query(self) -> tuple[str, dict[str, Any], str]:
        """One query of the fanout mix."""
        opts = self.environment.parsed_options
        pool = getattr(opts, "fanout_pool", "default")
        service_ms = float(getattr(opts, "service_ms", 0.0) or 0.0) or None
        kind = self.rng.choices([k for k, _ in self._WEIGHTS], [w for _, w in self._WEIGHTS])[0]
        body = fanout_query(kind, pool, _Gateway.pool_sizes.get(pool, 10), service_ms)
        cls = FANOUTS[kind][0]
        return f"{kind} (class {cls})", body, cls


def parse_trace(text: str) -> tuple[list[float], list[float]]:
    """'t:rate,...' -> (times s, rates per s); ValueError naming the problem."""
    times, rates = [], []
    for part in text.split(","):
        t, sep, r = part.strip().partition(":")
        if not sep:
            raise ValueError(f"--trace: expected 't_s:rate' pairs, got {part!r}")
        times.append(float(t))
        rates.append(float(r))
    if times != sorted(times) or any(r < 0 for r in rates) or not any(rates):
        raise ValueError(f"--trace: times must ascend and rates be >= 0 (not all 0): {text!r}")
    return times, rates


def trace_rate(times: list[float], rates: list[float], t: float) -> float:
    """The trace's rate at t s (linear between corners, flat beyond them)."""
    if t <= times[0]:
        return rates[0]
    for (t0, r0), (t1, r1) in itertools.pairwise(zip(times, rates, strict=True)):
        if t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
    return rates[-1]


class BurstUser(TailgateUser):
    """Fanout-1 queries at a rate that follows a trace (open loop, one user is enough)."""

    opt_in = True

    def on_start(self) -> None:
        """Read the trace; the clock starts now."""
        super().on_start()
        self.times, self.rates = parse_trace(self.environment.parsed_options.trace)
        self.started = time.monotonic()
        self.rate_per_s = 1.0  # open loop (TailgateUser.query); wait_time sets the rate

    def wait_time(self) -> float:
        """Until the next arrival of a Poisson stream at the trace's rate now, spread over
        the users (thinning would also do; the rate changes slowly against the gaps)."""
        runner = self.environment.runner
        users = max(1, runner.target_user_count if runner is not None else 1)
        now = time.monotonic()
        rate = trace_rate(self.times, self.rates, now - self.started) / users
        self._next_at = max(self._next_at, now - 1.0) + self.rng.expovariate(max(rate, 1e-3))
        return max(0.0, self._next_at - now)

    def next_query(self) -> tuple[str, dict[str, Any], str]:
        """One fanout-1 query of class A."""
        opts = self.environment.parsed_options
        service_ms = float(getattr(opts, "service_ms", 0.0) or 0.0) or None
        body = fanout_query("fanout 1", getattr(opts, "fanout_pool", "default"), 1, service_ms)
        return "fanout 1 (class A)", body, FANOUTS["fanout 1"][0]


class SaasUser(TailgateUser):
    """The Sensing-as-a-Service A/B/C mix over the edge agents of pool `edge`."""

    opt_in = True

    def next_query(self) -> tuple[str, dict[str, Any], str]:
        """One query of the SaaS mix (loadtests.saas)."""
        body = saas_query(self.rng, datetime.now(UTC))
        return f"saas class {body['class']}", body, body["class"]


class PipelineUser(TailgateUser):
    """One ONNX inference pipeline request per query, under an explicit p99 SLO."""

    opt_in = True

    def next_query(self) -> tuple[str, dict[str, Any], str]:
        """One pipeline request."""
        opts = self.environment.parsed_options
        pool = getattr(opts, "pipeline_pool", "pipeline")
        body = pipeline_query(self.rng, pool, float(getattr(opts, "pipeline_slo_ms", 400.0)))
        return f"pipeline {pool}", body, "pipeline"


def slo_tallies(environment: Environment) -> dict[str, ClassTally]:
    """Per-class outcomes from the SLO rows of the run's stats (master or local runner)."""
    tallies: dict[str, ClassTally] = {}
    answered: dict[str, StatsEntry] = {}
    opts = environment.parsed_options
    for (name, method), entry in environment.stats.entries.items():
        if not method.startswith(SLO_PREFIX) or name not in OUTCOMES:
            continue
        cls = method[len(SLO_PREFIX) :]
        tally = tallies.get(cls)
        if tally is None:
            tally = tallies[cls] = ClassTally(cls)
            if cls == "pipeline":
                tally.percentile, tally.slo_ms = 99.0, float(opts.pipeline_slo_ms)
            elif cls in _Gateway.classes:
                tally.percentile, tally.slo_ms = _Gateway.classes[cls]
        tally.counts[name] = entry.num_requests
        if name in ("met", "missed"):
            both = answered.setdefault(cls, StatsEntry(environment.stats, cls, "answered"))
            both.extend(entry)
    for cls, both in answered.items():
        tally = tallies[cls]
        if tally.percentile is not None and both.num_requests:
            tally.latency_p_ms = float(both.get_response_time_percentile(tally.percentile / 100))
    return tallies


@events.test_stop.add_listener
def _print_summary(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return  # the master holds the whole run's stats
    print(format_summary(slo_tallies(environment)), flush=True)


@events.quitting.add_listener
def _slo_exit_code(environment: Environment, **_: Any) -> None:
    opts = environment.parsed_options
    if not getattr(opts, "check_slo", False) or isinstance(environment.runner, WorkerRunner):
        return
    missed = [t.name for t in slo_tallies(environment).values() if t.meets is False]
    if missed and environment.process_exit_code is None and not environment.stats.errors:
        log.error("class(es) %s missed their SLO", ", ".join(sorted(missed)))
        environment.process_exit_code = 3


_environment: list[Environment] = []
"""The run's Environment (Locust's quit event passes only the exit code)."""


@events.init.add_listener
def _keep_environment(environment: Environment, **_: Any) -> None:
    _environment[:] = [environment]


@events.quit.add_listener
def _write_final_stats(exit_code: int, **_: Any) -> None:
    """With ``--csv PREFIX``, the run's final stats in ``PREFIX_final.json``: every request
    and SLO row (Locust's serialized entries) and every error, with the exit code. Locust
    writes its CSV files every second while the run goes and not again at the end, so on
    a busy machine they can miss the run's last second, or all of a short run."""
    if not _environment:
        return
    environment = _environment[0]
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if not prefix or isinstance(environment.runner, WorkerRunner):
        return
    final = {
        "exit_code": exit_code,
        "stats": environment.stats.serialize_stats(),
        "errors": list(environment.stats.serialize_errors().values()),
    }
    with open(f"{prefix}_final.json", "w", encoding="utf-8") as f:
        json.dump(final, f, indent=1)
