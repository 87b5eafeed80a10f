"""The named experiments of TailGuard §IV, end to end: CSV, markdown and PNG files.

Each experiment starts from a shipped scenario (``loadtests/scenarios/NAME.toml``),
swaps in each Tailbench application's measured service times, and finds max
loads by bisection (``maxload.find_max_load``) or by load sweeps. Every run of
one scenario sees the same queries (common random numbers), so policies are
compared on paired samples. Independent searches run in worker processes.
"""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import queue
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from loadtests.sim.budget import simulate_with_budget
from loadtests.sim.engine import SimResult
from loadtests.sim.maxload import ci95, find_max_load
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.progress import ProgressBar
from loadtests.sim.report import MIN_TAIL_SAMPLES, Report, TailStat, report, thin_group
from loadtests.sim.scenario import Scenario
from loadtests.sim.tailbench import APPS as APPS  # the experiments' applications
from loadtests.sim.tailbench import TAILBENCH_DIR
from taskserver.queues import QueuePolicy
from taskserver.service_time import ServiceSpec

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
DEFAULT_DATA_DIR = TAILBENCH_DIR
"""Where the Tailbench quantile files are: the tables shipped with the package."""
DEFAULT_TOL = 0.01
"""Bisection bracket width: finer than the p99 noise of the rarest fanout type."""
LOW, HIGH = 0.02, 0.98
"""Load range every bisection searches."""
RAREST_SAMPLES = 10_000
"""Default query counts give the rarest judged group this many samples (100 beyond p99)."""
DEFAULT_SEEDS = 3
"""Each search runs on this many seeds; tables show the mean and its 95% CI."""

# SLO sweeps (ms). Masstree's is the product issue's; Shore's and Xapian's were
# picked by trial runs so that max loads fall within roughly 20-60%.
SINGLE_CLASS_SLOS_MS = {
    "masstree": (0.8, 1.0, 1.2, 1.4),
    "shore": (4.5, 5.0, 6.0, 8.0),
    "xapian": (6.5, 7.5, 9.0, 11.0),
}
# Class I's SLO x (class II has 1.5x); two points per app to bound the run time.
TWO_CLASS_SLOS_MS = {"masstree": (1.0, 1.2), "shore": (5.0, 6.0), "xapian": (7.5, 9.0)}
FIXED_FANOUT_SLOS_MS = {"masstree": (1.0, 1.5), "shore": (6.0, 10.0), "xapian": (10.0, 15.0)}
SWEEP_LOADS = tuple(round(0.1 + 0.05 * i, 2) for i in range(17))
"""Loads of the p99-vs-load curves: 0.10 .. 0.90."""
FAR_PAST_SLO = 2.0
"""A sweep stops once every class's p99 exceeds this multiple of its SLO."""
ALL_POLICIES = (QueuePolicy.FIFO, QueuePolicy.PRIQ, QueuePolicy.T_EDFQ, QueuePolicy.TF_EDFQ)
POLICY_TITLES = {
    QueuePolicy.FIFO: "FIFO",
    QueuePolicy.PRIQ: "PRIQ",
    QueuePolicy.T_EDFQ: "T-EDFQ",
    QueuePolicy.TF_EDFQ: "TF-EDFQ",
}
BUDGET_TITLE = "TF-EDFQ+budget"


# --- What the experiments keep of a run --------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunSummary:
    """The tails of one run, without its per-query arrays (cheap to send between processes)."""

    load: float
    met: bool
    classes: dict[str, TailStat]
    fanout_types: dict[str, dict[str, TailStat]]
    percentile: dict[str, float]
    """SLO percentile of each class."""

    @classmethod
    def of(cls, rep: Report) -> RunSummary:
        """Summarise a report."""
        scn = rep.result.scenario
        pct = {c.name: c.percentile for c in scn.classes}
        return cls(rep.result.load, rep.met, rep.classes, rep.fanout_types, pct)

    def class_met(self, name: str) -> bool:
        """The class and each of its fanout types were judged and meet the SLO."""
        types = self.fanout_types.get(name, {}).values()
        return self.classes[name].verdict == "met" and all(t.verdict == "met" for t in types)


@dataclass(frozen=True, slots=True)
class Search:
    """A max-load search: the load found, its bracket, the runs, the tails at the max.

    Over several seeds (``combine``): max_load is their mean, per_seed each seed's, the
    bracket spans theirs, and at_max is the first seed's run at its max load.
    """

    max_load: float
    bracket: tuple[float, float]
    probes: list[tuple[float, bool]]
    at_max: RunSummary | None
    per_seed: tuple[float, ...] = ()
    unjudged: int = 0
    """Probes whose verdict was "unjudged" (counted as not met)."""
    warning: str = ""
    """The first unjudged probe's warning (which groups were too thin)."""

    def ci95(self) -> float:
        """Half-width of the 95% confidence interval of the mean over seeds (0: one seed)."""
        return ci95(self.per_seed)

    @classmethod
    def combine(cls, searches: Sequence[Search]) -> Search:
        """One search per seed, as one figure: the mean and its spread."""
        if len(searches) == 1:
            return searches[0]
        loads = tuple(s.max_load for s in searches)
        return cls(
            statistics.fmean(loads),
            (min(s.bracket[0] for s in searches), max(s.bracket[1] for s in searches)),
            [p for s in searches for p in s.probes],
            searches[0].at_max,
            loads,
            sum(s.unjudged for s in searches),
            next((s.warning for s in searches if s.warning), ""),
        )


def rarest_share(scn: Scenario) -> float:
    """Share of the queries in the scenario's rarest judged group (class x fanout type)."""
    shares = [c.share for c in scn.classes]
    cls = min(shares) / sum(shares)
    ks, ps = scn.fanout.values_and_probs()
    edges = list(scn.fanout.edges())
    types = [0.0] * len(edges)
    for k, p in zip(ks, ps, strict=True):
        types[max(i for i, e in enumerate(edges) if e <= k)] += p
    return cls * min(t for t in types if t > 0)


def default_queries(scn: Scenario, samples: int = RAREST_SAMPLES) -> int:
    """Queries per run so that the rarest judged group keeps `samples` after the warm-up.

    The group's count is binomial: aiming 4 standard deviations above `samples` keeps it at
    `samples` or more on all but about 3 seeds in 100,000.
    """
    share = rarest_share(scn) * (1.0 - scn.run.warmup)
    return math.ceil((samples + 4.0 * math.sqrt(samples)) / share)


@dataclass(frozen=True, slots=True)
class GroupSearch:
    """Max load of several groups (each class, and "all") from shared bisection probes."""

    brackets: dict[str, tuple[float, float]]
    """Group -> (highest load met, lowest load above it not met); over seeds, the mean."""
    runs: list[RunSummary]
    per_seed: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Group -> each seed's highest load met (``combine``)."""

    @classmethod
    def combine(cls, searches: Sequence[GroupSearch]) -> GroupSearch:
        """One search per seed, as one: each group's mean and the per-seed values."""
        if len(searches) == 1:
            return searches[0]
        groups = list(searches[0].brackets)
        per_seed = {g: tuple(s.brackets[g][0] for s in searches) for g in groups}
        brackets = {
            g: (statistics.fmean(per_seed[g]), statistics.fmean(s.brackets[g][1] for s in searches))
            for g in groups
        }
        return cls(brackets, searches[0].runs, per_seed)


# --- Jobs (run in worker processes; progress goes back through a queue) ------------------

_events: Any = None
"""Where a job reports each finished simulation: a multiprocessing queue, or a local sink."""


def _init_worker(events: Any) -> None:
    """Worker process start: remember where to report finished simulations."""
    global _events
    _events = events


def _tick(job: int) -> None:
    if _events is not None:
        _events.put(job)


def _runner(job: int) -> Callable[[Scenario, float, str], SimResult]:
    """simulate_with_budget, reporting each finished run of this job to the progress bar."""

    def run(scn: Scenario, load: float, policy: str) -> SimResult:
        res = simulate_with_budget(scn, load, policy)
        _tick(job)
        return res

    return run


def max_load_job(job: int, scn: Scenario, policy: str, tol: float) -> dict[str, Any]:
    """One bisection of a scenario's max load as a worker job: the max load, its bracket,
    the utilisation of the run at it and the first unjudged probe's warning."""
    m = find_max_load(scn, policy, lo=LOW, hi=HIGH, tol=tol, run=_runner(job))
    at = m.at_max
    return {
        "max_load": m.max_load,
        "bracket": list(m.bracket),
        "utilisation": at.result.utilisation if at is not None and m.max_load > 0 else math.nan,
        "unjudged": m.unjudged[0][1] if m.unjudged else "",
    }


def _search(job: int, scn: Scenario, policy: str, tol: float) -> Search:
    """Bisect the max load of one policy over [LOW, HIGH]."""
    m = find_max_load(scn, policy, lo=LOW, hi=HIGH, tol=tol, run=_runner(job))
    at_max = RunSummary.of(m.at_max) if m.at_max is not None else None
    warning = m.unjudged[0][1] if m.unjudged else ""
    return Search(
        m.max_load, m.bracket, list(m.probes), at_max, unjudged=len(m.unjudged), warning=warning
    )


def _sweep_then_search(
    job: int, scn: Scenario, policy: str, loads: Sequence[float], tol: float
) -> tuple[list[RunSummary], Search]:
    """A p99-vs-load curve, then a bisection inside the bracket the curve found."""
    run = _runner(job)
    seen: dict[float, SimResult] = {}

    def cached(s: Scenario, load: float, p: str) -> SimResult:
        # The bisection starts from two loads the sweep already ran.
        if load not in seen:
            seen[load] = run(s, load, p)
        return seen[load]

    curve: list[RunSummary] = []
    lo, hi = LOW, HIGH
    for load in loads:
        summary = RunSummary.of(report(cached(scn, load, policy)))
        curve.append(summary)
        if summary.met and hi == HIGH:
            lo = load
        elif hi == HIGH:
            hi = load
        if all(s.latency_ms > FAR_PAST_SLO * s.slo_ms for s in summary.classes.values()):
            break
    m = find_max_load(scn, policy, lo=min(lo, hi), hi=hi, tol=tol, run=cached)
    at_max = RunSummary.of(m.at_max) if m.at_max is not None else None
    warning = m.unjudged[0][1] if m.unjudged else ""
    search = Search(
        m.max_load, m.bracket, list(m.probes), at_max, unjudged=len(m.unjudged), warning=warning
    )
    return curve, search


def _group_search(job: int, scn: Scenario, policy: str, tol: float) -> GroupSearch:
    """Max load of each class and of all together, bisecting with probes shared by groups.

    Each probe narrows every group whose bracket contains it, so a class whose
    max load is near another's costs few extra runs.
    """
    run = _runner(job)
    groups = [c.name for c in scn.classes] + ["all"]
    runs: list[RunSummary] = []

    def probe(load: float) -> RunSummary:
        runs.append(RunSummary.of(report(run(scn, load, policy))))
        return runs[-1]

    def ok(s: RunSummary, g: str) -> bool:
        return s.met if g == "all" else s.class_met(g)

    first, last = probe(LOW), probe(HIGH)
    brackets: dict[str, tuple[float, float]] = {}
    for g in groups:
        if not ok(first, g):
            brackets[g] = (0.0, LOW)
        elif ok(last, g):
            brackets[g] = (HIGH, HIGH)
        else:
            brackets[g] = (LOW, HIGH)
    while True:
        open_ = [g for g in groups if brackets[g][0] > 0 and brackets[g][1] - brackets[g][0] > tol]
        if not open_:
            break
        lo, hi = max((brackets[g] for g in open_), key=lambda b: b[1] - b[0])
        mid = (lo + hi) / 2.0
        s = probe(mid)
        for g in open_:
            glo, ghi = brackets[g]
            if glo < mid < ghi:
                brackets[g] = (mid, ghi) if ok(s, g) else (glo, mid)
    return GroupSearch(brackets, runs)


def _bisection_runs(width: float, tol: float) -> int:
    """Simulations a bisection of this bracket makes (for the progress bar)."""
    return 2 + max(0, math.ceil(math.log2(width / tol)))


@dataclass(slots=True)
class _Pool:
    """Runs jobs in worker processes (or here, with one worker) behind one progress bar."""

    workers: int
    label: str
    quiet: bool = False
    jobs: list[tuple[Callable[..., Any], tuple[Any, ...], int]] = field(default_factory=list)

    def add(self, fn: Callable[..., Any], args: tuple[Any, ...], runs: int) -> None:
        """Queue fn(job, *args), expected to make about `runs` simulations."""
        self.jobs.append((fn, args, runs))

    def run(self) -> list[Any]:
        """Every job's result, in the order added."""
        global _events
        estimates = [r for _, _, r in self.jobs]
        seen = [0] * len(self.jobs)
        finished = [False] * len(self.jobs)
        stream = io.StringIO() if self.quiet else sys.stderr
        bar = ProgressBar(sum(estimates), f"{self.label} (simulations)", stream=stream)

        def redraw() -> None:
            # A finished job counts as its estimate, so the total never moves.
            states = zip(estimates, seen, finished, strict=True)
            bar.update(sum(e if f else min(s, e - 1) for e, s, f in states))

        try:
            if self.workers <= 1 or len(self.jobs) <= 1:
                results = []

                def tick(job: int) -> None:
                    seen[job] += 1
                    redraw()

                _events = SimpleNamespace(put=tick)  # no workers: count straight into the bar
                for i, (fn, args, _) in enumerate(self.jobs):
                    results.append(fn(i, *args))
                    finished[i] = True
                    redraw()
                return results
            ctx = mp.get_context("spawn")  # no fork of a process that may hold threads
            events = ctx.Queue()
            with ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_init_worker, initargs=(events,)
            ) as pool:
                futures: dict[Future[Any], int] = {
                    pool.submit(fn, i, *args): i for i, (fn, args, _) in enumerate(self.jobs)
                }
                pending = set(futures)
                try:
                    while pending:
                        done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                        _drain(events, seen)
                        for f in done:
                            f.result()  # raise a worker's error here, at once
                            finished[futures[f]] = True
                        redraw()
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
                return [f.result() for f in futures]
        finally:
            _events = None
            bar.close()


def _drain(events: Any, seen: list[int]) -> None:
    """Count the finished simulations workers have reported so far."""
    while True:
        try:
            seen[events.get_nowait()] += 1
        except queue.Empty:
            return


# --- Settings shared by the experiments --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """How one experiment runs."""

    out_dir: Path
    """Folder of this experiment's files (OUT/NAME)."""
    data_dir: Path
    """Folder with the Tailbench *_quantiles.txt files."""
    apps: tuple[str, ...]
    """Applications to run."""
    queries: int
    """Queries per simulation."""
    tol: float
    """Bisection bracket width."""
    workers: int
    """Worker processes."""
    budget: bool
    """Also search TF-EDFQ with run-time budget adjustment (experiments 2-4)."""
    quiet: bool
    """No progress bar and no markdown on stdout."""
    seeds: tuple[int, ...] = (1,)
    """Seeds each search or run repeats on (its own queries each); tables show the spread."""

    def seeded(self, scn: Scenario) -> list[Scenario]:
        """The scenario on each of the seeds."""
        return [replace(scn, run=replace(scn.run, seed=seed)) for seed in self.seeds]

    def scenario(self, base: Scenario, app: str) -> Scenario:
        """The base scenario with this app's service times and the query count."""
        path = self.data_dir / f"{app}_quantiles.txt"
        if not path.is_file():
            raise ValueError(f"Tailbench service times for {app} not found: {path} (--data-dir)")
        scn = base.with_service(ServiceSpec(kind="quantiles", path=str(path)))
        return replace(scn, run=replace(scn.run, queries=self.queries))

    def pool(self, label: str) -> _Pool:
        """A job pool with this experiment's workers and progress bar."""
        return _Pool(self.workers, label, self.quiet)

    def columns(self, policies: Sequence[str]) -> list[tuple[str, bool]]:
        """(policy, budget_adjust) per column; TF-EDFQ with budget adjustment last if asked."""
        cols = [(p, False) for p in policies]
        return [*cols, (QueuePolicy.TF_EDFQ, True)] if self.budget else cols


def with_slos(scn: Scenario, slos_ms: Sequence[float]) -> Scenario:
    """The scenario with its classes' SLOs set, in class order."""
    if len(slos_ms) != len(scn.classes):
        raise ValueError(f"slos_ms: {len(scn.classes)} classes, got {list(slos_ms)}")
    classes = tuple(replace(c, slo_ms=s) for c, s in zip(scn.classes, slos_ms, strict=True))
    return replace(scn, classes=classes)


def with_budget(scn: Scenario, on: bool = True) -> Scenario:
    """The scenario with the run-time budget controller switched on (or left as is)."""
    return replace(scn, run=replace(scn.run, budget_adjust=True)) if on else scn


def _title(policy: str, budget: bool) -> str:
    return BUDGET_TITLE if budget else POLICY_TITLES[policy]


def _fmt(load: float, search: Search | None = None) -> str:
    """A max load for a table; the ends of the searched range say so; ± its 95% CI."""
    if load >= HIGH:
        return f">= {HIGH:g}"
    if load <= 0:
        return f"< {LOW:g}"
    text = f"{load:.3f}"
    if search is not None and len(search.per_seed) > 1:
        text += f" ± {search.ci95():.3f}"
    if search is not None and search.unjudged:
        text += " (unjudged probes)"
    return text


def _gain(base: float, new: float) -> str:
    return f"{new / base - 1:+.0%}" if base > 0 else "n/a"


# --- Tables ------------------------------------------------------------------------------

Labels = dict[str, Any]
"""What identifies a search: app, SLO, arrivals, policy, budget_adjust..."""
Found = list[tuple[Labels, Search]]

_TAIL_COLUMNS = "class fanout_type p_latency_ms class_slo_ms samples samples_beyond_p judged met"
TAIL_HEADER = _TAIL_COLUMNS.split()
"""Columns of one class or fanout type's tail at one run."""


def _beyond(s: TailStat, percentile: float) -> int:
    """Samples beyond the percentile: how many queries the p99 figure rests on."""
    return int(s.samples * (1.0 - percentile / 100.0))


def _tail_rows(at: RunSummary | None) -> list[list[Any]]:
    """Rows (TAIL_HEADER) of every class, and each of its fanout types, at one run."""
    if at is None:
        return []
    rows = []
    for cname, stat in at.classes.items():
        pct = at.percentile[cname]
        for tname, s in [("all", stat), *at.fanout_types.get(cname, {}).items()]:
            p = round(s.latency_ms, 4)
            rows.append([cname, tname, p, s.slo_ms, s.samples, _beyond(s, pct), s.enough, s.met])
    return rows


def _write_searches(st: Settings, found: Found) -> None:
    """maxload.csv (one row per search), tails_at_max_load.csv, probes.csv (one row per run)."""
    head = list(found[0][0]) if found else []
    search_rows, tail_rows, probe_rows = [], [], []
    for labels, s in found:
        key = list(labels.values())
        runs = len(s.probes)
        seeds = " ".join(f"{x:.4f}" for x in s.per_seed) or f"{s.max_load:.4f}"
        search_rows.append(
            [
                *key,
                round(s.max_load, 4),
                round(s.ci95(), 4),
                seeds,
                *(round(b, 4) for b in s.bracket),
                runs,
                st.queries,
                s.unjudged,
            ]
        )
        tail_rows += [[*key, round(s.max_load, 4), *r] for r in _tail_rows(s.at_max)]
        probe_rows += [[*key, round(load, 4), met] for load, met in s.probes]
    bracket = ["max_load", "ci95", "per_seed", "bracket_lo", "bracket_hi", "runs", "queries"]
    bracket.append("unjudged_probes")
    write_csv(st.out_dir / "maxload.csv", [*head, *bracket], search_rows)
    write_csv(st.out_dir / "tails_at_max_load.csv", [*head, "max_load", *TAIL_HEADER], tail_rows)
    write_csv(st.out_dir / "probes.csv", [*head, "load", "met"], probe_rows)


def _max_load_table(found: Found, row_keys: Sequence[str], row_header: Sequence[str]) -> str:
    """Markdown: one row per row_keys values, one column per (policy, budget), plus the gain."""
    cols: list[tuple[str, bool]] = []
    rows: dict[tuple[Any, ...], dict[tuple[str, bool], Search]] = {}
    for labels, s in found:
        col = (labels["policy"], bool(labels.get("budget_adjust", False)))
        if col not in cols:
            cols.append(col)
        rows.setdefault(tuple(labels[k] for k in row_keys), {})[col] = s
    out = []
    for key, found_here in rows.items():
        fifo = found_here.get((QueuePolicy.FIFO, False))
        tf = found_here.get((QueuePolicy.TF_EDFQ, False))
        gain = _gain(fifo.max_load if fifo else 0.0, tf.max_load if tf else 0.0)
        if any(s is not None and s.unjudged for s in (fifo, tf)):
            gain = "unjudged"  # two lower bounds compare to no finding
        cells = [
            _fmt(found_here[c].max_load, found_here[c]) if c in found_here else "-" for c in cols
        ]
        out.append([*key, *cells, gain])
    table = md_table([*row_header, *[_title(*c) for c in cols], "TF-EDFQ vs FIFO"], out)
    note = unjudged_note(found)
    return f"**{note}**\n\n{table}" if note else table


def unjudged_note(found: Found) -> str:
    """One loud line when searches rest on groups too thin to judge, else "".

    An unjudged probe counts as not met, so the max loads of those searches are lower
    bounds and a comparison of them is no finding (more --queries fixes it).
    """
    thin = [s for _, s in found if s.unjudged]
    if not thin:
        return ""
    return (
        f"UNJUDGED probes in {len(thin)} of {len(found)} searches: their max loads are lower "
        f"bounds, not findings (rerun with more --queries); e.g. "
        + thin[0].warning.removeprefix("UNJUDGED: ")
    )


def runs_note(runs: Sequence[RunSummary]) -> str:
    """The same line for runs of a sweep or a shared bisection: "" when every group of every
    run was judged."""
    thin = [
        (s, cname, tname, stat)
        for s in runs
        for cname, whole in s.classes.items()
        for tname, stat in [("all", whole), *s.fanout_types.get(cname, {}).items()]
        if not stat.enough
    ]
    if not thin:
        return ""
    s, cname, tname, stat = thin[0]
    n_runs = len({id(t[0]) for t in thin})
    group = thin_group(cname, tname, stat.samples, s.percentile[cname])
    return (
        f"UNJUDGED groups in {n_runs} of {len(runs)} runs, counted as not met: their max loads "
        f"are lower bounds, not findings (rerun with more --queries); e.g. {group}"
    )


def _samples_section(per_app: dict[str, RunSummary | None]) -> str:
    """Markdown: the queries behind each percentile, per app (the same in every run of it)."""
    parts = [
        "## Samples behind each percentile\n\nEvery run of one scenario simulates the same "
        "queries (common random numbers), so these counts hold for every policy and load; shown "
        "for each app's first scenario (`tails_at_max_load.csv` has them for every search). A "
        f"group is judged against its SLO when at least {MIN_TAIL_SAMPLES} samples lie beyond "
        "its p99."
    ]
    for app, at in per_app.items():
        if at is None:
            continue
        rows = []
        for cname, types in at.fanout_types.items():
            pct = at.percentile[cname]
            for tname, s in types.items():
                judged = "yes" if s.enough else "no (too few)"
                rows.append([cname, tname, f"{s.samples:,}", f"{_beyond(s, pct):,}", judged])
        header = ["class", "fanout type", "queries", "beyond p99", "judged"]
        parts.append(f"{app}:\n\n" + md_table(header, rows))
    return "\n\n".join(parts)


def _at_max_per_app(found: Found) -> dict[str, RunSummary | None]:
    """Each app's first run at a max load (for its sample counts)."""
    out: dict[str, RunSummary | None] = {}
    for labels, s in found:
        if out.get(labels["app"]) is None:
            out[labels["app"]] = s.at_max
    return out


def _searches(st: Settings, label: str, jobs: list[tuple[Labels, Scenario]]) -> Found:
    """Bisect the max load of each (labels, scenario) on every seed; labels name the policy."""
    pool = st.pool(label)
    for labels, scn in jobs:
        for seeded in st.seeded(scn):
            runs = _bisection_runs(HIGH - LOW, st.tol)
            pool.add(_search, (seeded, labels["policy"], st.tol), runs)
    results = pool.run()
    n = len(st.seeds)
    return [
        (labels, Search.combine(results[i * n : (i + 1) * n])) for i, (labels, _) in enumerate(jobs)
    ]


# --- Experiments ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Experiment:
    """A named experiment: its defaults and body (scenario: loadtests/scenarios/NAME.toml)."""

    name: str
    title: str
    queries: int
    """Default queries per simulation; 0: enough for RAREST_SAMPLES in the scenario's rarest
    judged group (default_queries)."""
    apps: tuple[str, ...]
    """Applications it runs."""
    body: Callable[[Settings, Any], list[str]]
    """Runs the simulations, writes CSV and PNG files, returns markdown sections."""
    pool: bool = False
    """Its scenario is a pool scenario (`loadtests.sim.pool`), not a fanout one."""
    pipeline: str = ""
    """A PARD experiment on this shipped pipeline (`loadtests.sim.pard_experiments`): no
    scenario file; apps are its traces and queries the requests per trace."""
    searches_max_load: bool = True
    """Its report describes the max-load search (bisection, judged groups); the overload
    experiments sweep offered load instead."""

    @property
    def scenario_path(self) -> Path:
        """The shipped scenario it starts from."""
        return SCENARIO_DIR / f"{self.name}.toml"
