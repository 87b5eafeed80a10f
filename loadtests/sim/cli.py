"""``tailgate sim``: run a scenario, find max loads, run the named experiments."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

from loadtests.sim.tailbench import resolve_table
from taskserver.queues import QueuePolicy
from taskserver.service_time import ServiceSpec
from taskserver.tomlconfig import ConfigError

POLICIES = [p.value for p in QueuePolicy]


def add_parser(sub: Any) -> None:
    """Register `sim run|maxload|experiment` under the tailgate CLI."""
    sim = sub.add_parser("sim", help="discrete-event simulator on the live policy code")
    simsub = sim.add_subparsers(dest="sim_command", required=True)

    p = simsub.add_parser("run", help="run a scenario at one load")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--load", type=float, required=True, help="λ·E[k_f]·E[service]/N, e.g. 0.5")
    p.add_argument("--policy", choices=POLICIES, help="override [run] policy")
    _common(p)
    p.set_defaults(func=cmd_run)

    p = simsub.add_parser("maxload", help="highest load meeting every SLO, per policy")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        help="policy to search (repeat for several; default: the scenario's)",
    )
    p.add_argument("--tol", type=float, default=0.005, help="bracket width to stop at (0.005)")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="repeat the search on this many seeds (the scenario's, then the next ones) and "
        "report the mean with its 95%% confidence interval (1)",
    )
    _common(p)
    p.set_defaults(func=cmd_maxload)

    p = simsub.add_parser("experiment", help="run a named experiment end to end")
    p.add_argument("name", help="experiment name, or 'list'")
    p.add_argument("--out", default="sim-results", help="output folder (sim-results)")
    p.add_argument(
        "--data-dir",
        help="folder with the Tailbench *_quantiles.txt files (default: the tables shipped "
        "in loadtests/sim/data/tailbench)",
    )
    p.add_argument("--queries", type=int, help="queries per run (default: per experiment)")
    p.add_argument("--apps", help="comma-separated subset of masstree,shore,xapian")
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="repeat every search and run on this many seeds; tables show the mean and its "
        "95%% confidence interval (3)",
    )
    p.add_argument(
        "--no-budget",
        action="store_true",
        help="leave out the TF-EDFQ+budget column (run-time budget adjustment, beyond the paper)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument(
        "--fixed-workers",
        action="store_true",
        help="PARD experiments: keep each module's workers fixed instead of scaling them at "
        "run time",
    )
    p.set_defaults(func=cmd_experiment)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queries", type=int, help="override [run] queries")
    p.add_argument("--seed", type=int, help="override [run] seed")
    p.add_argument(
        "--budget-adjust",
        action="store_true",
        help="adjust class budgets at run time (beyond the paper)",
    )
    p.add_argument(
        "--service-quantiles",
        metavar="FILE",
        help="use this quantile file as the service distribution (or tailbench:masstree, "
        "tailbench:shore, tailbench:xapian: a shipped table)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _scenario(args: argparse.Namespace) -> Any:
    from loadtests.sim.scenario import load_scenario

    scn = load_scenario(args.scenario)
    run = scn.run
    if args.queries is not None:
        run = replace(run, queries=args.queries)
    if args.seed is not None:
        run = replace(run, seed=args.seed)
    if args.budget_adjust:
        run = replace(run, budget_adjust=True)
    scn = replace(scn, run=run)
    if args.service_quantiles:
        try:
            path = resolve_table(args.service_quantiles)
        except ValueError as exc:
            raise ConfigError("--service-quantiles", str(exc)) from None
        scn = scn.with_service(ServiceSpec(kind="quantiles", path=path))
    return scn


def cmd_run(args: argparse.Namespace) -> int:
    """`tailgate sim run`."""
    from loadtests.sim.budget import simulate_with_budget
    from loadtests.sim.report import report

    try:
        scn = _scenario(args)
        if not args.load > 0:
            raise ConfigError("--load", f"must be > 0, got {args.load}")
        t = time.perf_counter()
        res = simulate_with_budget(scn, args.load, args.policy or scn.run.policy)
        elapsed = time.perf_counter() - t
    except (ConfigError, ValueError, OSError) as exc:
        print(f"tailgate sim: {exc}", file=sys.stderr)
        return 2
    rep = report(res)
    if args.json:
        doc = rep.to_json()
        doc["wall_s"] = elapsed
        print(json.dumps(doc, indent=2))
    else:
        print(rep.to_text())
        print(f"({elapsed:.2f} s wall, {res.tasks / max(elapsed, 1e-9) / 1e6:.2f} M tasks/s)")
    return 0 if rep.verdict != "unjudged" else 3


def cmd_maxload(args: argparse.Namespace) -> int:
    """`tailgate sim maxload`."""
    from loadtests.sim.budget import simulate_with_budget
    from loadtests.sim.maxload import max_load_over_seeds

    try:
        scn = _scenario(args)
        if args.seeds < 1:
            raise ConfigError("--seeds", f"must be >= 1, got {args.seeds}")
        seeds = [scn.run.seed + i for i in range(args.seeds)]
        policies = args.policy or [scn.run.policy]
        results = {}
        for pol in policies:

            def progress(policy: str, load: float, met: bool) -> None:
                if not args.json:
                    print(
                        f"  {policy}: load {load:.4f} {'met' if met else 'not met'}",
                        file=sys.stderr,
                    )

            results[pol] = max_load_over_seeds(
                scn, pol, seeds, tol=args.tol, run=simulate_with_budget, on_probe=progress
            )
    except (ConfigError, ValueError, OSError) as exc:
        print(f"tailgate sim: {exc}", file=sys.stderr)
        return 2
    unjudged = [(pol, r) for pol, s in results.items() for r in s.runs if r.unjudged]
    if args.json:
        doc: dict[str, Any] = {pol: s.mean for pol, s in results.items()}
        doc["details"] = {pol: s.to_json() for pol, s in results.items()}
        print(json.dumps(doc, indent=2))
    else:
        for pol, s in results.items():
            if len(s.runs) == 1:
                print(f"{pol:>8}: max load {s.runs[0].max_load:.3f} ({s.runs[0].confidence()})")
            else:
                print(f"{pol:>8}: {s.summary()}")
        for pol, r in unjudged:
            load, warning = r.unjudged[0]
            print(
                f"WARNING {pol}: {len(r.unjudged)} probe(s) could not be judged, counted as "
                f"not met (at load {load:.3f}: {warning})"
            )
    return 0 if not unjudged else 3


def cmd_experiment(args: argparse.Namespace) -> int:
    """`tailgate sim experiment`."""
    from loadtests.sim.registry import EXPERIMENTS, run_experiment

    if args.name == "list":
        for name, exp in EXPERIMENTS.items():
            print(f"{name}: {exp.title}")
        return 0
    if args.name not in EXPERIMENTS:
        print(
            f"tailgate sim: unknown experiment {args.name!r} (known: {', '.join(EXPERIMENTS)})",
            file=sys.stderr,
        )
        return 2
    from loadtests.sim.plots import missing

    problem = missing()
    if problem is not None:
        print(f"tailgate sim: {problem}", file=sys.stderr)
        return 2
    try:
        run_experiment(
            args.name,
            args.out,
            data_dir=args.data_dir,
            queries=args.queries,
            apps=args.apps.split(",") if args.apps else None,
            seeds=args.seeds,
            budget=not args.no_budget,
            workers=args.workers,
            scaling=not args.fixed_workers,
        )
    except (ConfigError, ValueError, OSError) as exc:
        print(f"tailgate sim: {exc}", file=sys.stderr)
        return 2
    return 0
