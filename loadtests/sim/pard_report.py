"""The files of a PARD pipeline experiment: CSV tables, PNG plots and markdown sections.

Takes the runs of `loadtests.sim.pard_experiments` (one RunDigest per trace and policy) and
decides only how to show them: goodput over time per policy, over the whole run and over the
periods that require dropping (PARD §5.1), drop and invalid rates, where requests were
dropped, and the ablations of Table 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtests.sim.output import md_table, write_csv
from loadtests.sim.traces import TRACE_SHAPES, Period

if TYPE_CHECKING:
    from loadtests.sim.pard_runs import RunDigest, Setup
    from loadtests.sim.pipeline_model import PipelineModel

__all__ = ["ABLATION_TITLES", "PardReport", "goodput_over"]

TITLES = {"none": "no dropping", "nexus": "Nexus", "clipper++": "Clipper++", "pard": "PARD"}
ABLATION_TITLES: dict[str, tuple[str, str]] = {
    "back": ("PARD-back", "considers preceding modules only"),
    "sf": ("PARD-sf", "ignores Q, W of subsequent modules"),
    "oc": ("PARD-oc", "overload control based on Q"),
    "split": ("PARD-split", "fixed per-module SLO split"),
    "wcl": ("PARD-WCL", "split latency budget dynamically"),
    "lower": ("PARD-lower", "assumes batch wait as 0"),
    "upper": ("PARD-upper", "assumes batch wait as sum d_i"),
    "fcfs": ("PARD-FCFS", "drops by arrival order"),
    "hbf-only": ("PARD-HBF", "High-Budget-First only"),
    "lbf-only": ("PARD-LBF", "Low-Budget-First only"),
    "instant-switch": ("(not in Table 1)", "HBF/LBF switched at mu = 1, no delayed transition"),
}
"""Each ablation's name in PARD Table 1 and its key characteristic there."""
_PER_MODULE = ("drops", "batches", "mean_batch", "compute_s", "invalid_s")
_NOT_IN_SUMMARY = (*_PER_MODULE, "timeline", "overload_periods")


def _title(policy: str) -> str:
    return TITLES.get(policy, policy)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def _rate(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}"


def _write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    write_csv(path, list(rows[0]) if rows else [], [list(r.values()) for r in rows])


def goodput_over(
    timeline: Sequence[tuple[float, float, float]], periods: Sequence[Period]
) -> float:
    """Mean on-time completions per second over the seconds inside `periods` (NaN: none).

    `timeline` holds (end of second, offered, on-time) per whole second, as RunDigest keeps it;
    the second ending at t counts when [t - 1, t) lies inside a period.
    """
    inside = [
        good
        for end, _, good in timeline
        if any(p.start_s <= end - 1.0 + 1e-9 and end <= p.end_s + 1e-9 for p in periods)
    ]
    return sum(inside) / len(inside) if inside else math.nan


def _periods_text(periods: Sequence[Period]) -> str:
    return ", ".join(f"{p.start_s:g}-{p.end_s:g}" for p in periods) or "none"


@dataclass(frozen=True)
class PardReport:
    """The runs of one pipeline experiment and what it compares."""

    setup: Setup
    model: PipelineModel
    traces: tuple[str, ...]
    policies: tuple[str, ...]
    """The main comparison (PARD and the §5.1 baselines)."""
    ablations: tuple[str, ...]
    runs: tuple[RunDigest, ...]

    @cached_property
    def by(self) -> dict[tuple[str, str], RunDigest]:
        """Runs by (trace, policy)."""
        return {(r.trace, r.policy): r for r in self.runs}

    def module_rows(self) -> list[dict[str, Any]]:
        """b_k, d_k, throughput, workers and load of each module."""
        st, rows = self.setup, []
        for m in self.model.modules:
            capacity = st.workers[m] * st.worker_rps[m]
            rows.append(
                {
                    "module_id": m,
                    "module": self.model.names[m],
                    "b_k": st.max_batch[m],
                    "d_k_ms": round(self.model.duration_s(m, st.max_batch[m]) * 1e3, 2),
                    "rps_per_worker": round(st.worker_rps[m], 1),
                    "workers": st.workers[m],
                    "capacity_rps": round(capacity, 1),
                    "load_at_mean_rate": round(st.rate_rps / capacity, 3),
                }
            )
        return rows

    # ---- files --------------------------------------------------------------------------

    def write_csvs(self, out: Path) -> None:
        """summary.csv, goodput_over_time.csv, drops_by_module.csv, modules.csv."""
        mods = self.model.modules
        summary = []
        for r in self.runs:
            row = {k: v for k, v in asdict(r).items() if k not in _NOT_IN_SUMMARY}
            summary.append(row | {f"drops_{m}": r.drops[m] for m in mods})
        _write_rows(out / "summary.csv", summary)
        timeline = [
            {"trace": r.trace, "policy": r.policy, "time_s": t, "offered_rps": o, "goodput_rps": g}
            for r in self.runs
            for t, o, g in r.timeline
        ]
        _write_rows(out / "goodput_over_time.csv", timeline)
        per_module = [
            {"trace": r.trace, "policy": r.policy, "module_id": m, "module": self.model.names[m]}
            | {k: getattr(r, k)[m] for k in _PER_MODULE}
            | {"share_of_drops": round(r.drop_share(m), 4)}
            for r in self.runs
            for m in mods
        ]
        _write_rows(out / "drops_by_module.csv", per_module)
        _write_rows(out / "modules.csv", self.module_rows())

    def write_plots(self, out: Path) -> None:
        """goodput_over_time, drop_and_invalid_rates, drops_by_module, ablations (PNG)."""
        from loadtests.sim import plots

        by, traces, pols, name = self.by, list(self.traces), self.policies, self.setup.pipeline
        panels = {}
        for t in traces:
            lines = {"offered": [(x, o) for x, o, _ in by[(t, "pard")].timeline]}
            for p in pols:
                lines[_title(p)] = [(x, g) for x, _, g in by[(t, p)].timeline]
            panels[f"{t} (CV {by[(t, 'pard')].trace_cv:.2f})"] = lines
        plots.line_panels(
            out / "goodput_over_time.png",
            panels,
            title=f"{name}: goodput over time (on-time requests per second)",
            xlabel="time (s)",
            ylabel="requests / s",
        )
        rates = {
            label: (traces, {_title(p): [getattr(by[(t, p)], key) for t in traces] for p in pols})
            for label, key in (("drop rate", "drop_rate"), ("invalid rate", "invalid_rate"))
        }
        plots.grouped_bars(
            out / "drop_and_invalid_rates.png",
            rates,
            title=f"{name}: drop rate and invalid rate",
            xlabel="trace",
            ylabel="share",
            ncols=2,
        )
        where = {}
        for t in traces:
            shares = {
                f"{m} {self.model.names[m]}": [by[(t, p)].drop_share(m) for p in pols]
                for m in self.model.modules
            }
            where[t] = ([_title(p) for p in pols], shares)
        plots.grouped_bars(
            out / "drops_by_module.png",
            where,
            title=f"{name}: where requests were dropped (share of each policy's drops)",
            xlabel="policy",
            ylabel="share of drops",
        )
        variants = ("pard", *self.ablations)
        goodput = {v: [by[(t, v)].goodput_rps for t in traces] for v in variants}
        plots.grouped_bars(
            out / "ablations.png",
            {"goodput": (traces, goodput)},
            title=f"{name}: PARD and its ablations (Table 1)",
            xlabel="trace",
            ylabel="goodput (req/s)",
            ncols=1,
        )

    # ---- markdown -----------------------------------------------------------------------

    def setup_section(self) -> str:
        """How b_k, workers, rate and SLO came out of the profile, and the traces' CVs."""
        st = self.setup
        cfg = st.config()
        fmt = {"d_k_ms": "{:.1f}", "rps_per_worker": "{:.0f}", "capacity_rps": "{:.0f}"}
        fmt["load_at_mean_rate"] = "{:.0%}"
        modules = [[fmt.get(k, "{}").format(v) for k, v in r.items()] for r in self.module_rows()]
        traces = []
        for t in self.traces:
            r = self.by[(t, "pard")]
            peak = max(o for _, o, _ in r.timeline) / st.capacity_rps
            traces.append([t, TRACE_SHAPES.get(t, "replayed"), f"{r.trace_cv:.2f}", r.arrived])
            traces[-1] += [f"{peak:.2f}", r.overload_s, _periods_text(r.overload_periods)]
        slo = f"{st.slo_s * 1e3:g} ms"
        if st.slo_s != st.spec_slo_s:
            slo += f" (the spec's {st.spec_slo_s * 1e3:g} ms is infeasible on this profile)"
        module_head = ["module", "name", "b_k", "d_k(b_k) ms", "req/s per worker", "workers"]
        trace_head = ["trace", "shape", "CV", "requests", "peak", "overloaded s", "periods (s)"]
        return (
            f"## Setup\n\nPipeline `{st.pipeline}` (`{st.spec_path.name}`), profile "
            f"`{st.profile_path.name}` measured on {st.device}. SLO {slo}. b_k by Nexus's "
            "rule (the largest feasible batch with 2 d_k(b) within the module's SLO share); "
            "workers ceil(T_med / T_k), so that every module reaches the median one-worker "
            f"throughput; mean rate {st.load:.0%} of the capacity {st.capacity_rps:.0f} req/s "
            f"= **{st.rate_rps:.0f} req/s**, {st.duration_s:.1f} s per trace. Batch durations "
            f"carry {cfg.duration_cv:.0%} log-normal noise (CV); state exchange every "
            f"{cfg.exchange_period_s:g} s; lambda = {cfg.wait_quantile:g}.\n\n"
            + md_table([*module_head, "capacity req/s", "load"], modules)
            + "\n\nTraces (`loadtests/sim/traces.py`; CV of the per-second request rate; peak: "
            "the busiest second over the capacity; overload periods: where the trace's offered "
            "rate exceeds the capacity, the periods that require dropping):\n\n"
            + md_table(trace_head, traces)
        )

    def sections(self) -> list[str]:
        """Setup, the main table (trace x policy) and the ablation table."""
        mods = self.model.modules
        rows = []
        for t in self.traces:
            for p in self.policies:
                r = self.by[(t, p)]
                title = f"**{_title(p)}**" if p == "pard" else _title(p)
                rows.append(
                    [t, title, f"{r.goodput_rps:.1f}", _rate(r.goodput_overload_rps)]
                    + [_pct(r.drop_rate), _pct(r.invalid_rate)]
                    + [f"{r.drop_share(m):.0%}" for m in mods]
                )
        ablations = []
        for t in self.traces:
            for v in ("pard", *self.ablations):
                r = self.by[(t, v)]
                paper = ABLATION_TITLES.get(v, ("PARD", ""))[0]
                goodput = [f"{r.goodput_rps:.1f}", _rate(r.goodput_overload_rps)]
                ablations.append([t, v, paper, *goodput, _pct(r.drop_rate), _pct(r.invalid_rate)])
        legend = [[v, *ABLATION_TITLES.get(v, (v, ""))] for v in self.ablations]
        ablation_head = ["trace", "variant", "Table 1", "goodput req/s", "in overload req/s"]
        head = ["trace", "policy", "goodput req/s", "in overload req/s", "drop rate"]
        return [
            self.setup_section(),
            "## Goodput, drop rate, invalid rate\n\nGoodput: on-time requests per second over "
            "the trace; in overload: over the overload periods of the setup's trace table. "
            "Drop rate counts late completions as drops (§5.1); invalid rate: compute spent on "
            "requests that were dropped or late. `drops at m`: the share of the policy's drops "
            "made at module m (names in the setup table).\n\n"
            + md_table([*head, "invalid rate", *(f"drops at {m}" for m in mods)], rows),
            "## Ablations (PARD Table 1)\n\n"
            + md_table(["variant", "Table 1", "key characteristic (Table 1)"], legend)
            + "\n\n"
            + md_table([*ablation_head, "drop rate", "invalid rate"], ablations),
        ]
