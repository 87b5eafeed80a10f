"""Experiments on multi-query requests (TailGuard eq. (5)).

- ``multi-query``: requests of two fanout queries in a row under one p99 SLO; the max load
  at which requests meet it when the remaining SLO is shared between the stages by each rule
  of `gateway.stages` (all slack to the stage that runs, in proportion to the stages'
  unloaded latencies, or equally), under TF-EDFQ and FIFO, over seeds. TailGuard leaves
  the assignment to future work; the comparison is ours.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gateway.stages import STAGE_RULES
from loadtests.sim import experiments as ex
from loadtests.sim.admission_runs import pm
from loadtests.sim.experiments import Experiment
from loadtests.sim.output import md_table, write_csv

__all__ = ["EXPERIMENTS"]

POLICIES = ("fifo", "tf-edfq")


def multi_query(st: Any, base: Any) -> list[str]:
    """Max load of multi-query requests under each rule for sharing their SLO."""
    scn = st.scenario(base, "masstree")
    pool = st.pool("multi-query: max-load searches")
    keys = []
    for s in st.seeded(scn):
        for policy in POLICIES:
            for rule in STAGE_RULES:
                runs = ex._bisection_runs(ex.HIGH - ex.LOW, st.tol)
                staged = replace(s, requests=replace(s.requests, rule=rule))
                pool.add(ex.max_load_job, (staged, policy, st.tol), runs)
                keys.append((s.run.seed, policy, rule))
    out = pool.run()
    rows, csv_rows = [], []
    for policy in POLICIES:
        base_loads = [
            r["max_load"]
            for (_, p, k), r in zip(keys, out, strict=True)
            if p == policy and k == STAGE_RULES[0]
        ]
        for rule in STAGE_RULES:
            loads = [
                r["max_load"]
                for (_, p, k), r in zip(keys, out, strict=True)
                if p == policy and k == rule
            ]
            gain = [a / b - 1.0 for a, b in zip(loads, base_loads, strict=True) if b > 0]
            rows.append(
                [
                    policy,
                    rule,
                    pm(loads),
                    f"{min(loads):.3f}-{max(loads):.3f}",
                    pm(gain, "+.1%") if rule != STAGE_RULES[0] else "-",
                ]
            )
    for (seed, policy, rule), r in zip(keys, out, strict=True):
        csv_rows.append([seed, policy, rule, r["max_load"], *r["bracket"]])
    write_csv(
        st.out_dir / "multi_query.csv",
        ["seed", "policy", "rule", "max_load", "bracket_lo", "bracket_hi"],
        csv_rows,
    )
    unjudged = sorted({r["unjudged"] for r in out if r["unjudged"]})
    notes = "".join(f"\n\nUnjudged probes (not called met): {u}" for u in unjudged)
    fanouts = dict(zip(*scn.fanout.values_and_probs(), strict=True))
    header = ["policy", "stage rule", "max load", "min-max over seeds", f"vs {STAGE_RULES[0]}"]
    valid = [r["max_load"] for r in out if r["max_load"] > 0]
    spread = max(valid) - min(valid) if valid else math.nan
    return [
        "## Setup\n\n"
        f"{scn.servers.count} servers; requests of {scn.requests.stages} stages, each stage's "
        f"fanout drawn from {fanouts}; "
        + ", ".join(f"class {c.name} p{c.percentile:g} <= {c.slo_ms:g} ms" for c in scn.classes)
        + f"; {scn.run.queries:,} queries ({scn.run.queries // scn.requests.stages:,} "
        f"requests) per probe; seeds {', '.join(map(str, st.seeds))}; bisection to {st.tol:g}. "
        "A request is judged by its widest stage's fanout; each stage's SLO is set when it "
        "starts, from what is left of the request's SLO, and its tasks' budget is that less "
        "its own x_p^u (TailGuard eq. 4).",
        "## Max load at the SLO\n\nMeans over seeds ± 95% CI (the max loads found span "
        f"{spread:.3f} in all).\n\n" + md_table(header, rows) + notes,
    ]


EXPERIMENTS = (
    Experiment(
        "multi-query",
        "multi-query requests: how to share one SLO between stages, max load per rule",
        24_000,
        ("masstree",),
        multi_query,
        searches_max_load=False,
    ),
)
"""TailGuard eq. (5)'s multi-query requests, with our rules for the stage budgets."""
