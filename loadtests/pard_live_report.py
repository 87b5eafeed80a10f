"""What `loadtests.pard_live` runs and keeps of each run, and its report: tables, CSV, PNG.

Gaps are relative to the simulator: (live - sim) / sim. A policy PASSes when its goodput gap
and its drop-rate gap are within the tolerance; the drop-rate gap also passes within
`DROP_FLOOR` (absolute), since a tenth of a drop rate near zero is below what one run can
resolve. A live run whose driver fell behind the trace is INVALID and not judged.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.sim import plots
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.pipeline_model import PipelineModel
from loadtests.sim.traces import Trace
from onnx_models.profile import Profile
from taskserver.pard import ScalingConfig

__all__ = [
    "DROP_FLOOR",
    "OVERHEAD_TARGET",
    "LiveSetup",
    "Overhead",
    "PolicyResult",
    "SideDigest",
    "Validity",
    "write_report",
]

DROP_FLOOR = 0.005
"""A drop-rate difference of at most this (absolute) passes whatever its relative gap."""
OVERHEAD_TARGET = 0.0016
"""PARD's decision cost as a share of the end-to-end latency: at most 0.16%."""

Samples = list[tuple[float, dict[str, int]]]
"""(time, serving workers per module) in time order."""


@dataclass(frozen=True, slots=True)
class LiveSetup:
    """What both sides run: the pipeline, its profile, SLO, b_k, workers and the rate."""

    pipeline: str
    spec_path: Path
    profile_path: Path
    profile: Profile
    model: PipelineModel
    """The simulator's pipeline: the spec's DAG, the SLO below and the profile's d_k."""
    slo_s: float
    max_batch: dict[str, int]
    """b_k (Nexus's rule): the largest feasible batch size of each module, on both sides."""
    worker_rps: dict[str, float]
    """mu_k = b_k / d_k(b_k): one worker's throughput."""
    workers: int | ScalingConfig
    reach: dict[str, int]
    """The workers per module the rate rule counts on."""
    capacity_rps: float
    rate_rps: float
    load: float | None
    """Mean rate over capacity (None: ``--rate`` was given)."""
    providers: str
    warnings: tuple[str, ...] = ()
    """How the profile's environment differs from this machine's."""
    worker_mode: str = "thread"
    """Where the live workers' models run, ``process`` or ``thread`` (``--worker-mode``
    resolved on this machine)."""

    @property
    def first_workers(self) -> int:
        """Workers each module starts with."""
        w = self.workers
        return w.min_workers if isinstance(w, ScalingConfig) else w


@dataclass(frozen=True, slots=True)
class SideDigest:
    """One side's (live or sim) run of one policy over the trace."""

    side: str
    policy: str
    requests: int
    on_time: int
    late: int
    dropped: int
    """Dropped by the policy (live: and failed)."""
    failed: int
    invalid_rate: float
    seconds: float
    per_second: list[float]
    """On-time completions in each second of the trace."""
    workers: Samples
    drops_by_module: dict[str, int]
    mean_batch: dict[str, float]
    exec_vs_profile: dict[str, float] = field(default_factory=dict)
    """Measured over profiled batch time per module (live only)."""
    scaling_actions: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(started, stopped) workers per module."""
    hop_ms: dict[str, float] = field(default_factory=dict)
    """Live, process workers: ms per batch the process hop added (messages, copies)."""

    @property
    def goodput_rps(self) -> float:
        """On-time requests per second of trace."""
        return self.on_time / self.seconds

    @property
    def drop_rate(self) -> float:
        """(Dropped + late) over all requests (PARD §5.1)."""
        return (self.dropped + self.late) / self.requests if self.requests else 0.0

    def workers_peak(self, module: str) -> int:
        """Most workers the module served with during the trace."""
        return max((w[module] for t, w in self.workers if t <= self.seconds), default=0)

    def workers_mean(self, module: str) -> float:
        """Time-weighted mean of the module's serving workers over the trace."""
        points = [(t, w[module]) for t, w in self.workers if t <= self.seconds]
        if not points:
            return 0.0
        points[0] = (0.0, points[0][1])  # the first sample holds from the start
        total = 0.0
        for (t0, n), (t1, _) in zip(points, [*points[1:], (self.seconds, 0)], strict=True):
            total += n * (t1 - t0)
        return total / self.seconds

    def total_workers(self) -> list[tuple[float, float]]:
        """(time, workers over all modules) within the trace."""
        return [(t, float(sum(w.values()))) for t, w in self.workers if t <= self.seconds]


@dataclass(frozen=True, slots=True)
class Validity:
    """Whether the live driver kept to the trace, and what the process used."""

    lateness_p99_s: float
    lateness_max_s: float
    bound_s: float
    """p99 lateness above this: INVALID."""
    wall_s: float
    cpu_s: float
    """CPU time over the replay: all threads of the replay's process and of its worker
    processes (process workers)."""
    loop_cpu_s: float
    """CPU time of the event loop's thread (driver, decisions, routing)."""
    cpus: int
    own_cpu_s: float = 0.0
    """CPU time of the replay's own process, all its threads: the loop and the workers'
    threads that build each batch and hand it over (with process workers, what shares one
    GIL; with thread workers, the sessions' runs too)."""
    lateness_by_second: tuple[float, ...] = ()
    """p99 lateness (s) of the requests of each second of the trace (0 where none arrived):
    whether the driver fell behind in the bursts or all along."""

    @property
    def valid(self) -> bool:
        """The driver sent the requests on time (p99 within the bound)."""
        return self.lateness_p99_s <= self.bound_s

    @property
    def cores(self) -> float:
        """Cores the process and its workers kept busy on average."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Overhead:
    """PARD's decision time against end-to-end latency, live."""

    completed: int
    """Requests behind the per-request ratios (completed ones)."""
    mean_ratio: float
    p99_ratio: float
    decide_s: float
    """Decision time over every request and module."""
    e2e_s: float
    """End-to-end time of every request (until its drop for a dropped one)."""
    requests: int
    exchange_s: float
    """State exchange and w_k refreshes on the loop, off the requests' path."""

    @property
    def total_ratio(self) -> float:
        """All decision time over all end-to-end time."""
        return self.decide_s / self.e2e_s if self.e2e_s > 0 else 0.0

    @property
    def per_request_us(self) -> float:
        """Mean decision time of a request, over all modules."""
        return self.decide_s / self.requests * 1e6 if self.requests else 0.0


def gap(live: float, sim: float) -> float:
    """(live - sim) / sim; 0 when both are 0, inf when only the simulator's is."""
    if sim:
        return (live - sim) / sim
    return 0.0 if not live else math.inf


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Both sides of one policy."""

    policy: str
    live: SideDigest
    sim: SideDigest | None
    validity: Validity
    overhead: Overhead
    snapshot: dict[str, Any]

    def gaps(self) -> tuple[float, float]:
        """Goodput and drop-rate gaps (NaN without the simulator)."""
        if self.sim is None:
            return math.nan, math.nan
        return (
            gap(self.live.goodput_rps, self.sim.goodput_rps),
            gap(self.live.drop_rate, self.sim.drop_rate),
        )

    def verdict(self, tolerance: float) -> str:
        """INVALID, PASS or FAIL (- without the simulator)."""
        if not self.validity.valid:
            return "INVALID"
        if self.sim is None:
            return "-"
        good, drop = self.gaps()
        drop_ok = abs(drop) <= tolerance or (
            abs(self.live.drop_rate - self.sim.drop_rate) <= DROP_FLOOR
        )
        return "PASS" if abs(good) <= tolerance and drop_ok else "FAIL"

    def line(self, tolerance: float) -> str:
        """One line for the console, as soon as the policy has run."""
        lv, sm = self.live, self.sim
        text = (
            f"{self.policy:12} live goodput {lv.goodput_rps:6.1f} req/s drop {lv.drop_rate:6.1%} "
            f"invalid {lv.invalid_rate:6.1%}"
        )
        if sm is not None:
            good, drop = self.gaps()
            text += (
                f" | sim {sm.goodput_rps:6.1f} req/s drop {sm.drop_rate:6.1%} "
                f"invalid {sm.invalid_rate:6.1%} | gap {_pct(good)} {_pct(drop)}"
            )
        v, o = self.validity, self.overhead
        return (
            f"{text} | lateness p99 {v.lateness_p99_s * 1e3:.1f} ms, "
            f"decisions {o.mean_ratio:.3%} of e2e | {self.verdict(tolerance)}"
        )


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:+.1%}")


def _workers_cell(side: SideDigest, modules: Sequence[str]) -> str:
    return " ".join(f"{m}:{side.workers_peak(m)}/{side.workers_mean(m):.1f}" for m in modules)


def _side_row(r: PolicyResult, side: SideDigest, modules: Sequence[str], tol: float) -> list:
    good, drop = r.gaps()
    live = side.side == "live"
    return [
        r.policy,
        side.side,
        side.requests,
        f"{side.goodput_rps:.1f}",
        f"{side.drop_rate:.1%}",
        f"{side.invalid_rate:.1%}",
        side.on_time,
        side.late,
        side.dropped,
        _workers_cell(side, modules),
        _pct(good) if live else "",
        _pct(drop) if live else "",
        r.verdict(tol) if live else "",
    ]


def _setup_lines(setup: LiveSetup, trace: Trace, args: argparse.Namespace) -> list[str]:
    env = setup.profile.environment
    w = setup.workers
    if isinstance(w, ScalingConfig):
        workers = (
            f"auto: WorkerScaler from {w.min_workers} per module, at most {w.max_workers} per "
            f"module and {w.total_workers} in all, cold start {w.cold_start_s:g} s, headroom "
            f"{w.headroom:g}, a decision every {w.period_s:g} s (same settings on both sides)"
        )
    else:
        workers = f"{w} per module, fixed"
    rate = (
        f"--load {setup.load:g} x capacity {setup.capacity_rps:.1f} req/s"
        if setup.load is not None
        else f"--rate (capacity {setup.capacity_rps:.1f} req/s)"
    )
    lines = [
        f"- {len(trace):,} requests in {trace.duration_s:g} s: mean {setup.rate_rps:.1f} req/s "
        f"= {rate} at workers {setup.reach} (mu_k = b_k / d_k(b_k): "
        + ", ".join(f"{m}: {v:.0f}" for m, v in setup.worker_rps.items())
        + f" req/s); trace {args.trace}, seed {args.seed}",
        f"- SLO {setup.slo_s * 1000:g} ms; b_k (Nexus rule, both sides) {setup.max_batch}",
        f"- Workers: {workers}",
        f"- Live: onnxruntime ({args.providers}) on this machine, {env.intra_op_threads} "
        "intra-op thread(s) per session (the profile's), each worker's session in "
        + (
            "a process of its own"
            if setup.worker_mode == "process"
            else "a thread of the replay's process"
        )
        + f" (--worker-mode {getattr(args, 'worker_mode', setup.worker_mode)}); a fresh "
        "executor per policy",
        f"- Simulator: the same arrivals, profile `{setup.profile_path.name}` ({env.provider} "
        f"on {env.device}, {setup.profile.created_utc or 'undated'})",
        f"- Verdict: PASS when the goodput and drop-rate gaps are within {args.tolerance:.0%} "
        f"(drop rate also within {DROP_FLOOR:.1%} absolute); INVALID when the driver's p99 "
        f"lateness exceeds {args.lateness_bound:.0%} of the SLO",
    ]
    if setup.warnings:
        lines.append(
            "- **WARNING: the profile may not hold on this machine: "
            + "; ".join(setup.warnings)
            + ". The simulator side runs its durations, not this machine's.**"
        )
    return lines


def write_report(
    out: Path,
    setup: LiveSetup,
    trace: Trace,
    args: argparse.Namespace,
    results: Sequence[PolicyResult],
) -> str:
    """Write OUT/pard-live.md, the CSVs and PNGs; return the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    modules = list(setup.model.modules)
    tol = args.tolerance
    rows = []
    for r in results:
        rows.append(_side_row(r, r.live, modules, tol))
        if r.sim is not None:
            rows.append(_side_row(r, r.sim, modules, tol))
    side_by_side = md_table(
        [
            "policy",
            "side",
            "requests",
            "goodput req/s",
            "drop rate",
            "invalid rate",
            "on time",
            "late",
            "dropped",
            "workers per module (peak/mean)",
            "goodput gap",
            "drop-rate gap",
            "verdict",
        ],
        rows,
    )
    validity = md_table(
        [
            "policy",
            "lateness p99 ms",
            "max ms",
            "bound ms",
            "seconds over the bound",
            "process CPU (cores)",
            "replay process (cores)",
            "loop CPU",
            "sessions ran on",
            "valid",
        ],
        [
            [
                r.policy,
                f"{v.lateness_p99_s * 1e3:.2f}",
                f"{v.lateness_max_s * 1e3:.2f}",
                f"{v.bound_s * 1e3:.2f}",
                (
                    f"{sum(x > v.bound_s for x in v.lateness_by_second)} of "
                    f"{len(v.lateness_by_second)}"
                    if v.lateness_by_second
                    else "-"
                ),
                f"{v.cores:.2f} of {v.cpus}",
                f"{v.own_cpu_s / v.wall_s:.2f}" if v.wall_s else "-",
                f"{v.loop_cpu_s / v.wall_s:.0%}" if v.wall_s else "-",
                r.snapshot.get("provider", "?"),
                "yes" if v.valid else "INVALID",
            ]
            for r in results
            for v in [r.validity]
        ],
    )
    overhead = md_table(
        [
            "policy",
            "completed",
            "decision µs / request",
            "mean of ratio",
            "p99 of ratio",
            "total ratio",
            f"<= {OVERHEAD_TARGET:.2%}",
            "exchange + refresh ms (off path)",
        ],
        [
            [
                r.policy,
                o.completed,
                f"{o.per_request_us:.1f}",
                f"{o.mean_ratio:.4%}",
                f"{o.p99_ratio:.4%}",
                f"{o.total_ratio:.4%}",
                "yes" if max(o.mean_ratio, o.total_ratio) <= OVERHEAD_TARGET else "no",
                f"{o.exchange_s * 1e3:.1f}",
            ]
            for r in results
            for o in [r.overhead]
        ],
    )
    per_module = []
    for r in results:
        lv, sm = r.live, r.sim
        for m in modules:

            def both(f: Any, fmt: str = "{}", lv: SideDigest = lv, sm: Any = sm) -> str:
                a = fmt.format(f(lv))
                return a if sm is None else f"{a} / {fmt.format(f(sm))}"

            per_module.append(
                [
                    r.policy,
                    f"{setup.model.names[m]} ({m})",
                    setup.max_batch[m],
                    both(lambda s, m=m: s.mean_batch.get(m, 0.0), "{:.2f}"),
                    f"{lv.exec_vs_profile.get(m, 0.0):.2f}",
                    f"{lv.hop_ms.get(m, 0.0):.3f}",
                    both(lambda s, m=m: s.workers_peak(m)),
                    both(lambda s, m=m: s.workers_mean(m), "{:.2f}"),
                    both(lambda s, m=m: "{}/{}".format(*s.scaling_actions.get(m, (0, 0)))),
                    both(lambda s, m=m: s.drops_by_module.get(m, 0)),
                ]
            )
    modules_md = md_table(
        [
            "policy",
            "module",
            "b_k",
            "mean batch live / sim",
            "live exec / profile",
            "live hop ms / batch",
            "workers peak live / sim",
            "workers mean live / sim",
            "started/stopped live / sim",
            "drops live / sim",
        ],
        per_module,
    )
    _write_csvs(out, trace, results, modules, tol)
    snapshots = {r.policy: r.snapshot for r in results}  # the executors' own counters
    (out / "snapshots.json").write_text(json.dumps(snapshots, indent=1, default=str) + "\n")
    no_plots = plots.missing()  # a host without matplotlib still gets the tables
    if no_plots is None:
        _write_plots(out, setup, trace, args, results)
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png", ".json"))
    md = (
        "\n\n".join(
            [
                f"# PARD live vs simulator: {setup.pipeline}, {args.trace} trace",
                "\n".join(_setup_lines(setup, trace, args)),
                "## Side by side\n\n" + side_by_side,
                "## Validity of the live runs\n\nThe driver's lateness: when it sent each "
                "request against its trace time. Process CPU: all threads of the replay's "
                "process and of its worker processes over the replay's wall time; replay process: "
                "its own threads alone (the loop, and the workers' threads that build and hand "
                "over each batch: with process workers, the work that shares one GIL); loop "
                "CPU: the event loop's thread (driver, decisions, routing). Seconds over the "
                "bound: the seconds of the trace whose requests' p99 lateness exceeded it "
                "(`lateness_over_time.csv`: each second's p99 beside the offered rate).\n\n"
                + validity,
                "## Decision overhead, live\n\nPARD's decision calls (DEPQ push, planner "
                "context, form_batch, the recheck's decide) per request, summed over modules, "
                "against its end-to-end latency (trace time to answer): mean and p99 over the "
                "completed requests; total: all decision time over the end-to-end time of every "
                "request (a dropped one until its drop). State exchange and w_k refreshes run "
                "on the loop between requests (last column).\n\n" + overhead,
                "## Per module\n\n" + modules_md,
                "## Files\n\n"
                + ", ".join(f"`{f}`" for f in files)
                + (f" (no PNG: {no_plots})" if no_plots else ""),
            ]
        )
        + "\n"
    )
    (out / "pard-live.md").write_text(md, encoding="utf-8")
    return md


def _write_csvs(
    out: Path,
    trace: Trace,
    results: Sequence[PolicyResult],
    modules: Sequence[str],
    tolerance: float,
) -> None:
    rows = []
    for r in results:
        good, drop = r.gaps()
        v, o = r.validity, r.overhead
        for s in (r.live, r.sim):
            if s is None:
                continue
            live = s.side == "live"
            rows.append(
                [
                    r.policy,
                    s.side,
                    s.requests,
                    round(s.goodput_rps, 3),
                    round(s.drop_rate, 5),
                    round(s.invalid_rate, 5),
                    s.on_time,
                    s.late,
                    s.dropped,
                    s.failed,
                    *(v for m in modules for v in (s.workers_peak(m), round(s.workers_mean(m), 3))),
                    *(
                        (round(good, 5), round(drop, 5), r.verdict(tolerance))
                        if live
                        else ("", "", "")
                    ),
                    *(
                        (
                            round(v.lateness_p99_s * 1e3, 3),
                            round(v.lateness_max_s * 1e3, 3),
                            round(v.cores, 3),
                            round(v.own_cpu_s / v.wall_s, 3) if v.wall_s else "",
                        )
                        if live
                        else ("", "", "", "")
                    ),
                    *(
                        (round(o.mean_ratio, 7), round(o.p99_ratio, 7), round(o.total_ratio, 7))
                        if live
                        else ("", "", "")
                    ),
                ]
            )
    write_csv(
        out / "pard-live.csv",
        [
            "policy",
            "side",
            "requests",
            "goodput_rps",
            "drop_rate",
            "invalid_rate",
            "on_time",
            "late",
            "dropped",
            "failed",
            *(f"workers_{k}_{m}" for m in modules for k in ("peak", "mean")),
            "goodput_gap",
            "drop_rate_gap",
            "verdict",
            "lateness_p99_ms",
            "lateness_max_ms",
            "cpu_cores",
            "replay_process_cores",
            "decision_mean_ratio",
            "decision_p99_ratio",
            "decision_total_ratio",
        ],
        rows,
    )
    offered = trace.counts()
    sides = [s for r in results for s in (r.live, r.sim) if s is not None]
    write_csv(
        out / "goodput_over_time.csv",
        ["second", "offered", *(f"{s.policy}:{s.side}" for s in sides)],
        [
            [
                t,
                int(offered[t]) if t < len(offered) else 0,
                *(int(s.per_second[t]) if t < len(s.per_second) else 0 for s in sides),
            ]
            for t in range(int(trace.duration_s))
        ],
    )
    lates = [r for r in results if r.validity.lateness_by_second]
    if lates:
        write_csv(
            out / "lateness_over_time.csv",
            ["second", "offered", *(f"{r.policy}:p99_ms" for r in lates)],
            [
                [
                    t,
                    int(offered[t]) if t < len(offered) else 0,
                    *(
                        round(r.validity.lateness_by_second[t] * 1e3, 3)
                        if t < len(r.validity.lateness_by_second)
                        else ""
                        for r in lates
                    ),
                ]
                for t in range(int(trace.duration_s))
            ],
        )
    write_csv(
        out / "workers_over_time.csv",
        ["policy", "side", "time_s", *modules],
        [
            [s.policy, s.side, round(t, 3), *(w[m] for m in modules)]
            for s in sides
            for t, w in s.workers
            if t <= s.seconds
        ],
    )


def _write_plots(
    out: Path,
    setup: LiveSetup,
    trace: Trace,
    args: argparse.Namespace,
    results: Sequence[PolicyResult],
) -> None:
    offered = [(float(t), float(v)) for t, v in enumerate(trace.counts())]
    late = [r.policy for r in results if not r.validity.valid]
    note = f"INVALID (driver late): {', '.join(late)}" if late else ""
    goodput = {}
    workers = {}
    for r in results:
        series = {"live": [(float(t), v) for t, v in enumerate(r.live.per_second)]}
        wseries = {"live": r.live.total_workers()}
        if r.sim is not None:
            series["sim"] = [(float(t), v) for t, v in enumerate(r.sim.per_second)]
            wseries["sim"] = r.sim.total_workers()
        series["offered"] = offered
        goodput[r.policy] = series
        workers[r.policy] = wseries
    where = f"{setup.pipeline}, {args.trace}"
    plots.line_panels(
        out / "goodput_over_time.png",
        goodput,
        title=f"Goodput (within SLO) per second, live vs simulator ({where})",
        xlabel="time (s)",
        ylabel="requests / s",
        ncols=2,
        note=note,
    )
    plots.line_panels(
        out / "workers_over_time.png",
        workers,
        title=f"Serving workers over all modules, live vs simulator ({where})",
        xlabel="time (s)",
        ylabel="workers",
        ncols=2,
        note=note,
    )
