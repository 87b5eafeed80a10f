"""Experiments on QLM's waiting-time estimator and the predictive admission rule built on it.

- ``wait-estimator`` (QLM §6, Fig. 3 and its R²): the fixed-fanout two-class Masstree
  scenario without admission, FIFO and TF-EDFQ at three loads below the max load; every
  task's estimated queue wait (from its server's exact state as it arrives) against the wait
  it then had. Two estimates: QLM's, from the queue as it stands (eqs. 2-3 with the residual
  of the task in service), and ours, which also adds the later arrivals that overtake it
  under the policy's order (`admission.waiting.with_overtaking`). Reported by class, by
  queue position (QLM's linear-in-position view) and by the number of request groups queued
  ahead: R², error percentiles (actual - estimated) and how often the actual wait stayed
  below the estimate's 99th percentile.
- ``predictive-admission`` (target: at offered loads 0.5-3x the max load without admission,
  admitted queries meet both SLOs and the accepted load does not fall more than 2% below
  that max load): the §IV.C admission case under no admission, TailGuard's reject-all, the throttle,
  the predictive rule alone and the predictive rule with the throttle as its backstop.
  R_cth^U and reject-all's window are calibrated as in the ``admission`` experiment.
- ``least-wait`` (QLM's load balancing across heterogeneous instances): a fast and a twice
  slower pool of 50 servers each, k_f 1 or 10; the max load at the p99 SLO when a query's
  servers are drawn at random and when they are the k_f with the smallest estimated wait.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import numpy as np

from admission import AdmissionConfig, AdmissionPolicy, Rule
from loadtests.sim import experiments as ex
from loadtests.sim.admission_runs import (
    calibrate_seeds,
    count_window_s,
    pm,
    rule_scenario,
    run_row,
)
from loadtests.sim.engine import build_book, query_budgets
from loadtests.sim.events import run_with_feedback
from loadtests.sim.experiments import Experiment, _tick
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.waits import SimWaits
from loadtests.sim.workload import make_workload

__all__ = ["EXPERIMENTS"]

# --- wait-estimator ------------------------------------------------------------------------

WAIT_POLICIES = ("fifo", "tf-edfq")
WAIT_LOADS = (0.3, 0.4, 0.5)
POSITIONS = 8
"""Queue positions 0..POSITIONS-1 are shown one by one, the rest together."""
Z99 = 2.3263478740408408
ESTIMATES = ("qlm", "overtaking")
ESTIMATE_TITLES = {
    "qlm": "QLM (queue as it stands)",
    "overtaking": "with overtaking arrivals",
}


def _r2(actual: np.ndarray, est: np.ndarray) -> float:
    """Coefficient of determination of the estimate for the actual values."""
    if actual.size < 2:
        return math.nan
    tot = float(((actual - actual.mean()) ** 2).sum())
    if tot == 0.0:
        return math.nan
    return 1.0 - float(((actual - est) ** 2).sum()) / tot


def _fit(actual: np.ndarray, est: np.ndarray, sd: np.ndarray) -> dict[str, float]:
    err = actual - est
    if actual.size == 0:
        return {
            "n": 0,
            "r2": math.nan,
            "p1": math.nan,
            "p50": math.nan,
            "p99": math.nan,
            "cover99": math.nan,
            "mean_est": math.nan,
            "mean_actual": math.nan,
        }
    return {
        "n": int(actual.size),
        "r2": _r2(actual, est),
        "p1": float(np.percentile(err, 1)),
        "p50": float(np.percentile(err, 50)),
        "p99": float(np.percentile(err, 99)),
        "cover99": float(np.mean(actual <= est + Z99 * sd)),
        "mean_est": float(est.mean()),
        "mean_actual": float(actual.mean()),
    }


def _wait_run(job: int, scn: Any, policy: str, load: float) -> dict[str, Any]:
    """One run without admission, every task's estimates recorded; summaries only."""
    w = make_workload(scn, load)
    book, ids = build_book(scn)
    budget = query_budgets(scn, w, book, ids)
    slo = np.array([c.slo_ms for c in scn.classes])
    waits = SimWaits.of(book, ids, w.tasks, record=True)
    fb = run_with_feedback(scn, w, policy, budget, slo[w.cls] - budget, None, waits)
    _tick(job)
    tq = np.repeat(np.arange(w.queries), w.fanout)
    first = int(scn.run.warmup * w.queries)
    arrive = w.arrival_ms[tq] + (0.0 if scn.run.queueing == "central" else scn.overhead.dispatch_ms)
    actual = fb.start - arrive
    ok = (tq >= first) & np.isfinite(actual) & np.isfinite(waits.est_mean)
    # QLM estimates the wait of queued requests: tasks that found every slot busy.
    queued = ok & ((waits.base_mean > 0) | (actual > 0))
    cls_t = w.cls[tq]
    est = {"qlm": (waits.base_mean, waits.base_sd), "overtaking": (waits.est_mean, waits.est_sd)}
    out: dict[str, Any] = {
        "policy": policy,
        "load": load,
        "tasks": int(ok.sum()),
        "queued_share": float(queued.sum() / max(ok.sum(), 1)),
        "by_class": {},
        "by_position": {},
        "by_groups": {},
    }
    classes = [("all", queued)] + [
        (c.name, queued & (cls_t == i)) for i, c in enumerate(scn.classes)
    ]
    for name, sel in classes:
        out["by_class"][name] = {k: _fit(actual[sel], m[sel], s[sel]) for k, (m, s) in est.items()}
    pos = np.minimum(waits.est_ahead, POSITIONS)
    for name, sel in classes:
        rows = {}
        for n in range(POSITIONS + 1):
            k = sel & (pos == n)
            rows[n] = {e: _fit(actual[k], m[k], s[k]) for e, (m, s) in est.items()}
        out["by_position"][name] = rows
    for g in (0, 1, 2):
        k = queued & (waits.est_groups == g)
        out["by_groups"][g] = {e: _fit(actual[k], m[k], s[k]) for e, (m, s) in est.items()}
    return out


def wait_estimator(st: Any, base: Any) -> list[str]:
    """QLM's estimator and ours against the actual queue waits, by class, position, groups."""
    from loadtests.sim import plots

    scn = replace(st.scenario(base, "masstree"), admission=AdmissionConfig(policy="none"))
    pool = st.pool("wait-estimator")
    keys = []
    for s in st.seeded(scn):
        for policy in WAIT_POLICIES:
            for load in WAIT_LOADS:
                pool.add(_wait_run, (s, policy, load), 1)
                keys.append((s.run.seed, policy, load))
    runs = pool.run()
    names = ["all"] + [c.name for c in scn.classes]

    header = [
        "policy",
        "load",
        "class",
        "estimate",
        "queued tasks",
        "R²",
        "error p1 / p50 / p99 (ms)",
        "actual <= est. p99",
    ]
    rows, csv_rows = [], []
    for policy in WAIT_POLICIES:
        for load in WAIT_LOADS:
            at = [r for (_, p, ld), r in zip(keys, runs, strict=True) if p == policy and ld == load]
            for name in names:
                for e in ESTIMATES:
                    fits = [r["by_class"][name][e] for r in at]
                    rows.append(
                        [
                            policy,
                            f"{load:g}",
                            name,
                            ESTIMATE_TITLES[e],
                            f"{statistics.fmean(f['n'] for f in fits):,.0f}",
                            pm([f["r2"] for f in fits]),
                            " / ".join(pm([f[q] for f in fits]) for q in ("p1", "p50", "p99")),
                            pm([f["cover99"] for f in fits], ".1%"),
                        ]
                    )
    for (seed, policy, load), r in zip(keys, runs, strict=True):
        for name in names:
            for e in ESTIMATES:
                f = r["by_class"][name][e]
                csv_rows.append([seed, policy, load, name, e, *(f[k] for k in sorted(f))])
    fit_keys = sorted(runs[0]["by_class"]["all"]["qlm"])
    write_csv(
        st.out_dir / "wait_estimator.csv",
        ["seed", "policy", "load", "class", "estimate", *fit_keys],
        csv_rows,
    )

    # QLM Fig. 3's view: mean actual wait by queue position against the estimate, and the
    # R² of the estimate over the positions' means (the first seed, TF-EDFQ, top load).
    top = next(
        r
        for (seed, p, ld), r in zip(keys, runs, strict=True)
        if seed == st.seeds[0] and p == "tf-edfq" and ld == WAIT_LOADS[-1]
    )
    pos_rows = []
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    pos_r2: dict[tuple[str, str], float] = {}
    for name in names[1:]:
        series: dict[str, list[tuple[float, float]]] = {"actual": []}
        series.update({ESTIMATE_TITLES[e]: [] for e in ESTIMATES})
        means: dict[str, list[tuple[float, float]]] = {e: [] for e in ESTIMATES}
        for n, fits in top["by_position"][name].items():
            f0 = fits["qlm"]
            if f0["n"] < 30:
                continue
            label = f"{n}+" if n == POSITIONS else str(n)
            pos_rows.append(
                [
                    name,
                    label,
                    f"{f0['n']:,}",
                    f"{f0['mean_actual']:.4f}",
                    *(f"{fits[e]['mean_est']:.4f}" for e in ESTIMATES),
                ]
            )
            series["actual"].append((n, f0["mean_actual"]))
            for e in ESTIMATES:
                series[ESTIMATE_TITLES[e]].append((n, fits[e]["mean_est"]))
                means[e].append((fits[e]["mean_est"], f0["mean_actual"]))
        panels[f"class {name}"] = series
        for e in ESTIMATES:
            pts = np.array(means[e]) if means[e] else np.empty((0, 2))
            pos_r2[(name, e)] = _r2(pts[:, 1], pts[:, 0]) if len(pts) > 1 else math.nan
    plots.line_panels(
        st.out_dir / "wait_by_position.png",
        panels,
        title=f"Mean queue wait by queue position, TF-EDFQ at load {WAIT_LOADS[-1]:g} (seed "
        f"{st.seeds[0]})",
        xlabel="tasks queued ahead (position)",
        ylabel="queue wait (ms)",
        ncols=2,
    )
    r2_line = "; ".join(
        f"class {n}, {ESTIMATE_TITLES[e]}: {pos_r2[(n, e)]:.3f}"
        for n in names[1:]
        for e in ESTIMATES
    )
    grp_rows = []
    for g in (0, 1, 2):
        for e in ESTIMATES:
            fits = [
                r["by_groups"][g][e]
                for r, (_, p, _ld) in zip(runs, keys, strict=True)
                if p == "tf-edfq"
            ]
            fits = [f for f in fits if f["n"]]
            if not fits:
                continue
            grp_rows.append(
                [
                    str(g),
                    ESTIMATE_TITLES[e],
                    f"{sum(f['n'] for f in fits):,}",
                    pm([f["r2"] for f in fits]),
                    pm([f["p50"] for f in fits]),
                    pm([f["p99"] for f in fits]),
                    pm([f["cover99"] for f in fits], ".1%"),
                ]
            )
    pos_header = ["class", "position", "tasks", "actual ms"]
    pos_header += [f"{ESTIMATE_TITLES[e]} ms" for e in ESTIMATES]
    grp_header = ["groups ahead", "estimate", "tasks", "R²", "error p50", "error p99"]
    grp_header += ["actual <= est. p99"]
    pos_header = ["class", "position", "tasks", "actual ms"]
    pos_header += [f"{ESTIMATE_TITLES[e]} ms" for e in ESTIMATES]
    grp_header = ["groups ahead", "estimate", "tasks", "R²", "error p50", "error p99"]
    grp_header += ["actual <= est. p99"]
    return [
        "## Setup\n\n"
        f"{scn.servers.count} servers, every query on all of them (k_f = N), classes "
        + ", ".join(f"{c.name} (SLO {c.slo_ms:g} ms)" for c in scn.classes)
        + f"; {scn.run.queries:,} queries per run, the first {scn.run.warmup:.0%} not measured; "
        f"seeds {', '.join(map(str, st.seeds))}. The estimate of a task is taken from its "
        "server's state as the task arrives: the tasks queued ahead of it in the policy's "
        "order, the busy slots, the server's service moments from its CDF row. Only tasks "
        "that found every slot busy count (QLM estimates queued requests).",
        "## Accuracy by class\n\n"
        "Means over seeds ± 95% CI. Error = actual - estimated wait (ms): positive means the "
        "estimate was short. The last column is how often the actual wait stayed within the "
        "estimate's Normal 99th percentile (99% if its tail is right).\n\n"
        + md_table(header, rows),
        "## By queue position (QLM Fig. 3's view)\n\n"
        f"TF-EDFQ at load {WAIT_LOADS[-1]:g}, seed {st.seeds[0]} (`wait_by_position.png`): "
        "mean actual wait and mean estimates per number of tasks queued ahead (positions "
        f"with at least 30 tasks). R² of the estimate over the positions' means: {r2_line}.\n\n"
        + md_table(pos_header, pos_rows),
        "## By number of request groups queued ahead\n\n"
        "TF-EDFQ, all loads and seeds; a request group here is a class (the servers and the "
        "fanout are the same for every query). Means over runs ± 95% CI.\n\n"
        + md_table(grp_header, grp_rows),
    ]


# --- predictive-admission ------------------------------------------------------------------

PREDICTIVE_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0)
"""Offered loads, as multiples of the max load without admission."""
PREDICTIVE_RULES = ("none", "reject-all", "throttle", "predictive", "predictive+throttle")
PREDICTIVE_TITLES = {
    "none": "no admission",
    "reject-all": "reject-all (TailGuard)",
    "throttle": "throttle",
    "predictive": "predictive",
    "predictive+throttle": "predictive, throttle backstop",
}


def _predictive_scenario(scn: Any, rule: str, threshold: float, window: float) -> Any:
    if rule.startswith("predictive"):
        backstop = rule.partition("+")[2] or "none"
        a = replace(
            scn.admission,
            policy=AdmissionPolicy.MISS_RATIO,
            rule=Rule.PREDICTIVE,
            predictive_backstop=Rule(backstop),
            threshold=threshold,
        )
        return replace(scn, admission=a)
    return rule_scenario(scn, rule, threshold, window)


def _predictive_curve(
    job: int, scn: Any, rule: str, threshold: float, window: float, loads: tuple[float, ...]
) -> list[dict[str, Any]]:
    run_scn = _predictive_scenario(scn, rule, threshold, window)
    rows = []
    for load in loads:
        rows.append(run_row(run_scn, load, rule))
        _tick(job)
    return rows


def predictive_admission(st: Any, base: Any) -> list[str]:
    """Accepted load and admitted p99 under the predictive rule and the miss-ratio rules."""
    from loadtests.sim import plots

    scn = st.scenario(base, "masstree")
    seeded = st.seeded(scn)
    calib = calibrate_seeds(st, seeded, "predictive-admission")
    windows = [count_window_s(s, m) for s, (m, _) in zip(seeded, calib, strict=True)]
    pool = st.pool("predictive-admission: offered-load sweeps")
    for s, (m, thr), win in zip(seeded, calib, windows, strict=True):
        loads = tuple(round(k * m, 4) for k in PREDICTIVE_MULTIPLES)
        for rule in PREDICTIVE_RULES:
            pool.add(_predictive_curve, (s, rule, thr, win, loads), len(loads))
    out = pool.run()
    per = len(PREDICTIVE_RULES)
    curves: dict[str, list[list[dict[str, Any]]]] = {r: [] for r in PREDICTIVE_RULES}
    for k in range(len(seeded)):
        for rule, rows in zip(PREDICTIVE_RULES, out[k * per : (k + 1) * per], strict=True):
            curves[rule].append(rows)
    max_loads = [m for m, _ in calib]
    names = [c.name for c in scn.classes]
    header = [
        "rule",
        "offered (x max load)",
        "accepted",
        "accepted / max load - 1",
        "turned away",
        *[f"p99 {n} (SLO {c.slo_ms:g} ms)" for n, c in zip(names, scn.classes, strict=True)],
        "seeds meeting both",
        "target met",
    ]
    rows, csv_rows = [], []
    plot_acc: dict[str, list[tuple[float, float]]] = {}
    plot_p99: dict[str, dict[str, tuple[list[tuple[float, float]], float]]] = {
        f"class {n}: p99 of admitted queries": {} for n in names
    }
    for rule, per_seed in curves.items():
        plot_acc[PREDICTIVE_TITLES[rule]] = []
        pts: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for i, mult in enumerate(PREDICTIVE_MULTIPLES):
            at = [curve[i] for curve in per_seed]
            acc = [r["accepted_load"] for r in at]
            ratio = [a / m - 1.0 for a, m in zip(acc, max_loads, strict=True) if m > 0]
            away = [r["admission_rejected"] / max(r["measured_queries"], 1) for r in at]
            cells = []
            for n in names:
                p99 = [r[f"p99_{n}_ms"] for r in at]
                missed = sum(not r[f"met_{n}"] for r in at)
                cells.append(pm(p99) + (f" ✗{missed}" if missed else ""))
                pts[n].append((mult, statistics.fmean(p99)))
            met = sum(r["all_met"] for r in at)
            # The target: both SLOs met, and at or past the max load an accepted load no
            # more than 2% below it (below it, everything offered should be accepted).
            within = all(x >= -0.02 for x in ratio) if mult >= 1.0 else True
            target = "yes" if met == len(at) and within else "no"
            rows.append(
                [
                    PREDICTIVE_TITLES[rule],
                    f"{mult:g}",
                    pm(acc),
                    pm(ratio, "+.1%"),
                    pm(away, ".1%"),
                    *cells,
                    f"{met}/{len(at)}",
                    target,
                ]
            )
            plot_acc[PREDICTIVE_TITLES[rule]].append((mult, statistics.fmean(acc)))
            for seed, r in zip(st.seeds, at, strict=True):
                csv_rows.append([rule, seed, mult, *(r[k] for k in sorted(r) if k != "rule")])
        for n in names:
            slo = scn.classes[names.index(n)].slo_ms
            plot_p99[f"class {n}: p99 of admitted queries"][PREDICTIVE_TITLES[rule]] = (pts[n], slo)
    cal_rows = []
    for rule in ("predictive", "predictive+throttle"):
        for i, mult in enumerate(PREDICTIVE_MULTIPLES):
            at = [curve[i] for curve in curves[rule]]
            cells = []
            for n in names:
                cells.append(pm([r[f"predicted_{n}"] for r in at], ".4f"))
                cells.append(pm([r[f"met_share_{n}"] for r in at], ".4f"))
            cal_rows.append([PREDICTIVE_TITLES[rule], f"{mult:g}", *cells])
    cal_header = ["rule", "offered (x max load)"]
    for n in names:
        cal_header += [f"{n}: mean predicted P", f"{n}: share within SLO"]
    keys = sorted(k for k in curves["none"][0][0] if k != "rule")
    write_csv(
        st.out_dir / "predictive_admission.csv", ["rule", "seed", "multiple", *keys], csv_rows
    )
    max_load = statistics.fmean(max_loads)
    plot_acc["max load without admission"] = [
        (PREDICTIVE_MULTIPLES[0], max_load),
        (PREDICTIVE_MULTIPLES[-1], max_load),
    ]
    plots.line_panels(
        st.out_dir / "predictive_accepted_load.png",
        {"accepted load": plot_acc},
        title="Accepted load vs offered load (means over seeds)",
        xlabel="offered load / max load without admission",
        ylabel="accepted load",
        ncols=1,
    )
    plots.curves_with_slo(
        st.out_dir / "predictive_p99.png",
        plot_p99,
        title="p99 of admitted queries (dashed: SLOs; means over seeds)",
        xlabel="offered load / max load without admission",
        ylabel="p99 latency (ms)",
    )
    a = scn.admission
    return [
        "## Calibration (per seed)\n\n"
        "Max load without admission (TF-EDFQ, bisection to "
        f"{st.tol:g}): {', '.join(f'{m:.3f}' for m in max_loads)}; R_cth^U, the miss ratio "
        f"there: {', '.join(f'{t:.4f}' for _, t in calib)}. Reject-all's time window: the time "
        f"{a.window_tasks:,} tasks take at the max load "
        f"({statistics.fmean(windows) * 1000:.0f} ms); the throttle steps every "
        f"{a.throttle_interval_s:g} s with gain {a.throttle_gain:g} on the count window. The "
        "predictive rule admits a query when its predicted probability of meeting the SLO "
        "(`admission.waiting.meet_probability` over its 100 targets' estimated waits, with "
        "overtaking) is at least its class's percentile, 0.99.",
        "## Admitted queries and accepted load\n\n"
        f"Means over {len(st.seeds)} seeds ± 95% CI. `✗n`: the class misses its SLO on n "
        "seeds. Target met: every seed meets both SLOs and, from 1x the max load up, the "
        "accepted load is at least 98% of it.\n\n" + md_table(header, rows),
        "## Is the prediction calibrated?\n\n"
        "For the admitted queries of each class: the mean probability of meeting the SLO "
        "that the rule predicted when it admitted them, and the share that did. A calibrated "
        "estimate has the share at or above the prediction; each admitted query was "
        "predicted at least 0.99.\n\n" + md_table(cal_header, cal_rows),
    ]


# --- least-wait ------------------------------------------------------------------------------

PICKS = ("random", "least-wait")
PICK_POLICIES = ("fifo", "tf-edfq")


def least_wait(st: Any, base: Any) -> list[str]:
    """Max load at the SLO with random and least-wait choice of a query's servers."""
    scn = st.scenario(base, "masstree")
    pool = st.pool("least-wait: max-load searches")
    keys = []
    for s in st.seeded(scn):
        for policy in PICK_POLICIES:
            for pick in PICKS:
                pool.add(
                    ex.max_load_job,
                    (replace(s, run=replace(s.run, pick=pick)), policy, st.tol),
                    ex._bisection_runs(ex.HIGH - ex.LOW, st.tol) + 1,
                )
                keys.append((s.run.seed, policy, pick))
    runs = pool.run()
    rows, csv_rows = [], []
    for policy in PICK_POLICIES:
        per = {
            pick: [r for (_, p, k), r in zip(keys, runs, strict=True) if p == policy and k == pick]
            for pick in PICKS
        }
        rand = [r["max_load"] for r in per["random"]]
        for pick in PICKS:
            loads = [r["max_load"] for r in per[pick]]
            gain = [a / b - 1.0 for a, b in zip(loads, rand, strict=True) if b > 0]
            # The search's upper end met: the true max load is at least that.
            capped = sum(r["bracket"][0] == r["bracket"][1] for r in per[pick])
            rows.append(
                [
                    policy,
                    pick,
                    pm(loads)
                    + (f" (≥: {capped} of {len(loads)} at the search's top)" if capped else ""),
                    f"{min(loads):.3f}-{max(loads):.3f}",
                    pm(gain, "+.1%") if pick != "random" else "-",
                    pm([r["utilisation"] for r in per[pick]], ".1%"),
                ]
            )
        for (seed, p, k), r in zip(keys, runs, strict=True):
            if p == policy:
                csv_rows.append([seed, p, k, r["max_load"], *r["bracket"], r["utilisation"]])
    write_csv(
        st.out_dir / "least_wait.csv",
        ["seed", "policy", "pick", "max_load", "bracket_lo", "bracket_hi", "utilisation"],
        csv_rows,
    )
    pools = ", ".join(f"{p.name} {p.count} x{p.service_scale:g}" for p in scn.servers.pools)
    unjudged = sorted({r["unjudged"] for r in runs if r["unjudged"]})
    notes = "".join(f"\n\nUnjudged probes (not called met): {u}" for u in unjudged)
    header = [
        "policy",
        "pick",
        "max load",
        "min-max over seeds",
        "gain over random",
        "utilisation at max load",
    ]
    return [
        "## Setup\n\n"
        f"Pools: {pools}; fanout {dict(zip(*scn.fanout.values_and_probs(), strict=True))}; "
        + ", ".join(f"class {c.name} p{c.percentile:g} <= {c.slo_ms:g} ms" for c in scn.classes)
        + f"; {scn.run.queries:,} queries per probe; seeds {', '.join(map(str, st.seeds))}; "
        f"bisection to {st.tol:g}. Least-wait ranks every server by the estimated wait of a "
        "task joining the back of its queue (`admission.waiting.estimate_wait`, from its "
        "exact state), ties to the faster server; each query's x_p^u is solved over exactly "
        "the servers it got. Load counts the servers' scaled mean service.",
        "## Max load at the SLO\n\nMeans over seeds ± 95% CI; a search whose top load "
        f"({ex.HIGH:g}) still met the SLO is marked ≥, and its gain is a lower bound.\n\n"
        + md_table(header, rows)
        + notes,
    ]


EXPERIMENTS = (
    Experiment(
        "wait-estimator",
        "QLM's waiting-time estimate vs the actual queue wait, by class, position and groups",
        10_000,
        ("masstree",),
        wait_estimator,
        searches_max_load=False,
    ),
    Experiment(
        "least-wait",
        "least-wait vs random choice of a query's servers on a heterogeneous pool",
        20_000,
        ("masstree",),
        least_wait,
        searches_max_load=False,
    ),
    Experiment(
        "predictive-admission",
        "predictive admission (QLM's estimate) vs the miss-ratio rules, 0.5-3x the max load",
        20_000,
        ("masstree",),
        predictive_admission,
        searches_max_load=False,
    ),
)
"""QLM §6's estimator, measured, and the admission rule it drives."""
