"""The registry of named experiments and their entry point (``tailgate sim experiment``).

Each experiment module exports its `Experiment` objects in ``EXPERIMENTS``; `MODULES` lists
the modules, so a new experiment is found by being in one of them (or a new module added
here). The experiment modules import the shared machinery (`loadtests.sim.experiments`)
and the output helpers (`loadtests.sim.output`), never this module or each other.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtests.sim import (
    fanout_experiments,
    ladder_experiments,
    overload_experiments,
    pard_experiments,
    qlm_experiments,
    request_experiments,
    swayam_experiments,
    tenant_experiments,
)
from loadtests.sim.experiments import (
    APPS,
    BUDGET_TITLE,
    DEFAULT_DATA_DIR,
    DEFAULT_SEEDS,
    DEFAULT_TOL,
    HIGH,
    LOW,
    Experiment,
    Settings,
    default_queries,
)
from loadtests.sim.pard_experiments import run_pipeline_experiment
from loadtests.sim.progress import format_duration
from loadtests.sim.report import MIN_TAIL_SAMPLES
from loadtests.sim.scenario import load_scenario

__all__ = ["EXPERIMENTS", "MODULES", "run_experiment"]

MODULES = (
    fanout_experiments,
    overload_experiments,
    qlm_experiments,
    ladder_experiments,
    request_experiments,
    tenant_experiments,
    swayam_experiments,
    pard_experiments,
)
"""Every module that defines experiments, in the order `sim experiment list` shows them."""

EXPERIMENTS: dict[str, Experiment] = {e.name: e for m in MODULES for e in m.EXPERIMENTS}
"""Every experiment by name."""
assert len(EXPERIMENTS) == sum(len(m.EXPERIMENTS) for m in MODULES), "experiment names repeat"


def _first_missing(folder: Path) -> Path | None:
    """The outermost of `folder` and its parents that does not exist yet (None: it exists)."""
    missing = None
    for d in (folder, *folder.parents):
        if d.exists():
            break
        missing = d
    return missing


def run_experiment(
    name: str,
    out: str | Path,
    data_dir: str | Path | None = None,
    queries: int | None = None,
    apps: Sequence[str] | None = None,
    *,
    tol: float = DEFAULT_TOL,
    workers: int = 2,
    budget: bool = True,
    quiet: bool = False,
    seeds: int = DEFAULT_SEEDS,
    scaling: bool = True,
) -> Path:
    """Run a named experiment into OUT/NAME/ and print its tables; the markdown file's path.

    `scaling` False keeps a PARD experiment's workers fixed (`pard_experiments`)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment: unknown {name!r} (known: {', '.join(EXPERIMENTS)})")
    exp = EXPERIMENTS[name]
    if exp.pipeline:  # no scenario: the pipeline spec and profile (pard_experiments)
        return run_pipeline_experiment(
            exp,
            out,
            data_dir,
            queries,
            apps,
            workers=workers,
            quiet=quiet,
            scaling=scaling,
            seeds=seeds,
        )
    if not 0 < tol < HIGH - LOW:
        raise ValueError(f"tol: must be in (0, {HIGH - LOW:g}), got {tol}")
    chosen = tuple(a.strip().lower() for a in apps) if apps else exp.apps
    unknown = [a for a in chosen if a not in APPS]
    if unknown:
        raise ValueError(f"apps: unknown {', '.join(unknown)} (known: {', '.join(APPS)})")
    runnable = tuple(a for a in chosen if a in exp.apps)
    if not runnable:
        raise ValueError(f"apps: {name} runs only {', '.join(exp.apps)}, got {', '.join(chosen)}")
    if seeds < 1:
        raise ValueError(f"seeds: must be >= 1, got {seeds}")
    if exp.pool:
        from loadtests.sim.pool import load_pool_scenario

        base: Any = load_pool_scenario(exp.scenario_path)
        n = exp.queries if queries is None else queries
    else:
        base = load_scenario(exp.scenario_path)
        n = queries if queries is not None else exp.queries or default_queries(base)
        base = replace(base, run=replace(base.run, queries=n))  # RunSpec checks n first
    st = Settings(
        out_dir=Path(out) / name,
        data_dir=Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR,
        apps=runnable,
        queries=n,
        tol=tol,
        workers=max(1, workers),
        budget=budget,
        quiet=quiet,
        seeds=tuple(_first_seed(base) + i for i in range(seeds)),
    )
    for app in runnable:
        if exp.pool:
            if not (st.data_dir / f"{app}_quantiles.txt").is_file():
                raise ValueError(f"Tailbench service times for {app} not found in {st.data_dir}")
        else:
            st.scenario(base, app)  # a missing data file fails now, not after minutes of runs
    made = _first_missing(st.out_dir)
    st.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.monotonic()
        sections = exp.body(st, base)
        text = _markdown(exp, st, base, sections, time.monotonic() - t0)
        md = st.out_dir / f"{name}.md"
        md.write_text(text, encoding="utf-8")
    except BaseException:
        if made is not None:  # a run that fails leaves no folder it made, half-written
            shutil.rmtree(made, ignore_errors=True)
        raise
    if not quiet:
        print(text)
    return md


def _first_seed(base: Any) -> int:
    """The scenario's own seed (a pool scenario has none: 1)."""
    run = getattr(base, "run", None)
    return int(run.seed) if run is not None else 1


def _markdown(exp: Experiment, st: Settings, base: Any, sections: list[str], wall_s: float) -> str:
    """The experiment's markdown report: setup, tables, files."""
    files = sorted(p.name for p in st.out_dir.iterdir() if p.suffix in (".csv", ".png"))
    files_md = "## Files\n\n" + ", ".join(f"`{f}`" for f in files)
    if not exp.searches_max_load:
        head = [
            f"# {exp.name}: {exp.title}",
            "",
            f"- Scenario: `loadtests/scenarios/{exp.name}.toml` ({base.description})",
            f"- Service times from `{st.data_dir}`"
            + (
                ""
                if exp.pool
                else f"; {st.queries:,} queries per simulation, seeds "
                + ", ".join(map(str, st.seeds))
            ),
            f"- Wall time: {format_duration(wall_s)} with {st.workers} worker process(es)",
        ]
        return "\n".join(head) + "\n\n" + "\n\n".join([*sections, files_md]) + "\n"
    run = base.run
    budget = ""
    if st.budget and exp.name != "fanout-single-class":
        budget = f" Column `{BUDGET_TITLE}`: TF-EDFQ with run-time budget adjustment."
    setup = [
        f"# {exp.name}: {exp.title}",
        "",
        f"- Scenario: `loadtests/scenarios/{exp.name}.toml` ({base.description})",
        f"- Applications: {', '.join(st.apps)}; service times `{st.data_dir}/<app>_quantiles.txt`",
        f"- Queries per simulation: {st.queries:,} (the first {run.warmup:.0%} are warm-up); "
        f"seeds {', '.join(map(str, st.seeds))}: every run of one app and seed sees the same "
        "queries (common random numbers), and each table entry is the mean over the seeds "
        "± the 95% confidence interval of the mean",
        f"- Max load: bisection of the load over [{LOW:g}, {HIGH:g}] until the bracket is "
        f"narrower than {st.tol:g}; a load passes when each class's p99, and that of each of "
        f"its fanout types with at least {MIN_TAIL_SAMPLES} samples beyond the p99, meets the "
        f"SLO.{budget}",
        f"- Wall time: {format_duration(wall_s)} with {st.workers} worker process(es)",
    ]
    return "\n".join(setup) + "\n\n" + "\n\n".join([*sections, files_md]) + "\n"
