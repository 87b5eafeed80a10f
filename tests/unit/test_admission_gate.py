"""One admission gate for the gateway and the simulator.

A recorded stream of arrivals, task outcomes, answered queries and queue pressure is fed to
the gate as the gateway builds and feeds it (`GatewayService.gate`, per-task `note_task`,
`gateway.overload.admit` with its sleeps) and as the simulator does
(`loadtests.sim.events.gate_for`, batched `record_tasks`, deferrals as later events). Every
rule must take the same decision on every query and every retry in both.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass

import pytest

from admission import (
    Action,
    AdmissionConfig,
    AdmissionGate,
    Decision,
    Pressure,
    QueryInfo,
    Rule,
    Signal,
    make_rule,
)
from admission.rules import QueryMemory, RuleSettings
from gateway.config import ClassConfig, GatewayConfig
from gateway.errors import Unavailable
from gateway.overload import admit
from gateway.service import GatewayService
from loadtests.sim.events import gate_for
from loadtests.sim.scenario import ClassSpec, RunSpec, Scenario, class_priorities

SEED = 11
CLASSES = (("tight", 1.0, 99.0), ("loose", 1.5, 99.0))  # name, SLO ms, percentile


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float
    cls: int
    fanout: int
    unloaded_ms: float
    outcomes: tuple[tuple[float, bool], ...]  # (delay s, missed) per task, if admitted
    latency_ms: float  # the answered query's latency, known after the last outcome
    meet_prob: float = 1.0  # what a shell's wait estimate predicts (Signal.WAIT)


def _stream(n: int = 4000, seed: int = 7) -> list[Arrival]:
    """Poisson arrivals at 2,000/s with an overload episode in the middle third."""
    rng = random.Random(seed)
    predicted = random.Random(seed + 1)  # its own draws: the other fields stay as they were
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(2000.0)
        hot = n / 2000.0 / 3 <= t <= 2 * n / 2000.0 / 3
        p_miss = 0.06 if hot else 0.002
        fanout = rng.choice((1, 10, 10, 100))
        cls = rng.randrange(2)
        outcomes = tuple(
            (rng.uniform(0.0005, 0.004), rng.random() < p_miss) for _ in range(min(fanout, 20))
        )
        slo = CLASSES[cls][1]
        latency = slo * (rng.uniform(0.9, 1.6) if hot else rng.uniform(0.4, 0.95))
        meet = predicted.uniform(0.9, 1.0) if hot else predicted.uniform(0.985, 1.0)
        out.append(Arrival(t, cls, fanout, 0.3 + 0.002 * fanout, outcomes, latency, meet))
    return out


def _queue_pressure_at(t: float) -> float:
    return 0.3 + 0.8 * math.sin(t * 3.0) ** 2


def _config(rule: Rule) -> AdmissionConfig:
    return AdmissionConfig(
        rule=rule,
        threshold=0.01,
        window_tasks=3000,
        max_defer_ms=2.0,
        throttle_interval_s=0.02,
        throttle_gain=0.3,
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Sleep:
    """An awaitable that hands the defer time to whoever steps the coroutine."""

    def __init__(self, s: float) -> None:
        self.s = s

    def __await__(self) -> Generator[float, None, None]:
        yield self.s


def _replay(
    stream: list[Arrival],
    clock: _Clock,
    feed: Callable[[list[tuple[bool, str]], list[tuple[str, float, float]]], None],
    ask: Callable[[int, QueryInfo, Callable[[], float]], object],
    step: Callable[[object], tuple[Decision | None, float]],
) -> list[tuple[int, int, str, str]]:
    """Drive one shell through the stream, event by event on a shared virtual clock.

    `ask` starts a query's admission, `step` advances it: (decision, defer_s). Outcomes due
    by an event's time are fed first. Returns (query, attempt, action, reason) per decision.
    """
    names = [c[0] for c in CLASSES]
    slo = {c[0]: c[1] for c in CLASSES}
    prio = {"tight": 0, "loose": 1}
    outcomes: list[tuple[float, int, tuple]] = []  # (due, seq, ("task", missed, cls) | ...)
    events: list[tuple[float, int, int, object, int]] = []  # (t, seq, query, handle, attempt)
    seq = 0
    decisions: list[tuple[int, int, str, str]] = []
    nxt = 0

    def deliver(t: float) -> None:
        tasks: list[tuple[bool, str]] = []
        queries: list[tuple[str, float, float]] = []
        while outcomes and outcomes[0][0] <= t:
            _, _, item = heapq.heappop(outcomes)
            if item[0] == "task":
                tasks.append((item[1], item[2]))
            else:
                queries.append((item[1], item[2], item[3]))
        feed(tasks, queries)

    while nxt < len(stream) or events:
        if events and (nxt >= len(stream) or events[0][0] <= stream[nxt].t):
            t, _, q, handle, attempt = heapq.heappop(events)
        else:
            q, t, handle, attempt = nxt, stream[nxt].t, None, 0
            nxt += 1
        clock.now = t
        deliver(t)
        a = stream[q]
        if handle is None:
            info = QueryInfo(names[a.cls], prio[names[a.cls]], a.fanout, slo[names[a.cls]],
                             a.unloaded_ms, percentile=CLASSES[a.cls][2],
                             meet_prob=a.meet_prob)  # fmt: skip
            handle = ask(q, info, lambda t=t: _queue_pressure_at(t))
        d, defer_s = step(handle)
        assert d is not None
        decisions.append((q, attempt, str(d.action), d.reason))
        if d.action is Action.DEFER:
            seq += 1
            heapq.heappush(events, (t + defer_s, seq, q, handle, attempt + 1))
        elif d.action is Action.ADMIT:
            last = 0.0
            for delay, missed in a.outcomes:
                seq += 1
                heapq.heappush(outcomes, (t + delay, seq, ("task", missed, names[a.cls])))
                last = max(last, delay)
            seq += 1
            heapq.heappush(
                outcomes,
                (t + last, seq, ("query", names[a.cls], a.latency_ms, slo[names[a.cls]])),
            )
    return decisions


def _gateway_decisions(rule: Rule, stream: list[Arrival]) -> list[tuple[int, int, str, str]]:
    """The gateway's way: its service's gate, one note per task, `admit` with its sleeps."""
    clock = _Clock()
    classes = tuple(ClassConfig(n, s, p, i) for i, (n, s, p) in enumerate(CLASSES))
    config = GatewayConfig(classes=classes, admission=_config(rule), storage_url="")
    gate = GatewayService(config, clock=clock, rng=random.Random(SEED)).gate

    def feed(tasks: list[tuple[bool, str]], queries: list[tuple[str, float, float]]) -> None:
        for missed, cls in tasks:
            gate.note_task(missed, cls)
        for cls, latency, slo in queries:
            gate.record_query(cls, latency, slo)

    @dataclass
    class Handle:
        coro: object
        info: QueryInfo

    def ask(q: int, info: QueryInfo, pressure: Callable[[], float]) -> object:
        # The service skips admission when the gate clearly admits (GatewayService._run_query).
        if gate.clearly_admitted():
            return None
        return Handle(admit(gate, info, pressure, sleep=_Sleep), info)

    def step(handle: object) -> tuple[Decision | None, float]:
        if handle is None:
            return Decision(Action.ADMIT, "fast_path"), 0.0
        assert isinstance(handle, Handle)
        # What the coroutine decides: it either sleeps (DEFER), returns (ADMIT) or raises (503).
        try:
            defer_s = handle.coro.send(None)  # type: ignore[attr-defined]
        except StopIteration as stop:
            return Decision(Action.ADMIT, stop.value[0]), 0.0
        except Unavailable as exc:
            return Decision(Action.REJECT, exc.extra["reason"]), 0.0
        last = gate.controller.snapshot(clock())["decisions"][-1]  # the DEFER just taken
        return Decision(Action.DEFER, last["reason"], defer_s=defer_s), defer_s

    return _replay(stream, clock, feed, ask, step)


def _simulator_decisions(rule: Rule, stream: list[Arrival]) -> list[tuple[int, int, str, str]]:
    """The simulator's way: `gate_for` its scenario, outcomes batched per class, deferrals as
    later events (loadtests.sim.events.run_with_feedback)."""
    clock = _Clock()
    scn = Scenario(
        classes=tuple(ClassSpec(n, s, p) for n, s, p in CLASSES),
        admission=_config(rule),
        run=RunSpec(seed=random.Random(SEED).getrandbits(64)),  # the gateway's draw for it
    )
    assert list(class_priorities(scn)) == [0, 1]
    gate = gate_for(scn, clock)

    def feed(tasks: list[tuple[bool, str]], queries: list[tuple[str, float, float]]) -> None:
        # The simulator hands outcomes out first by kind, then tasks per class in one batch.
        for cls, latency, slo in queries:
            gate.record_query(cls, latency, slo)
        batch: dict[str, list[int]] = {}
        for missed, cls in tasks:
            pair = batch.setdefault(cls, [0, 0])
            pair[0] += missed
            pair[1] += 1
        for cls, (m, n) in batch.items():
            gate.record_tasks(m, n, cls)

    @dataclass
    class Handle:
        info: QueryInfo
        pressure: Callable[[], float]

    def ask(q: int, info: QueryInfo, pressure: Callable[[], float]) -> object:
        return Handle(info, pressure)

    def step(handle: object) -> tuple[Decision | None, float]:
        assert isinstance(handle, Handle)
        if not gate.clearly_admitted():
            d = gate.decide(handle.info, handle.pressure)
        else:
            d = Decision(Action.ADMIT, "fast_path")
        if d.action is Action.DEFER:
            handle.info = handle.info.after(d.defer_s)
        return d, d.defer_s

    return _replay(stream, clock, feed, ask, step)


@pytest.mark.parametrize("rule", list(Rule))
def test_gateway_and_simulator_take_the_same_decision_on_every_query(rule: Rule) -> None:
    stream = _stream()
    gw = _gateway_decisions(rule, stream)
    sim = _simulator_decisions(rule, stream)
    assert len(gw) == len(sim)
    first = next((i for i, (a, b) in enumerate(zip(gw, sim, strict=True)) if a != b), None)
    assert first is None, f"decision {first}: gateway {gw[first]} vs simulator {sim[first]}"
    turned_away = sum(action != "admit" for _, _, action, _ in gw)
    if rule is Rule.NONE:
        assert turned_away == 0
    else:
        # The stream's overload episode makes every rule act, so the comparison means something.
        assert turned_away > 20, f"{rule}: only {turned_away} decisions other than admit"
    if rule is Rule.COST_LADDER:
        assert any(action == "defer" for _, _, action, _ in gw)


def test_each_rule_declares_the_signals_it_reads() -> None:
    """A rule reads only the signals it declares: the others are poison here."""
    q = QueryInfo("b", 1, 10, 1.5, 0.5)
    for rule in Rule:
        r = make_rule(rule, RuleSettings(threshold=0.01), random.Random(1))
        memory = QueryMemory(["a", "b"], 100)
        memory.remember(q)
        poison = Pressure(
            miss_ratio=0.05 if Signal.MISS_RATIO in r.needs else math.nan,
            queue_pressure=2.0 if Signal.QUEUE_PRESSURE in r.needs else math.nan,
            tail_ratio=1.2 if Signal.TAIL_RATIO in r.needs else math.nan,
        )
        d = r.decide(q, poison, 1.0, memory)
        assert math.isfinite(d.severity), f"{rule} read a signal it does not declare"
        assert r.rule is rule


def test_the_gate_reads_queue_pressure_only_for_a_rule_that_needs_it() -> None:
    calls = []

    def pressure() -> float:
        calls.append(1)
        return 1.0

    classes = [ClassConfig("a", 1.0, 99.0, 0), ClassConfig("b", 1.5, 99.0, 1)]
    for rule, reads in ((Rule.REJECT_ALL, False), (Rule.COST_LADDER, True)):
        calls.clear()
        clock = _Clock()
        gate = AdmissionGate(_config(rule), classes, clock)
        gate.record_tasks(50, 100, "b")  # far above the threshold: no fast path
        gate.decide(QueryInfo("b", 1, 10, 1.5, 0.5), pressure)
        assert bool(calls) is reads, rule


def test_the_exported_miss_ratio_falls_when_traffic_stops() -> None:
    clock = _Clock()
    classes = [ClassConfig("a", 1.0, 99.0, 0), ClassConfig("b", 1.5, 99.0, 1)]
    gate = AdmissionGate(_config(Rule.REJECT_ALL), classes, clock)
    gate.record_tasks(30, 100, "a")
    assert gate.miss_ratio() == 0.3 and gate.miss_ratio("a") == 0.3 and gate.miss_ratio("b") == 0
    clock.now += gate.config.window_max_age_s + 0.1  # no task for longer than the max age
    assert gate.miss_ratio() == 0.0 and gate.miss_ratio("a") == 0.0
