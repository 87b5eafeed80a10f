"""The TailGuard §IV experiments on fanout scenarios: max load by SLO, class and policy.

Bodies of the experiments registered in `loadtests.sim.experiments`, which holds the
shared machinery (worker pool, searches, tables).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from loadtests.sim.experiments import (
    ALL_POLICIES,
    APPS,
    FAR_PAST_SLO,
    FIXED_FANOUT_SLOS_MS,
    HIGH,
    LOW,
    POLICY_TITLES,
    SINGLE_CLASS_SLOS_MS,
    SWEEP_LOADS,
    TAIL_HEADER,
    TWO_CLASS_SLOS_MS,
    Experiment,
    Found,
    GroupSearch,
    Labels,
    RunSummary,
    Search,
    Settings,
    _at_max_per_app,
    _bisection_runs,
    _fmt,
    _group_search,
    _max_load_table,
    _samples_section,
    _search,
    _searches,
    _sweep_then_search,
    _tail_rows,
    _title,
    _write_searches,
    ci95,
    runs_note,
    unjudged_note,
    with_budget,
    with_slos,
)
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.report import TailStat
from loadtests.sim.scenario import Scenario
from taskserver.queues import QueuePolicy


def fanout_single_class(st: Settings, base: Scenario) -> list[str]:
    """Experiment 1: max load vs SLO, FIFO vs TF-EDFQ, one class, k_f 1/10/100."""
    jobs = []
    for app in st.apps:
        for slo in SINGLE_CLASS_SLOS_MS[app]:
            scn = with_slos(st.scenario(base, app), (slo,))
            jobs += [
                ({"app": app, "slo_ms": slo, "policy": p}, scn)
                for p in (QueuePolicy.FIFO, QueuePolicy.TF_EDFQ)
            ]
    found = _searches(st, "fanout-single-class", jobs)
    _write_searches(st, found)

    types = base.fanout.type_names()
    p99_rows = []
    lines: dict[str, dict[str, list[tuple[float, float]]]] = {}
    bars: dict[str, tuple[list[str], dict[str, list[float]]]] = {}
    refs: dict[str, list[float]] = {}
    for lab, s in found:
        app, slo, pol = lab["app"], lab["slo_ms"], POLICY_TITLES[lab["policy"]]
        at = s.at_max.fanout_types["I"] if s.at_max else {}
        p99_rows.append([app, slo, pol, _fmt(s.max_load), *[_p99_cell(at.get(t)) for t in types]])
        lines.setdefault(app, {}).setdefault(pol, []).append((slo, s.max_load))
        groups, series = bars.setdefault(f"{app} · {pol}", ([], {f"k={t}": [] for t in types}))
        groups.append(f"{slo:g}")
        refs.setdefault(f"{app} · {pol}", []).append(slo)
        for t in types:
            series[f"k={t}"].append(at[t].latency_ms if t in at else math.nan)

    from loadtests.sim import plots

    note = unjudged_note(found)
    plots.line_panels(
        st.out_dir / "max_load_vs_slo.png",
        lines,
        ylim=(0, 1),
        title="Max load vs p99 SLO (one class, k_f 1/10/100)",
        xlabel="p99 SLO (ms)",
        ylabel="max load",
        note=note,
    )
    plots.grouped_bars(
        st.out_dir / "fanout_p99_at_max_load.png",
        bars,
        refs=refs,
        ncols=2,
        title="p99 per fanout type at each policy's max load (dashed: SLO)",
        xlabel="p99 SLO (ms)",
        ylabel="p99 latency (ms)",
        note=note,
    )
    return [
        "## Max load per SLO\n\nHighest load (fraction of capacity) at which the p99 of the "
        "class and of every judged fanout type meets the SLO.\n\n"
        + _max_load_table(found, ["app", "slo_ms"], ["app", "SLO ms"]),
        "## p99 per fanout type at each policy's max load (ms)\n\n"
        "`*` marks a fanout type with too few samples to be judged.\n\n"
        + md_table(["app", "SLO ms", "policy", "max load", *[f"k={t}" for t in types]], p99_rows),
        _samples_section(_at_max_per_app(found)),
    ]


def _p99_cell(s: TailStat | None) -> str:
    return "-" if s is None else f"{s.latency_ms:.3f}" + ("" if s.enough else "*")


def fanout_two_classes(st: Settings, base: Scenario) -> list[str]:
    """Experiment 2: two classes (x, 1.5x), Poisson and Pareto, all four policies."""
    jobs = []
    for app in st.apps:
        for process in ("poisson", "pareto"):
            for x in TWO_CLASS_SLOS_MS[app]:
                scn = with_slos(st.scenario(base, app), (x, 1.5 * x))
                scn = replace(scn, arrivals=replace(scn.arrivals, process=process))
                for pol, budget in st.columns(ALL_POLICIES):
                    lab = {"app": app, "arrivals": process, "slo_x_ms": x, "policy": pol}
                    jobs.append(({**lab, "budget_adjust": budget}, with_budget(scn, budget)))
    found = _searches(st, "fanout-two-classes", jobs)
    _write_searches(st, found)

    bars: dict[str, tuple[list[str], dict[str, list[float]]]] = {}
    for lab, s in found:
        groups, series = bars.setdefault(f"{lab['app']} · {lab['arrivals']}", ([], {}))
        if f"x={lab['slo_x_ms']:g}" not in groups:
            groups.append(f"x={lab['slo_x_ms']:g}")
        series.setdefault(_title(lab["policy"], lab["budget_adjust"]), []).append(s.max_load)

    from loadtests.sim import plots

    plots.grouped_bars(
        st.out_dir / "max_load.png",
        bars,
        ncols=2,
        title="Max load, two classes (p99 SLOs x and 1.5x ms), k_f 1/10/100",
        xlabel="SLO x of class I (ms); class II: 1.5x",
        ylabel="max load",
        note=unjudged_note(found),
    )
    n_slo = max(len(v) for v in TWO_CLASS_SLOS_MS.values())
    return [
        "## Max load per policy\n\nHighest load at which both classes (SLOs x and 1.5x), and "
        f"every judged fanout type, meet their p99 SLOs. {n_slo} SLO points per app "
        "(experiment 1 sweeps four) to bound the run time; Pareto inter-arrivals with "
        f"alpha = {base.arrivals.alpha:g} (TailGuard eq. (6)).\n\n"
        + _max_load_table(found, ["app", "arrivals", "slo_x_ms"], ["app", "arrivals", "x ms"]),
        _samples_section(_at_max_per_app(found)),
    ]


def fixed_fanout_two_classes(st: Settings, base: Scenario) -> list[str]:
    """Experiment 3: k_f = N = 100, two classes; per-class p99 vs load, max load per policy."""
    policies = (QueuePolicy.FIFO, QueuePolicy.PRIQ, QueuePolicy.TF_EDFQ)
    pool = st.pool("fixed-fanout-two-classes")
    labels: list[Labels] = []
    sweep_runs = len(SWEEP_LOADS) + _bisection_runs(0.05, st.tol) - 2
    for app in st.apps:
        scn = with_slos(st.scenario(base, app), FIXED_FANOUT_SLOS_MS[app])
        slos = dict(zip(("slo_I_ms", "slo_II_ms"), FIXED_FANOUT_SLOS_MS[app], strict=True))
        for pol, budget in st.columns(policies):
            labels.append({"app": app, **slos, "policy": pol, "budget_adjust": budget})
            for j, seeded in enumerate(st.seeded(scn)):
                if budget:  # without a sweep: keep the extra column cheap
                    runs = _bisection_runs(0.96, st.tol)
                    pool.add(_search, (with_budget(seeded), pol, st.tol), runs)
                elif j == 0:  # the first seed also draws the p99-vs-load curves
                    pool.add(_sweep_then_search, (seeded, pol, SWEEP_LOADS, st.tol), sweep_runs)
                else:
                    pool.add(_search, (seeded, pol, st.tol), _bisection_runs(0.96, st.tol))
    found: Found = []
    curves: dict[tuple[str, str], list[RunSummary]] = {}
    results = pool.run()
    n = len(st.seeds)
    for i, lab in enumerate(labels):
        searches: list[Search] = []
        for out in results[i * n : (i + 1) * n]:
            if isinstance(out, tuple):
                curves[(lab["app"], lab["policy"])], out = out
            searches.append(out)
        found.append((lab, Search.combine(searches)))
    _write_searches(st, found)

    curve_rows, class_rows = [], []
    panels: dict[str, dict[str, tuple[list[tuple[float, float]], float]]] = {}
    for (app, pol), curve in curves.items():
        for s in curve:
            curve_rows += [[app, pol, s.load, *r, s.met] for r in _tail_rows(s) if r[1] == "all"]
        names = list(curve[0].classes)
        class_rows.append([app, POLICY_TITLES[pol], *[_sweep_max(curve, c) for c in names]])
        panels[f"{app} · {POLICY_TITLES[pol]}"] = {
            f"class {c}": ([(s.load, s.classes[c].latency_ms) for s in curve], slo_ms)
            for c, slo_ms in ((c, curve[0].classes[c].slo_ms) for c in names)
        }
    write_csv(
        st.out_dir / "p99_vs_load.csv",
        ["app", "policy", "load", *TAIL_HEADER, "all_met"],
        curve_rows,
    )

    from loadtests.sim import plots

    plots.curves_with_slo(
        st.out_dir / "p99_vs_load.png",
        panels,
        title="p99 per class vs load, k_f = N = 100 (dashed: SLOs)",
        xlabel="load",
        ylabel="p99 latency (ms)",
        note=unjudged_note(found) or runs_note([s for c in curves.values() for s in c]),
    )
    step = SWEEP_LOADS[1] - SWEEP_LOADS[0]
    classes = [f"class {c.name}" for c in base.classes]
    return [
        "## Max load per policy\n\nBisection inside the bracket the load sweep found (TF-EDFQ "
        "with budget adjustment: over the whole range, without a sweep).\n\n"
        + _max_load_table(
            found, ["app", "slo_I_ms", "slo_II_ms"], ["app", "SLO I ms", "SLO II ms"]
        ),
        f"## Per-class max load from the load sweep\n\nLoads {SWEEP_LOADS[0]:g} to "
        f"{SWEEP_LOADS[-1]:g} in steps of {step:.2g}, each curve stopping once every class's p99 "
        f"is past {FAR_PAST_SLO:g}x its SLO; the highest swept load before the class first "
        "misses its SLO. Curves: `p99_vs_load.csv`, `p99_vs_load.png`.\n\n"
        + md_table(["app", "policy", *classes], class_rows),
        _samples_section(_at_max_per_app(found)),
    ]


def _sweep_max(curve: Sequence[RunSummary], cname: str) -> str:
    """Highest swept load before the first at which the class misses its SLO."""
    best = f"< {curve[0].load:g}"
    for s in curve:
        if not s.class_met(cname):
            return best
        best = f"{s.load:.2f}"
    return f">= {best}"  # met up to the end of the sweep


def mixed_fanout_four_classes(st: Settings, base: Scenario) -> list[str]:
    """Experiment 4: N = 1000, k_f uniform on 1..1000, four classes; max load per class."""
    cols = st.columns(ALL_POLICIES)
    pool = st.pool("mixed-fanout-four-classes")
    scn = st.scenario(base, "masstree")
    runs = _bisection_runs(HIGH - LOW, st.tol) + 3 * (len(scn.classes) - 1)
    for pol, budget in cols:
        for seeded in st.seeded(scn):
            pool.add(_group_search, (with_budget(seeded, budget), pol, st.tol), runs)
    results = pool.run()
    n = len(st.seeds)
    found = {
        _title(*c): GroupSearch.combine(results[i * n : (i + 1) * n]) for i, c in enumerate(cols)
    }

    slo = {c.name: c.slo_ms for c in scn.classes}
    names = {**{g: f"class {g}" for g in slo}, "all": "all classes"}
    max_rows, run_rows, table = [], [], []
    curves: dict[str, dict[str, tuple[list[tuple[float, float]], float]]] = {}
    for (pol, budget), (title, gs) in zip(cols, found.items(), strict=True):
        for g, (lo, hi) in gs.brackets.items():
            max_rows.append([pol, budget, g, slo.get(g, ""), round(lo, 4), round(hi, 4)])
        table.append(
            [
                title,
                *[
                    _fmt(lo)
                    + (f" ± {ci95(gs.per_seed[g]):.3f}" if len(gs.per_seed.get(g, ())) > 1 else "")
                    for g, (lo, _) in gs.brackets.items()
                ],
            ]
        )
        ordered = sorted(gs.runs, key=lambda s: s.load)
        for s in ordered:
            run_rows += [[pol, budget, round(s.load, 4), *r] for r in _tail_rows(s)]
        curves[title] = {
            names[c]: ([(s.load, s.classes[c].latency_ms) for s in ordered], slo[c]) for c in slo
        }
    head = ["policy", "budget_adjust"]
    write_csv(
        st.out_dir / "maxload.csv", [*head, "group", "slo_ms", "max_load", "bracket_hi"], max_rows
    )
    write_csv(st.out_dir / "runs.csv", [*head, "load", *TAIL_HEADER], run_rows)

    from loadtests.sim import plots

    bars = {names[g]: [gs.brackets[g][0] for gs in found.values()] for g in names}
    note = runs_note([s for gs in found.values() for s in gs.runs])
    plots.grouped_bars(
        st.out_dir / "max_load_per_class.png",
        {"masstree": (list(found), bars)},
        title="Max load per class, N = 1000, k_f uniform on 1..1000",
        xlabel="policy",
        ylabel="max load",
        ncols=1,
        note=note,
    )
    plots.curves_with_slo(
        st.out_dir / "p99_vs_load.png",
        curves,
        title="p99 per class at the loads the bisection ran (dashed: SLOs)",
        xlabel="load",
        ylabel="p99 latency (ms)",
        note=note,
    )
    header = ["policy", *[f"class {g} ({slo[g]:g} ms)" for g in slo], "all classes"]
    first = next(iter(found.values()))
    return [
        "## Max load per class\n\nHighest load at which the class's p99 (and that of each of its "
        "judged fanout types) meets its SLO; `all classes`: the highest load at which every class "
        "does. One bisection per policy, its runs shared by all classes "
        f"({', '.join(f'{t}: {len(g.runs)}' for t, g in found.items())} runs).\n\n"
        + (f"**{note}**\n\n" if note else "")
        + md_table(header, table),
        _samples_section({"masstree": first.runs[0] if first.runs else None}),
    ]


EXPERIMENTS = (
    Experiment(
        "fanout-single-class",
        "max load vs p99 SLO, one class, k_f 1/10/100, FIFO vs TF-EDFQ",
        0,
        APPS,
        fanout_single_class,
    ),
    Experiment(
        "fanout-two-classes",
        "max load, two classes (x, 1.5x), Poisson and Pareto, all four policies",
        0,
        APPS,
        fanout_two_classes,
    ),
    Experiment(
        "fixed-fanout-two-classes",
        "per-class p99 vs load and max load, k_f = N = 100, two classes",
        0,
        APPS,
        fixed_fanout_two_classes,
    ),
    Experiment(
        "mixed-fanout-four-classes",
        "max load per class, N = 1000, k_f uniform on 1..1000, four classes (Masstree)",
        0,
        ("masstree",),
        mixed_fanout_four_classes,
    ),
)
"""TailGuard §IV.B-C's experiments."""
