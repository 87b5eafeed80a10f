"""Experiments on overload: admission control, vertical autoscaling, and Swayam vs thresholds.

- ``admission`` (TailGuard §III.D, §IV.D Fig. 8): the fixed-fanout two-class Masstree
  scenario at offered loads 40-100%, without admission, with the paper's reject-all rule
  and with our throttle and the other rules (lowest class first, largest fanout first, the
  cost ladder) as comparisons; per-class p99 of admitted queries, accepted load and its gap
  to the max load found without admission. R_cth^U is calibrated as the paper does: the
  miss ratio without admission at that max load. Reject-all acts on the paper's moving
  *time* window (a count window stops moving once everything is rejected); its length is
  the time the scenario's count window takes to fill at the max load, and a second table
  shows how the rule behaves with shorter windows at the heaviest load. Every figure is
  the mean over seeds with its 95% confidence interval; the event-driven engine
  (``loadtests.sim.events``) hands each decision every outcome known by its arrival.
- ``autoscale`` (TailGuard §III.E, §IV.E Fig. 9): the same scenario with offered load
  50% → 60% → 50%, vertical scaling on R_sth^U / R_sth^L; p99, miss ratio and service speed
  over time, per phase over seeds.
- ``swayam`` (Swayam §4): one pool under a 2x burst, Swayam's model-based scale-out with
  passive scale-in against the threshold autoscaler (`loadtests.sim.pool`).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from admission import Rule
from loadtests.sim.admission_runs import (
    calibrate_seeds,
    count_window_s,
    pm,
    rule_scenario,
    run_row,
)
from loadtests.sim.engine import SimResult, simulate
from loadtests.sim.experiments import Experiment, _tick
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.report import percentile

ADMISSION_LOADS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
RULES = (
    Rule.NONE,
    Rule.REJECT_ALL,
    Rule.THROTTLE,
    Rule.LOWEST_CLASS_FIRST,
    Rule.LARGEST_FANOUT_FIRST,
    Rule.COST_LADDER,
)
RULE_TITLES = {
    Rule.NONE: "no admission",
    Rule.REJECT_ALL: "reject-all (paper)",
    Rule.THROTTLE: "throttle",
    Rule.LOWEST_CLASS_FIRST: "lowest class first",
    Rule.LARGEST_FANOUT_FIRST: "largest fanout first",
    Rule.COST_LADDER: "cost ladder",
    Rule.PREDICTIVE: "predictive (experiment predictive-admission)",
}
assert set(RULE_TITLES) == set(Rule)
WINDOW_FRACTIONS = (1 / 30, 1 / 10, 1 / 3, 1.0)
"""Reject-all at the heaviest load with time windows of these fractions of the main one."""
TIMELINE_BIN_S = 0.5
"""Width of the time bins of the autoscale experiment's series."""


# --- Jobs (module level: they run in worker processes) -----------------------------------


def _admission_curve(
    job: int, scn: Any, rule: str, threshold: float, window_s: float, loads: tuple[float, ...]
) -> list[dict[str, Any]]:
    """Every offered load under one rule (none, reject-all or throttle)."""
    run_scn = rule_scenario(scn, rule, threshold, window_s)
    rows = []
    for load in loads:
        rows.append(run_row(run_scn, load, rule))
        _tick(job)
    return rows


TIMELINE_LOAD = 0.8
"""Offered load of the admission timeline (well above the max load)."""
TIMELINE_RULES = (Rule.REJECT_ALL, Rule.THROTTLE)
ADMISSION_BIN_MS = 10.0
"""Width of the admission timeline's bins."""


def _admission_timeline(
    job: int, scn: Any, rule: str, threshold: float, window_s: float, load: float
) -> dict[str, Any]:
    """Queries offered and admitted, and the admitted queries' p99 of class I, per bin."""
    res = simulate(rule_scenario(scn, rule, threshold, window_s), load)
    _tick(job)
    assert res.offered_arrival_ms is not None and res.arrival_ms is not None
    t0 = float(res.offered_arrival_ms[0])
    edges = np.arange(t0, float(res.offered_arrival_ms[-1]) + ADMISSION_BIN_MS, ADMISSION_BIN_MS)
    offered, _ = np.histogram(res.offered_arrival_ms, edges)
    admitted, _ = np.histogram(res.arrival_ms, edges)
    return {
        "rule": rule,
        "time_ms": (edges[:-1] - t0).tolist(),
        "offered": offered.tolist(),
        "admitted": admitted.tolist(),
    }


def _autoscale_run(job: int, scn: Any, load: float, on: bool) -> dict[str, Any]:
    """One run with or without vertical autoscaling; series in TIMELINE_BIN_S bins."""
    s = replace(scn, autoscaling=replace(scn.autoscaling, enabled=on))
    res = simulate(s, load)
    _tick(job)
    return {"on": on, **_timeline(res), "actions": res.scaling}


def _timeline(res: SimResult) -> dict[str, Any]:
    assert res.arrival_ms is not None and res.query_misses is not None
    scn = res.scenario
    t_s = res.arrival_ms / 1000.0
    end = float(t_s.max()) if t_s.size else 0.0
    edges = np.arange(0.0, end + TIMELINE_BIN_S, TIMELINE_BIN_S)
    series: dict[str, list[float]] = {"time_s": [], "miss_ratio": []}
    for c in scn.classes:
        series[f"p99_{c.name}_ms"] = []
    for lo, hi in itertools.pairwise(edges):
        sel = (t_s >= lo) & (t_s < hi)
        if not np.any(sel):
            continue
        series["time_s"].append(float((lo + hi) / 2))
        tasks = float(res.fanout[sel].sum())
        series["miss_ratio"].append(float(res.query_misses[sel].sum()) / tasks)
        for ci, c in enumerate(scn.classes):
            mine = res.latency_ms[sel & (res.cls == ci)]
            series[f"p99_{c.name}_ms"].append(percentile(mine, c.percentile))
    phases = max(1, len(scn.arrivals.phases))
    span = end / phases
    per_phase = []
    for i in range(phases):
        sel = (t_s >= i * span) & (t_s < (i + 1) * span if i + 1 < phases else t_s <= end)
        row: dict[str, Any] = {"phase": i + 1}
        row["miss_ratio"] = float(res.query_misses[sel].sum()) / max(1, int(res.fanout[sel].sum()))
        for ci, c in enumerate(scn.classes):
            row[f"p99_{c.name}_ms"] = percentile(
                res.latency_ms[sel & (res.cls == ci)], c.percentile
            )
        row["mean_service_scale"] = _mean_scale(res.scaling, i * span, (i + 1) * span)
        per_phase.append(row)
    return {"series": series, "phases": per_phase, "end_s": end}


def _mean_scale(actions: list[dict[str, float]], t0_s: float, t1_s: float) -> float:
    """Time-average service-time factor over [t0, t1] from the scaling actions."""
    if t1_s <= t0_s:
        return 1.0
    points = [(0.0, 1.0)] + [(a["time_ms"] / 1000.0, a["to_scale"]) for a in actions]
    total = 0.0
    for k, (t, scale) in enumerate(points):
        nxt = points[k + 1][0] if k + 1 < len(points) else float("inf")
        lo, hi = max(t, t0_s), min(nxt, t1_s)
        if hi > lo:
            total += scale * (hi - lo)
    return total / (t1_s - t0_s)


def _pool_run(job: int, scn: Any, policy: str) -> Any:
    from loadtests.sim.pool import simulate_pool

    res = simulate_pool(scn, policy)
    _tick(job)
    return res


# --- Experiment bodies -------------------------------------------------------------------


def admission(st: Any, base: Any) -> list[str]:
    """Admission control: per-class p99 of admitted queries and accepted load vs offered load."""
    from loadtests.sim import plots

    scn = st.scenario(base, "masstree")
    seeded = st.seeded(scn)
    calib = calibrate_seeds(st, seeded, "admission", need_load=False)
    windows = [
        count_window_s(s, m) if m > 0 else 0.1 for s, (m, _) in zip(seeded, calib, strict=True)
    ]
    pool = st.pool("admission: offered-load sweeps")
    for s, (_, thr), win in zip(seeded, calib, windows, strict=True):
        for rule in RULES:
            pool.add(_admission_curve, (s, rule, thr, win, ADMISSION_LOADS), len(ADMISSION_LOADS))
        top = ADMISSION_LOADS[-1:]
        for f in WINDOW_FRACTIONS[:-1]:
            pool.add(_admission_curve, (s, "reject-all", thr, win * f, top), 1)
    first = seeded[0]
    for rule in TIMELINE_RULES:
        pool.add(_admission_timeline, (first, rule, calib[0][1], windows[0], TIMELINE_LOAD), 1)
    out = pool.run()
    timelines, out = out[-len(TIMELINE_RULES) :], out[: -len(TIMELINE_RULES)]
    per = len(RULES) + len(WINDOW_FRACTIONS) - 1
    curves: dict[str, list[list[dict[str, Any]]]] = {r: [] for r in RULES}
    short: dict[float, list[dict[str, Any]]] = {f: [] for f in WINDOW_FRACTIONS}
    for k in range(len(seeded)):
        block = out[k * per : (k + 1) * per]
        for rule, rows in zip(RULES, block[: len(RULES)], strict=True):
            curves[rule].append(rows)
        short[1.0].append(block[RULES.index(Rule.REJECT_ALL)][-1])
        for f, rows in zip(WINDOW_FRACTIONS[:-1], block[len(RULES) :], strict=True):
            short[f].append(rows[0])
    max_loads = [m for m, _ in calib]
    max_load = statistics.fmean(max_loads)
    threshold = statistics.fmean(t for _, t in calib)
    names = [c.name for c in scn.classes]

    header = ["rule", "offered", "accepted", "gap to max", "miss ratio"]
    header += [f"p99 {n} (SLO {c.slo_ms:g} ms)" for n, c in zip(names, scn.classes, strict=True)]
    header += ["seeds meeting both"]
    rows, csv_rows, mean_curves = [], [], {}
    for rule, per_seed in curves.items():
        mean_curves[rule] = []
        for i, load in enumerate(ADMISSION_LOADS):
            at = [curve[i] for curve in per_seed]
            acc = [r["accepted_load"] for r in at]
            gaps = [(m - a) / m for a, m in zip(acc, max_loads, strict=True) if m > 0]
            gap_cell = pm(gaps, "+.1%") if load >= max_load and gaps and rule != Rule.NONE else "-"
            cells = []
            for n in names:
                p99 = [r[f"p99_{n}_ms"] for r in at]
                missed = sum(not r[f"met_{n}"] for r in at)
                cells.append(pm(p99) + (f" ✗{missed}" if missed else ""))
            met = sum(r["all_met"] for r in at)
            rows.append(
                [
                    RULE_TITLES[rule],
                    f"{load:.1f}",
                    pm(acc),
                    gap_cell,
                    pm([r["miss_ratio"] for r in at], ".2%"),
                    *cells,
                    f"{met}/{len(at)}",
                ]
            )
            for seed, r in zip(st.seeds, at, strict=True):
                csv_rows.append([rule, seed, *(r[k] for k in sorted(r) if k != "rule")])
            mean_curves[rule].append(
                {
                    "offered_load": load,
                    "accepted_load": statistics.fmean(acc),
                    **{
                        f"p99_{n}_ms": statistics.fmean(r[f"p99_{n}_ms"] for r in at) for n in names
                    },
                }
            )
    keys = sorted(k for k in curves[Rule.NONE][0][0] if k != "rule")
    write_csv(st.out_dir / "admission.csv", ["rule", "seed", *keys], csv_rows)
    win_rows = []
    for f in WINDOW_FRACTIONS:
        at = short[f]
        win = [w * f for w in windows]
        cells = [pm([r[f"p99_{n}_ms"] for r in at]) for n in names]
        win_rows.append(
            [
                f"{statistics.fmean(win) * 1000:.1f}",
                pm([r["accepted_load"] for r in at]),
                pm([r["miss_ratio"] for r in at], ".2%"),
                *cells,
                f"{sum(r['all_met'] for r in at)}/{len(at)}",
            ]
        )
    tl_rows = [
        [tl["rule"], round(t, 3), o, a]
        for tl in timelines
        for t, o, a in zip(tl["time_ms"], tl["offered"], tl["admitted"], strict=True)
    ]
    write_csv(
        st.out_dir / "admission_timeline.csv", ["rule", "time_ms", "offered", "admitted"], tl_rows
    )
    span = int(1000 / ADMISSION_BIN_MS)  # the first second of the run
    plots.line_panels(
        st.out_dir / "admission_timeline.png",
        {
            RULE_TITLES[tl["rule"]]: {
                "offered": list(zip(tl["time_ms"][:span], tl["offered"][:span], strict=True)),
                "admitted": list(zip(tl["time_ms"][:span], tl["admitted"][:span], strict=True)),
            }
            for tl in timelines
        },
        title=f"Queries per {ADMISSION_BIN_MS:g} ms at offered load {TIMELINE_LOAD:g} "
        "(first seed, first second)",
        xlabel="time (ms)",
        ylabel="queries",
        ncols=2,
    )
    bursts = []
    for tl in timelines:
        adm = np.asarray(tl["admitted"], dtype=float)
        off = np.asarray(tl["offered"], dtype=float)
        share = adm.sum() / max(off.sum(), 1.0)
        busy = adm > 0
        bursts.append(
            [
                RULE_TITLES[tl["rule"]],
                f"{share:.1%}",
                f"{busy.mean():.1%}",
                f"{(adm[busy] / np.maximum(off[busy], 1)).mean():.1%}" if busy.any() else "-",
            ]
        )
    panels: dict[str, dict[str, Any]] = {}
    for n, c in zip(names, scn.classes, strict=True):
        panels[f"class {n}: p99 of admitted queries"] = {
            RULE_TITLES[rule]: ([(r["offered_load"], r[f"p99_{n}_ms"]) for r in curve], c.slo_ms)
            for rule, curve in mean_curves.items()
        }
    plots.curves_with_slo(
        st.out_dir / "p99_vs_offered_load.png",
        panels,
        title="Admission control, k_f = N = 100 (dashed: SLOs; means over seeds)",
        xlabel="offered load",
        ylabel="p99 latency (ms)",
    )
    plots.line_panels(
        st.out_dir / "accepted_load.png",
        {
            "accepted load": {
                **{
                    RULE_TITLES[rule]: [(r["offered_load"], r["accepted_load"]) for r in curve]
                    for rule, curve in mean_curves.items()
                },
                "max load without admission": [
                    (ADMISSION_LOADS[0], max_load),
                    (ADMISSION_LOADS[-1], max_load),
                ],
            }
        },
        title="Accepted load vs offered load (means over seeds)",
        xlabel="offered load",
        ylabel="accepted load",
        ncols=1,
    )
    a = scn.admission
    ml = [f"{m:.3f}" for m in max_loads]
    th = [f"{t:.4f}" for _, t in calib]
    return [
        "## Calibration (per seed)\n\n"
        f"Max load without admission (TF-EDFQ, bisection to {st.tol:g}): "
        f"{', '.join(ml)} (mean **{max_load:.3f}**). R_cth^U, the miss ratio without admission "
        f"at that max load (TailGuard §III.D: set offline through measurement): "
        f"{', '.join(th)} (mean **{threshold:.4f}**). Reject-all's moving time window: the "
        f"time {a.window_tasks:,} tasks take at the max load, "
        f"{statistics.fmean(windows) * 1000:.0f} ms; the throttle keeps the count window of "
        f"{a.window_tasks:,} tasks and steps every {a.throttle_interval_s:g} s with gain "
        f"{a.throttle_gain:g}.",
        "## Admitted queries and accepted load\n\n"
        f"Means over {len(st.seeds)} seeds ± the 95% confidence interval of the mean. `✗n`: the "
        "class misses its SLO on n seeds. Gap (offered loads at or above the max load): (max "
        "load - accepted load) / max load.\n\n" + md_table(header, rows),
        f"## How each rule admits, offered load {TIMELINE_LOAD:g}\n\n"
        f"First seed, bins of {ADMISSION_BIN_MS:g} ms over the run (`admission_timeline.csv`, "
        "`admission_timeline.png`): the share of queries admitted, the share of bins in which "
        "any query was, and within those bins the share admitted. Reject-all admits in "
        "bursts at the full offered rate between lock-outs (a queue builds in each burst "
        "before its misses reach the window); the throttle admits a steady fraction.\n\n"
        + md_table(
            ["rule", "admitted", "bins with admissions", "admitted within those bins"], bursts
        ),
        "## Reject-all and the length of its window\n\n"
        f"Offered load {ADMISSION_LOADS[-1]:g}; the same calibrated R_cth^U.\n\n"
        + md_table(
            [
                "window ms",
                "accepted",
                "miss ratio",
                *[f"p99 {n}" for n in names],
                "seeds meeting both",
            ],
            win_rows,
        ),
    ]


AUTOSCALE_LOAD = 0.5
"""Offered load of the first and last phase (the scenario's phases multiply it)."""


def autoscale(st: Any, base: Any) -> list[str]:
    """Vertical autoscaling through 50% → 60% → 50%: p99, miss ratio and speed over time."""
    from loadtests.sim import plots

    scn = st.scenario(base, "masstree")
    pool = st.pool("autoscale")
    for seeded in st.seeded(scn):
        for on_ in (False, True):
            pool.add(_autoscale_run, (seeded, AUTOSCALE_LOAD, on_), 1)
    done = pool.run()
    offs, ons = done[0::2], done[1::2]
    off, on = offs[0], ons[0]  # the first seed's series for the timeline and plots
    a = scn.autoscaling
    names = [c.name for c in scn.classes]
    loads = [AUTOSCALE_LOAD * m for m in scn.arrivals.phases] or [AUTOSCALE_LOAD]

    rows = []
    for label, runs in (("off", offs), ("on", ons)):
        for i, _ in enumerate(runs[0]["phases"]):
            phs = [r["phases"][i] for r in runs]
            cells = []
            for n, c in zip(names, scn.classes, strict=True):
                p99 = [ph[f"p99_{n}_ms"] for ph in phs]
                missed = sum(x > c.slo_ms for x in p99)
                cells.append(pm(p99) + (f" ✗{missed}" if missed else ""))
            rows.append(
                [
                    label,
                    i + 1,
                    f"{loads[i]:.2f}",
                    *cells,
                    pm([ph["miss_ratio"] for ph in phs], ".2%"),
                    pm([ph["mean_service_scale"] for ph in phs]),
                ]
            )
    header = ["autoscaling", "phase", "offered load"]
    header += [f"p99 {n} (SLO {c.slo_ms:g} ms)" for n, c in zip(names, scn.classes, strict=True)]
    header += ["miss ratio", "mean service-time factor"]
    series_rows = []
    for label, run in (("off", off), ("on", on)):
        s = run["series"]
        for k, t in enumerate(s["time_s"]):
            series_rows.append(
                [label, t, s["miss_ratio"][k], *(s[f"p99_{n}_ms"][k] for n in names)]
            )
    write_csv(
        st.out_dir / "timeline.csv",
        ["autoscaling", "time_s", "miss_ratio", *(f"p99_{n}_ms" for n in names)],
        series_rows,
    )
    action_rows = [
        [
            f"{x['time_ms'] / 1000:.2f}",
            f"{x['miss_ratio']:.2%}",
            f"{x['from_scale']:.3f}",
            f"{x['to_scale']:.3f}",
            x["reason"],
        ]
        for x in on["actions"]
    ]
    write_csv(
        st.out_dir / "actions.csv",
        ["time_s", "miss_ratio", "from_scale", "to_scale", "reason"],
        action_rows,
    )
    end = on["end_s"]
    scale_points = [(0.0, 1.0)]
    for x in on["actions"]:
        t = x["time_ms"] / 1000.0
        scale_points += [(t, scale_points[-1][1]), (t, x["to_scale"])]
    scale_points.append((end, scale_points[-1][1]))
    panels: dict[str, dict[str, Any]] = {}
    for label, run in (("off", off), ("on", on)):
        s = run["series"]
        panels[f"autoscaling {label}: p99"] = {
            f"class {n}": (list(zip(s["time_s"], s[f"p99_{n}_ms"], strict=True)), c.slo_ms)
            for n, c in zip(names, scn.classes, strict=True)
        }
    plots.curves_with_slo(
        st.out_dir / "p99_over_time.png",
        panels,
        title=f"p99 per {TIMELINE_BIN_S:g} s, load {' → '.join(f'{x:.0%}' for x in loads)}",
        xlabel="time (s)",
        ylabel="p99 latency (ms)",
        ncols=2,
    )
    plots.line_panels(
        st.out_dir / "miss_ratio_and_speed.png",
        {
            "task deadline-miss ratio": {
                "autoscaling off": list(
                    zip(off["series"]["time_s"], off["series"]["miss_ratio"], strict=True)
                ),
                "autoscaling on": list(
                    zip(on["series"]["time_s"], on["series"]["miss_ratio"], strict=True)
                ),
                "R_sth^U": [(0.0, a.upper), (end, a.upper)],
                "R_sth^L": [(0.0, a.lower), (end, a.lower)],
            },
            "service-time factor (autoscaling on)": {"factor": scale_points},
        },
        title="Miss ratio and vertical scaling over time",
        xlabel="time (s)",
        ylabel="ratio / factor",
        ncols=2,
    )
    return [
        f"## Setup\n\nMeans over {len(st.seeds)} seeds ± the 95% confidence interval of the "
        "mean (`✗n`: a class misses its SLO in that phase on n seeds); the timeline, actions "
        "and plots are the first seed's. "
        f"Offered load {' → '.join(f'{x:.0%}' for x in loads)} in equal phases; "
        f"R_sth^U = {a.upper:g}, R_sth^L = {a.lower:g}, window {a.window_tasks:,} tasks, "
        f"cooldowns {a.up_cooldown_ms:g} ms up / {a.down_cooldown_ms:g} ms down (doubling "
        f"while a step down is undone at once), at most {a.max_steps_up} steps up and "
        f"{a.max_steps_down} down; a step up makes service 20% faster, a step down 25% slower.",
        "## Per phase\n\n" + md_table(header, rows),
        "## Scaling actions (autoscaling on)\n\n"
        + md_table(["time s", "miss ratio", "from", "to", "reason"], action_rows),
    ]


def swayam(st: Any, base: Any) -> list[str]:
    """Swayam vs threshold scaling through a 2x burst: backends, compliance, backend-seconds."""
    from loadtests.sim import plots
    from loadtests.sim.pool import summary_rows

    scn = replace(
        base, service=replace(base.service, path=str(st.data_dir / "xapian_quantiles.txt"))
    )
    pool = st.pool("swayam")
    for policy in ("swayam", "threshold"):
        pool.add(_pool_run, (scn, policy), 1)
    results = pool.run()
    header = [
        "policy",
        f"windows of {scn.window_requests:,} meeting p{scn.percentile:g} <= {scn.target_ms:g} ms",
        f"overall p{scn.percentile:g} ms",
        "backend-seconds",
        "peak warm",
        "scaling actions",
        "task miss ratio",
    ]
    rows = summary_rows(scn, results)
    timeline_rows = []
    for r in results:
        for p in r.timeline:
            timeline_rows.append(
                [r.policy, p["time_s"], p["rate_per_s"], p["warm"], p["warming"], p["routable"]]
            )
    write_csv(
        st.out_dir / "backends_over_time.csv",
        ["policy", "time_s", "rate_per_s", "warm", "warming", "routable"],
        timeline_rows,
    )
    plots.line_panels(
        st.out_dir / "backends_over_time.png",
        {
            "warm backends": {
                r.policy: [(p["time_s"], p["warm"]) for p in r.timeline] for r in results
            },
            "offered rate (req/s)": {
                "rate": [(p["time_s"], p["rate_per_s"]) for p in results[0].timeline]
            },
        },
        title="Warm backends through a 2x burst",
        xlabel="time (s)",
        ylabel="backends / rate",
        ncols=2,
    )
    actions = []
    for r in results:
        for x in r.actions:
            actions.append([r.policy, f"{x['time_s']:.0f}", x["delta"], x["reason"]])
    return [
        f"## Setup\n\n{scn.description}. Service `{Path(scn.service.path or '').name}`; "
        f"t_setup {scn.setup_s:g} s, idle retirement T = {scn.idle_s:g} s, decisions every "
        f"{scn.interval_s:g} s. Swayam: burst factor U = {scn.burst:g}, rate regression over "
        f"{scn.history_s:g} s, n_B from the central-queue waiting-time model. Threshold: "
        f"R_sth^U = {scn.upper:g}, R_sth^L = {scn.lower:g}, window {scn.window_tasks:,} tasks, "
        f"cooldowns {scn.up_cooldown_s:g} s up / {scn.down_cooldown_s:g} s down. Both start "
        "with the backends Swayam's model asks for at the base rate.",
        "## Results\n\n" + md_table(header, rows),
        "## Scaling actions\n\n" + md_table(["policy", "time s", "delta", "reason"], actions),
    ]


EXPERIMENTS = (
    Experiment(
        "admission",
        "admission control: admitted p99 and accepted load vs offered load, k_f = N = 100",
        0,
        ("masstree",),
        admission,
        searches_max_load=False,
    ),
    Experiment(
        "autoscale",
        "vertical autoscaling on the miss ratio through load 50% -> 60% -> 50%",
        60_000,
        ("masstree",),
        autoscale,
        searches_max_load=False,
    ),
    Experiment(
        "swayam",
        "Swayam's model-based scale-out vs threshold scaling through a 2x burst",
        0,
        ("xapian",),
        swayam,
        pool=True,
        searches_max_load=False,
    ),
)
"""TailGuard §IV.D-E's admission and autoscaling, and Swayam's scale-out."""
