"""Experiments on client-side-scheduling's overload layer: what cost information buys.

- ``information-ladder`` (client-side-scheduling §3.3/§4.4's four levels): TailGuard's
  fanout types (k_f 1 / 10 / 100 in proportion 60 : 30 : 10) in two classes, offered at 1-2x
  its max load without admission, under the cost ladder with no magnitude information
  (every query alike, so it can only shed cost-blind: uniform shedding), class labels only
  (each query carries its class's mean cost), the gateway's own prior k_f * x_p^u(k_f), and
  the exact cost (the service times its tasks will draw: an oracle). Reported: the p95
  latency of the single-task ("short") queries, goodput (the share of offered queries
  admitted and answered within their SLO), the accepted load, per-class p99 and who was
  turned away by fanout. R_cth^U is calibrated per seed as in the ``admission`` experiment.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import numpy as np

from admission import Rule
from loadtests.sim.admission_runs import calibrate_seeds, pm
from loadtests.sim.engine import simulate
from loadtests.sim.experiments import Experiment, _tick
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.report import percentile, report

__all__ = ["EXPERIMENTS"]

LEVELS = ("none", "class", "estimate", "exact")
LEVEL_TITLES = {
    "none": "none (uniform shedding)",
    "class": "class only",
    "estimate": "k_f * x_p^u (the gateway's)",
    "exact": "exact cost (oracle)",
}
MULTIPLES = (1.0, 1.5, 2.0)
"""Offered loads, as multiples of the max load without admission."""


def _level_scenario(scn: Any, level: str, threshold: float) -> Any:
    a = replace(
        scn.admission,
        rule=Rule.COST_LADDER,
        threshold=threshold,
        ladder_shedding="uniform" if level == "none" else "ladder",
    )
    return replace(scn, admission=a, run=replace(scn.run, cost_information=level))


def _level_curve(
    job: int, scn: Any, level: str, threshold: float, loads: tuple[float, ...]
) -> list[dict[str, Any]]:
    """Every offered load at one information level."""
    s = _level_scenario(scn, level, threshold)
    rows = []
    for load in loads:
        res = simulate(s, load)
        rep = report(res)
        slo = np.array([c.slo_ms for c in s.classes])
        within = res.latency_ms <= slo[res.cls]
        row: dict[str, Any] = {
            "level": level,
            "offered_load": load,
            "accepted_load": res.accepted_load,
            "goodput": float(within.sum()) / max(res.measured_queries, 1),
            "p95_short_ms": percentile(res.latency_ms[res.fanout == 1], 95.0),
            "all_met": rep.met,
        }
        for i, (name, stat) in enumerate(rep.classes.items()):
            row[f"p99_{name}_ms"] = stat.latency_ms
            row[f"met_{name}"] = stat.met
            del i
        row.update(_turned_away(s, load, res))
        rows.append(row)
        _tick(job)
    return rows


def _turned_away(scn: Any, load: float, res: Any) -> dict[str, float]:
    """Share of the offered queries of each fanout that were not admitted."""
    from loadtests.sim.workload import make_workload

    w = make_workload(scn, load)
    first = int(scn.run.warmup * w.queries)
    offered = w.fanout[first:]
    admitted = np.bincount(res.fanout, minlength=offered.max() + 1)
    out = {}
    for k in np.unique(offered):
        n = int((offered == k).sum())
        out[f"away_k{int(k)}"] = 1.0 - float(admitted[k]) / n if n else 0.0
    return out


def information_ladder(st: Any, base: Any) -> list[str]:
    """Short-query p95 and goodput by level of cost information, under overload."""
    scn = st.scenario(base, "masstree")
    seeded = st.seeded(scn)
    calib = calibrate_seeds(st, seeded, "information-ladder")
    pool = st.pool("information-ladder: offered-load sweeps")
    for s, (m, thr) in zip(seeded, calib, strict=True):
        loads = tuple(round(k * m, 4) for k in MULTIPLES)
        for level in LEVELS:
            pool.add(_level_curve, (s, level, thr, loads), len(loads))
    out = pool.run()
    names = [c.name for c in scn.classes]
    ks = sorted({int(k[6:]) for curve in out for r in curve for k in r if k.startswith("away_k")})
    header = [
        "cost information",
        "offered (x max load)",
        "goodput",
        "p95 k=1 (ms)",
        "accepted",
        *[f"p99 {n} (SLO {c.slo_ms:g})" for n, c in zip(names, scn.classes, strict=True)],
        *[f"turned away k={k}" for k in ks],
        "seeds meeting all (none unjudged)",
    ]
    rows, csv_rows = [], []
    for li, level in enumerate(LEVELS):
        per_seed = [out[k * len(LEVELS) + li] for k in range(len(seeded))]
        for i, mult in enumerate(MULTIPLES):
            at = [curve[i] for curve in per_seed]
            cells = []
            for n in names:
                missed = sum(not r[f"met_{n}"] for r in at)
                cells.append(pm([r[f"p99_{n}_ms"] for r in at]) + (f" ✗{missed}" if missed else ""))
            rows.append(
                [
                    LEVEL_TITLES[level],
                    f"{mult:g}",
                    pm([r["goodput"] for r in at], ".1%"),
                    pm([r["p95_short_ms"] for r in at]),
                    pm([r["accepted_load"] for r in at]),
                    *cells,
                    *[pm([r.get(f"away_k{k}", 0.0) for r in at], ".1%") for k in ks],
                    f"{sum(r['all_met'] for r in at)}/{len(at)}",
                ]
            )
            for seed, r in zip(st.seeds, at, strict=True):
                csv_rows.append([level, seed, mult, *(r[k] for k in sorted(r) if k != "level")])
    keys = sorted(k for k in out[0][0] if k != "level")
    write_csv(st.out_dir / "information_ladder.csv", ["level", "seed", "multiple", *keys], csv_rows)
    max_loads = [m for m, _ in calib]
    ladder = scn.admission
    fanouts = dict(zip(*scn.fanout.values_and_probs(), strict=True))
    return [
        "## Setup\n\n"
        f"{scn.servers.count} servers; fanout {fanouts}; "
        + ", ".join(f"class {c.name} p{c.percentile:g} <= {c.slo_ms:g} ms" for c in scn.classes)
        + f"; {scn.run.queries:,} queries per run; seeds {', '.join(map(str, st.seeds))}. Max "
        f"load without admission: {', '.join(f'{m:.3f}' for m in max_loads)} (mean "
        f"{statistics.fmean(max_loads):.3f}); R_cth^U, the miss ratio there: "
        f"{', '.join(f'{t:.4f}' for _, t in calib)}. The cost ladder's severity reads the "
        f"miss ratio over {ladder.window_tasks:,} tasks, the queue pressure and the tails; its "
        "rungs (0.45 / 0.65 / 0.80) and bucket cuts are the defaults.",
        "## By level of cost information\n\n"
        f"Means over {len(st.seeds)} seeds ± 95% CI. Goodput: the share of offered queries "
        "admitted and answered within their class's SLO. `✗n`: the class misses its p99 SLO "
        "on n seeds.\n\n" + md_table(header, rows),
    ]


EXPERIMENTS = (
    Experiment(
        "information-ladder",
        "what cost information buys the overload ladder: short-query p95 and goodput",
        24_000,
        ("masstree",),
        information_ladder,
        searches_max_load=False,
    ),
)
"""client-side-scheduling's information ladder on TailGuard's fanout mix."""
