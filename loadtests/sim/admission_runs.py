"""What the admission experiments share: one run's row, a rule's scenario, the calibration
of the max load and R_cth^U, and the mean ± CI cell.

Used by `loadtests.sim.overload_experiments` (``admission``) and
`loadtests.sim.qlm_experiments` (``predictive-admission``); the functions are module-level so
they run in the experiments' worker processes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import numpy as np

from admission import AdmissionConfig, AdmissionPolicy, Rule
from loadtests.sim import experiments as ex
from loadtests.sim.engine import simulate
from loadtests.sim.experiments import _tick
from loadtests.sim.report import report
from taskserver.queues import QueuePolicy

__all__ = ["calibrate", "calibrate_seeds", "count_window_s", "pm", "rule_scenario", "run_row"]


def run_row(scn: Any, load: float, rule: str) -> dict[str, Any]:
    """One run at one offered load: accepted load, miss ratio, per-class p99 and verdicts."""
    res = simulate(scn, load)
    rep = report(res)
    row: dict[str, Any] = {
        "rule": rule,
        "offered_load": load,
        "accepted_load": res.accepted_load,
        "miss_ratio": res.miss_ratio,
        "admission_rejected": res.admission_rejected,
        "measured_queries": res.measured_queries,
        "all_met": rep.met,
    }
    for i, (name, stat) in enumerate(rep.classes.items()):
        row[f"p99_{name}_ms"] = stat.latency_ms
        row[f"slo_{name}_ms"] = stat.slo_ms
        row[f"met_{name}"] = stat.met
        mine = res.cls == i
        # The share of its admitted queries within the SLO, and (predictive rule) the mean
        # probability of that the rule predicted for them: its calibration.
        row[f"met_share_{name}"] = (
            float(np.mean(res.latency_ms[mine] <= stat.slo_ms)) if mine.any() else math.nan
        )
        row[f"predicted_{name}"] = (
            float(np.nanmean(res.meet_prob[mine]))
            if res.meet_prob is not None and mine.any()
            else math.nan
        )
    return row


def rule_scenario(scn: Any, rule: str, threshold: float, window: float) -> Any:
    """The scenario under one rule: none, reject-all on a time window of `window` seconds,
    or the scenario's own [admission] table with this rule and R_cth^U."""
    if rule == Rule.NONE:
        return replace(scn, admission=AdmissionConfig(policy=AdmissionPolicy.NONE))
    a = replace(scn.admission, rule=rule, threshold=threshold)
    if rule == "reject-all":
        a = replace(a, window_tasks=0, window_s=window)
    return replace(scn, admission=a)


def calibrate(job: int, scn: Any, tol: float) -> tuple[float, float]:
    """(max load without admission, R_cth^U: the miss ratio without admission there)."""
    from loadtests.sim.maxload import find_max_load

    bare = replace(scn, admission=AdmissionConfig(policy=AdmissionPolicy.NONE))
    m = find_max_load(
        bare, QueuePolicy.TF_EDFQ, lo=ex.LOW, hi=ex.HIGH, tol=tol, run=ex._runner(job)
    )
    res = simulate(bare, m.max_load) if m.max_load > 0 else None
    _tick(job)
    return m.max_load, (res.miss_ratio if res is not None else math.nan)


def calibrate_seeds(
    st: Any, seeded: list[Any], name: str, *, need_load: bool = True
) -> list[tuple[float, float]]:
    """`calibrate` on every seed in the experiment's worker pool; with `need_load`, a seed
    on which no load met the SLOs is refused with what to do about it."""
    pool = st.pool(f"{name}: max load without admission and R_cth^U")
    for s in seeded:
        pool.add(calibrate, (s, st.tol), ex._bisection_runs(ex.HIGH - ex.LOW, st.tol) + 1)
    calib: list[tuple[float, float]] = pool.run()
    if need_load and any(m <= 0 for m, _ in calib):
        raise ValueError(
            f"{name}: no load met the SLOs without admission on some seed "
            f"(max loads {[round(m, 3) for m, _ in calib]}): run more queries (--queries)"
        )
    if not all(0.0 < r < 1.0 for _, r in calib):
        # The admission rules need it as their threshold: none without a max load (nan),
        # and none where no task missed there (a run too short to see the tail).
        raise ValueError(
            f"{name}: R_cth^U, the miss ratio without admission at the max load, is "
            f"{[round(r, 5) for _, r in calib]} by seed (max loads "
            f"{[round(m, 3) for m, _ in calib]}); it must be in (0, 1) to be the admission "
            f"threshold: run more queries (--queries)"
        )
    return calib


def pm(values: list[float], fmt: str = ".3f") -> str:
    """Mean ± the 95% CI of the finite values ("-" without any: no query of that kind)."""
    from loadtests.sim.maxload import ci95

    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "-"
    text = format(statistics.fmean(finite), fmt)
    if len(finite) > 1:
        text += f" ± {ci95(finite):{fmt.lstrip('+')}}"
    if len(finite) < len(values):
        text += f" ({len(finite)} of {len(values)} seeds)"
    return text


def count_window_s(scn: Any, max_load: float) -> float:
    """Seconds the scenario's count window of tasks takes to fill at the max load."""
    from loadtests.sim.workload import make_workload

    w = make_workload(scn, max_load)
    span_ms = float(w.arrival_ms[-1] - w.arrival_ms[0])
    tasks_per_ms = w.tasks / span_ms
    return scn.admission.window_tasks / tasks_per_ms / 1000.0
