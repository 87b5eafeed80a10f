"""Swayam's evaluation shapes on the pool simulator (Swayam §5; `loadtests.sim.pool`).

- ``swayam-traces``: one pool of single-task requests (Xapian service times) on bursty
  rate traces drawn per seed (`bursty_trace`: 600 s, a slowly wandering base with bursts of
  1.5-3x after exponential gaps of ~90 s, each ramping up in 1-8 s and holding 10-40 s), one
  trace per seed, under Swayam (rate prediction at t_setup, burst factor U, n_B from the
  waiting-time model, ordered routing and passive scale-in), the threshold autoscaler on the
  miss ratio, and static provisioning for the trace's peak (the always-over-provisioned
  baseline). Reported per trace and policy: SLA compliance per window of 1,000 requests
  (the paper's > 96% measure), resource use in backend-seconds (and relative to static),
  peak backends; and the rate predictor's accuracy: the rate Swayam predicted for t +
  t_setup against the rate that arrived then (the paper's prediction figure).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.sim.experiments import Experiment, _tick
from loadtests.sim.output import md_table, write_csv

__all__ = ["EXPERIMENTS"]

POLICIES = ("swayam", "threshold", "static")


def _run(job: int, scn: Any, policy: str) -> Any:
    from loadtests.sim.pool import simulate_pool

    res = simulate_pool(scn, policy)
    _tick(job)
    return res


def prediction_error(result: Any, setup_s: float) -> tuple[list[tuple[float, float, float]], float]:
    """(time + t_setup, predicted, actual rate) per decision whose target time the trace
    reached, and the mean absolute percentage error over them."""
    actual = {round(p["time_s"], 6): p["rate_per_s"] for p in result.timeline}
    pairs = []
    for t, predicted in result.predictions:
        at = round(t + setup_s, 6)
        if at in actual:
            pairs.append((at, predicted, actual[at]))
    errors = [abs(p - a) / a for _, p, a in pairs if a > 0]
    return pairs, (statistics.fmean(errors) if errors else math.nan)


def swayam_traces(st: Any, base: Any) -> list[str]:
    """Compliance and backend-seconds of Swayam, thresholds and static provisioning."""
    from loadtests.sim import plots
    from loadtests.sim.pool import bursty_trace

    scn = replace(
        base, service=replace(base.service, path=str(st.data_dir / "xapian_quantiles.txt"))
    )
    traces = []
    for seed in st.seeds:
        times, rates = bursty_trace(seed)
        traces.append(replace(scn, trace_s=times, trace_rate=rates, seed=seed))
    pool = st.pool("swayam-traces")
    for s in traces:
        for policy in POLICIES:
            pool.add(_run, (s, policy), 1)
    out = pool.run()
    header = [
        "trace (seed)",
        "policy",
        f"windows of {scn.window_requests:,} meeting p{scn.percentile:g} <= {scn.target_ms:g} ms",
        "backend-seconds",
        "vs static",
        "peak warm",
        "scaling actions",
    ]
    rows, csv_rows, pred_rows = [], [], []
    summary: dict[str, dict[str, list[float]]] = {p: {"c": [], "b": []} for p in POLICIES}
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    mapes = []
    for ti, s in enumerate(traces):
        results = out[ti * len(POLICIES) : (ti + 1) * len(POLICIES)]
        static = results[POLICIES.index("static")].backend_seconds
        for r in results:
            c = r.compliance(s)
            summary[r.policy]["c"].append(c)
            summary[r.policy]["b"].append(r.backend_seconds / static)
            rows.append(
                [
                    s.seed,
                    r.policy,
                    f"{c:.1%}",
                    f"{r.backend_seconds:,.0f}",
                    f"{r.backend_seconds / static:.0%}",
                    max(int(p["warm"]) for p in r.timeline),
                    len(r.actions),
                ]
            )
            csv_rows.append([s.seed, r.policy, c, r.backend_seconds, r.miss_ratio, len(r.actions)])
            if r.policy == "swayam":
                pairs, mape = prediction_error(r, s.setup_s)
                mapes.append(mape)
                pred_rows += [[s.seed, t, p, a] for t, p, a in pairs]
                if ti == 0:
                    panels["rate (req/s): predicted for t vs arrived at t"] = {
                        "predicted": [(t, p) for t, p, _ in pairs],
                        "arrived": [(t, a) for t, _, a in pairs],
                    }
        panels[f"warm backends, trace {s.seed}"] = {
            r.policy: [(p["time_s"], p["warm"]) for p in r.timeline] for r in results
        }
    write_csv(
        st.out_dir / "swayam_traces.csv",
        ["trace_seed", "policy", "compliance", "backend_seconds", "miss_ratio", "actions"],
        csv_rows,
    )
    write_csv(
        st.out_dir / "rate_prediction.csv",
        ["trace_seed", "time_s", "predicted_per_s", "arrived_per_s"],
        pred_rows,
    )
    plots.line_panels(
        st.out_dir / "swayam_traces.png",
        panels,
        title="Swayam, thresholds and static provisioning on bursty traces",
        xlabel="time (s)",
        ylabel="",
        ncols=2,
    )
    means = [
        [
            p,
            f"{statistics.fmean(v['c']):.1%} ({min(v['c']):.1%}-{max(v['c']):.1%})",
            f"{statistics.fmean(v['b']):.0%} ({min(v['b']):.0%}-{max(v['b']):.0%})",
        ]
        for p, v in summary.items()
    ]
    shapes = "; ".join(
        f"seed {s.seed}: {_bursts(s)} bursts, peak {max(s.trace_rate):.2f}x" for s in traces
    )
    return [
        f"## Setup\n\n{scn.description}. Service `{Path(scn.service.path or '').name}`; "
        f"t_setup {scn.setup_s:g} s, idle retirement T = {scn.idle_s:g} s, decisions every "
        f"{scn.interval_s:g} s. Swayam: U = {scn.burst:g}, rate regression over "
        f"{scn.history_s:g} s. Threshold: R_sth^U = {scn.upper:g}, R_sth^L = {scn.lower:g}, "
        f"window {scn.window_tasks:,} tasks, cooldowns {scn.up_cooldown_s:g} s up / "
        f"{scn.down_cooldown_s:g} s down. Static: the backends the model asks for at each "
        f"trace's peak rate, from the start. Traces ({len(traces)}, one per seed): {shapes}.",
        "## Per trace\n\n" + md_table(header, rows),
        "## Over the traces\n\nMean (min-max) over the traces; resource use relative to "
        "static provisioning on the same trace.\n\n"
        + md_table(["policy", "SLA compliance", "backend-seconds vs static"], means),
        "## Rate prediction\n\nSwayam's linear regression over the last "
        f"{scn.history_s:g} s, extrapolated t_setup = {scn.setup_s:g} s ahead, against the "
        "rate that arrived then: mean absolute percentage error "
        + ", ".join(f"{m:.1%}" for m in mapes)
        + " (per trace); `rate_prediction.csv` has every pair.",
    ]


def _bursts(scn: Any) -> int:
    """Bursts in a trace: rises of more than 40% between two corners."""
    r = np.asarray(scn.trace_rate)
    return int(np.sum(r[1:] > 1.4 * r[:-1]))


EXPERIMENTS = (
    Experiment(
        "swayam-traces",
        "Swayam vs threshold scaling vs static provisioning on bursty traces",
        0,
        ("xapian",),
        swayam_traces,
        pool=True,
        searches_max_load=False,
    ),
)
"""Swayam §5's evaluation shapes on the pool simulator."""
