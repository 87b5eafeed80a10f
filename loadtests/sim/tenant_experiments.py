"""Experiments on the allocation layer (client-side-scheduling §3.1): fair share of tenants.

- ``fair-share``: two tenants share one pool through the gateway's central queues, in one
  class (one SLO): "interactive" sends small-fanout queries at a steady half of the max load,
  "bulk" floods with large-fanout queries at 1-4x that. Under TF-EDFQ a larger fanout means
  an earlier task deadline (t_D = t0 + SLO - x_p^u(k_f)), so without allocation the flood's
  tasks go first everywhere. Compared: ``[allocation] policy`` none, drr with the central
  queues only (share = false), drr, and fair, all under TailGuard's reject-all admission
  on the miss ratio, whose R_cth^U and window are calibrated per seed as in the
  ``admission`` experiment (on the mix where each tenant offers half of the max load).
  Reported per tenant: goodput (the share of its offered queries answered within the SLO),
  the admitted share and the p99 of its admitted queries.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import numpy as np

from loadtests.sim.admission_runs import calibrate_seeds, count_window_s, pm, rule_scenario
from loadtests.sim.engine import simulate
from loadtests.sim.experiments import Experiment, _tick
from loadtests.sim.output import md_table, write_csv
from loadtests.sim.report import percentile

__all__ = ["EXPERIMENTS"]

VARIANTS = (
    ("none", "none"),
    ("drr", "none"),
    ("drr", "transfer"),
    ("drr", "windows"),
    ("drr-round", "windows"),
    ("fair", "windows"),
)
"""(allocation policy, admission share) compared."""
FLOOD = (1.0, 2.0, 3.0, 4.0)
"""The bulk tenant's offered load, as multiples of the interactive tenant's."""


def variant_name(policy: str, share: str) -> str:
    """How a (policy, share) pair is called in the tables."""
    if policy == "none":
        return "none"
    return f"{policy}, queues only" if share == "none" else f"{policy}, share {share}"


def tenant_mix(scn: Any, loads: tuple[float, ...]) -> tuple[Any, float]:
    """The scenario with each class (tenant) offering its load in `loads` (fractions of the
    servers' capacity), and the total load."""
    classes = tuple(
        replace(c, share=load / (c.fanout or scn.fanout.mean()))
        for c, load in zip(scn.classes, loads, strict=True)
    )
    return replace(scn, classes=classes), sum(loads)


def _curve(
    job: int,
    scn: Any,
    variant: tuple[str, str],
    threshold: float,
    window_s: float,
    half: float,
) -> list[dict[str, Any]]:
    """Every flood level under one allocation variant; half: each tenant's load at the
    calibration mix (half the max load)."""
    from loadtests.sim.workload import make_workload

    policy, share = variant
    base = rule_scenario(scn, "reject-all", threshold, window_s)
    order = "round" if policy.endswith("-round") else "deadline"
    alloc = replace(base.allocation, policy=policy.removesuffix("-round"), share=share, order=order)
    base = replace(base, allocation=alloc)
    rows = []
    for mult in FLOOD:
        s, load = tenant_mix(base, (half, half * mult))
        res = simulate(s, load)
        w = make_workload(s, load)
        first = int(s.run.warmup * w.queries)
        offered = np.bincount(w.cls[first:], minlength=len(s.classes))
        row: dict[str, Any] = {"flood": mult, "offered_load": load, "miss_ratio": res.miss_ratio}
        for c, spec in enumerate(s.classes):
            lat = res.latency_ms[res.cls == c]
            n = int(offered[c])
            row[f"goodput_{spec.name}"] = float((lat <= spec.slo_ms).sum()) / n if n else math.nan
            row[f"admitted_{spec.name}"] = lat.size / n if n else math.nan
            row[f"p99_{spec.name}_ms"] = percentile(lat, spec.percentile) if lat.size else math.nan
        rows.append(row)
        _tick(job)
    return rows


def fair_share(st: Any, base: Any) -> list[str]:
    """Per-tenant goodput and p99 while one tenant floods, by allocation policy."""
    from loadtests.sim import plots

    scn = st.scenario(base, "masstree")
    seeded = st.seeded(scn)
    # Calibrate where the two tenants offer equal load; then each offers half the max load.
    equal = [tenant_mix(s, (0.5,) * len(s.classes))[0] for s in seeded]
    calib = calibrate_seeds(st, equal, "fair-share")
    windows = [count_window_s(s, m) for s, (m, _) in zip(equal, calib, strict=True)]
    pool = st.pool("fair-share: flood sweeps")
    for s, (m, thr), win in zip(seeded, calib, windows, strict=True):
        for variant in VARIANTS:
            pool.add(_curve, (s, variant, thr, win, m / 2), len(FLOOD))
    out = pool.run()
    names = [c.name for c in scn.classes]
    header = [
        "allocation",
        "bulk load (x interactive's)",
        *[f"goodput {n}" for n in names],
        *[f"admitted {n}" for n in names],
        *[f"p99 {n} (ms)" for n in names],
    ]
    rows, csv_rows = [], []
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {
        f"goodput {n}": {} for n in names
    } | {f"p99 {n} (ms)": {} for n in names}
    for vi, variant in enumerate(VARIANTS):
        label = variant_name(*variant)
        per_seed = [out[k * len(VARIANTS) + vi] for k in range(len(seeded))]
        for i, mult in enumerate(FLOOD):
            at = [curve[i] for curve in per_seed]
            rows.append(
                [
                    label,
                    f"{mult:g}",
                    *[pm([r[f"goodput_{n}"] for r in at], ".1%") for n in names],
                    *[pm([r[f"admitted_{n}"] for r in at], ".1%") for n in names],
                    *[pm([r[f"p99_{n}_ms"] for r in at]) for n in names],
                ]
            )
            for n in names:
                panels[f"goodput {n}"].setdefault(label, []).append(
                    (mult, statistics.fmean(r[f"goodput_{n}"] for r in at))
                )
                p99 = [r[f"p99_{n}_ms"] for r in at if math.isfinite(r[f"p99_{n}_ms"])]
                if p99:
                    panels[f"p99 {n} (ms)"].setdefault(label, []).append(
                        (mult, statistics.fmean(p99))
                    )
            for seed, r in zip(st.seeds, at, strict=True):
                csv_rows.append([label, seed, *(r[k] for k in sorted(r))])
    keys = sorted(out[0][0])
    write_csv(st.out_dir / "fair_share.csv", ["allocation", "seed", *keys], csv_rows)
    plots.line_panels(
        st.out_dir / "fair_share.png",
        panels,
        title="fair-share: two tenants, one flooding",
        xlabel="bulk load (x interactive's)",
        ylabel="",
        ncols=2,
    )
    max_loads = [m for m, _ in calib]
    tenants = ", ".join(
        f"{c.flow} (class {c.name}, k_f {c.fanout}, p{c.percentile:g} <= {c.slo_ms:g} ms)"
        for c in scn.classes
    )
    return [
        "## Setup\n\n"
        f"{scn.servers.count} servers, central queues ({scn.run.policy}); tenants {tenants}; "
        f"{scn.run.queries:,} queries per run; seeds {', '.join(map(str, st.seeds))}. Max load "
        f"without admission where the tenants offer equal load: "
        f"{', '.join(f'{m:.3f}' for m in max_loads)} (mean {statistics.fmean(max_loads):.3f}); "
        f"R_cth^U, the miss ratio there: {', '.join(f'{t:.4f}' for _, t in calib)}; reject-all "
        f"reads the miss ratio over a time window of "
        f"{', '.join(f'{1000 * w:.1f}' for w in windows)} ms (the time "
        f"{scn.admission.window_tasks:,} tasks take at the max load). The interactive tenant "
        "offers half the max load; the bulk tenant 1-4x as much. DRR's quantum is "
        + (
            f"{scn.allocation.quantum_ms:g} ms of cost"
            if scn.allocation.quantum_ms
            else "the largest task cost seen (automatic)"
        )
        + "; weights "
        f"{dict(scn.allocation.weights) or 'all 1'}; the admission share's window "
        f"{scn.allocation.share_window_s:g} s.",
        "## Per tenant\n\n"
        f"Means over {len(st.seeds)} seeds ± 95% CI. Goodput: the share of the tenant's offered "
        "queries answered within the SLO; admitted: the share admitted; p99 over the admitted "
        "ones.\n\n" + md_table(header, rows),
    ]


EXPERIMENTS = (
    Experiment(
        "fair-share",
        "two tenants, one flooding with large fanouts: per-tenant goodput and p99 by allocation",
        40_000,
        ("masstree",),
        fair_share,
        searches_max_load=False,
    ),
)
"""The allocation layer against a flooding tenant."""
