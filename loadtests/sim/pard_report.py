"""The files of a PARD pipeline experiment: CSV tables, PNG plots and markdown sections.

Takes the runs of `loadtests.sim.pard_experiments` (one RunDigest per trace and policy) and
decides only how to show them: goodput over time per policy, over the whole run and over the
periods that require dropping (PARD §5.1), drop and invalid rates, where requests were
dropped, and the ablations of Table 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadtests.sim.output import md_table, write_csv
from loadtests.sim.traces import TRACE_SHAPES, Period

if TYPE_CHECKING:
    from loadtests.sim.pard_runs import RunDigest, Setup
    from loadtests.sim.pipeline_model import PipelineModel

__all__ = [
    "ABLATION_TITLES",
    "TARGETS",
    "WINDOWS_S",
    "PardReport",
    "all_sections",
    "goodput_over",
    "target_row",
    "transient",
]

WINDOWS_S = (1, 2, 5, 10, 30, 60)
"""Window sizes of the transient drop rate and the least goodput (PARD Figures 2a, 2b, 9)."""
TARGETS = {"goodput": 1.16, "drop": 1.6, "invalid": 1.5}
"""PARD §1's range's low ends: goodput >= 1.16x the better of Nexus and Clipper++, drop rate
>= 1.6x and invalid rate >= 1.5x lower than theirs."""

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
_PER_SECOND = ("arrived_per_s", "lost_per_s", "capacity_per_s", "workers_per_s")
_NOT_IN_SUMMARY = (*_PER_MODULE, *_PER_SECOND, "timeline", "overload_periods")


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


def transient(run: RunDigest, window_s: int) -> tuple[float, float, float]:
    """(max drop rate, least normalised goodput, the drop rate in that least window) over the
    windows of `window_s` seconds that slide by one second (PARD Figures 2a, 2b and 9).

    The drop rate of a window is its arrivals' share dropped or late (by arrival second);
    normalised goodput is its on-time completions over its offered requests. Windows with no
    arrivals are skipped; NaN when none is left.
    """
    arrived = np.asarray(run.arrived_per_s, dtype=float)
    lost = np.asarray(run.lost_per_s, dtype=float)
    offered = np.array([o for _, o, _ in run.timeline])
    good = np.array([g for _, _, g in run.timeline])
    n = min(len(arrived), len(offered))
    if n < window_s:
        return math.nan, math.nan, math.nan

    def sums(x: np.ndarray) -> np.ndarray:
        c = np.concatenate(([0.0], np.cumsum(x[:n])))
        return c[window_s:] - c[:-window_s]

    a, lo, o, g = sums(arrived), sums(lost), sums(offered), sums(good)
    ok = (a > 0) & (o > 0)
    if not ok.any():
        return math.nan, math.nan, math.nan
    drop = np.where(ok, lo / np.maximum(a, 1.0), -1.0)
    norm = np.where(ok, g / np.maximum(o, 1.0), np.inf)
    least = int(np.argmin(norm))
    return float(drop.max()), float(norm[least]), float(drop[least])


def target_row(by: Mapping[tuple[str, str], RunDigest], trace: str) -> dict[str, Any]:
    """PARD against the better of Nexus and Clipper++ on one trace (`TARGETS`).

    Goodput over the overload periods when the trace has any (else over the whole run); the
    better baseline is the one of higher goodput, and for drop and invalid rates the lower.
    """
    pard, base = by[(trace, "pard")], [by[(trace, "nexus")], by[(trace, "clipper++")]]
    over = not math.isnan(pard.goodput_overload_rps)
    key = "goodput_overload_rps" if over else "goodput_rps"
    best = max(getattr(b, key) for b in base)
    best_drop = min(b.drop_rate for b in base)
    best_invalid = min(b.invalid_rate for b in base)

    def ratio(num: float, den: float) -> float:
        return num / den if den > 0 else (math.inf if num > 0 else math.nan)

    row = {
        "trace": trace,
        "goodput_over": "overload" if over else "whole run",
        "pard_goodput_rps": getattr(pard, key),
        "best_baseline_goodput_rps": best,
        "goodput_ratio": ratio(getattr(pard, key), best),
        "pard_drop_rate": pard.drop_rate,
        "best_baseline_drop_rate": best_drop,
        "drop_ratio": ratio(best_drop, pard.drop_rate),
        "pard_invalid_rate": pard.invalid_rate,
        "best_baseline_invalid_rate": best_invalid,
        "invalid_ratio": ratio(best_invalid, pard.invalid_rate),
        "excess_share": pard.excess_share,
    }
    row["meets"] = (
        None  # nothing to drop: the targets do not apply
        if not over and pard.dropped + pard.late == 0
        else (
            row["goodput_ratio"] >= TARGETS["goodput"]
            and row["drop_ratio"] >= TARGETS["drop"]
            and row["invalid_ratio"] >= TARGETS["invalid"]
        )
    )
    return row


def _x(x: float) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.2f}x"


def target_table(rows: Sequence[dict[str, Any]], lead: Sequence[str] = ()) -> str:
    """The markdown table of `target_row`s (with leading columns `lead` taken from each row)."""
    head = [*lead, "trace", "goodput: PARD / best", "ratio", "drop: PARD / best", "ratio"]
    head += ["invalid: PARD / best", "ratio", "excess", "all three targets"]
    body = []

    def ratio(r: dict[str, Any], k: str) -> str:
        if f"{k}_min" not in r or r[f"{k}_min"] == r[f"{k}_max"]:
            return _x(r[k])
        return f"{_x(r[k])} [{_x(r[f'{k}_min'])}-{_x(r[f'{k}_max'])}]"

    for r in rows:
        body.append(
            [str(r[k]) for k in lead]
            + [r["trace"], f"{r['pard_goodput_rps']:.1f} / {r['best_baseline_goodput_rps']:.1f}"]
            + [ratio(r, "goodput_ratio")]
            + [f"{_pct(r['pard_drop_rate'])} / {_pct(r['best_baseline_drop_rate'])}"]
            + [ratio(r, "drop_ratio")]
            + [f"{_pct(r['pard_invalid_rate'])} / {_pct(r['best_baseline_invalid_rate'])}"]
            + [ratio(r, "invalid_ratio"), _pct(r["excess_share"])]
            + ["n/a (no overload)" if r["meets"] is None else "yes" if r["meets"] else "**no**"]
        )
    return md_table(head, body)


def _spread(values: Sequence[float], fmt: Any) -> str:
    """mean [least-greatest] of one figure over seeds, each written by `fmt`."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(float(np.mean(vals)))} [{fmt(min(vals))}-{fmt(max(vals))}]"


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
    def seeds(self) -> tuple[int, ...]:
        """The seeds of the main comparison, in order (the ablations ran on the first)."""
        return tuple(sorted({r.seed for r in self.runs}))

    @cached_property
    def by(self) -> dict[tuple[str, str], RunDigest]:
        """Runs of the first seed by (trace, policy): the plots and the ablation table."""
        first = self.seeds[0]
        return {(r.trace, r.policy): r for r in self.runs if r.seed == first}

    @cached_property
    def by_seed(self) -> dict[int, dict[tuple[str, str], RunDigest]]:
        """Runs by seed, then (trace, policy)."""
        out: dict[int, dict[tuple[str, str], RunDigest]] = {s: {} for s in self.seeds}
        for r in self.runs:
            out[r.seed][(r.trace, r.policy)] = r
        return out

    def over_seeds(self, trace: str, policy: str, key: str) -> list[float]:
        """One figure of a (trace, policy) on each seed that ran it."""
        return [
            float(getattr(runs[(trace, policy)], key))
            for runs in self.by_seed.values()
            if (trace, policy) in runs
        ]

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
            {"trace": r.trace, "policy": r.policy, "seed": r.seed}
            | {"time_s": t, "offered_rps": o, "goodput_rps": g}
            for r in self.runs
            for t, o, g in r.timeline
        ]
        _write_rows(out / "goodput_over_time.csv", timeline)
        per_module = [
            {"trace": r.trace, "policy": r.policy, "seed": r.seed}
            | {"module_id": m, "module": self.model.names[m]}
            | {k: getattr(r, k)[m] for k in _PER_MODULE}
            | {"share_of_drops": round(r.drop_share(m), 4)}
            for r in self.runs
            for m in mods
        ]
        _write_rows(out / "drops_by_module.csv", per_module)
        _write_rows(out / "modules.csv", self.module_rows())
        _write_rows(out / "targets.csv", self.target_rows())
        _write_rows(out / "transient.csv", self.transient_rows())
        per_second = [
            {"trace": r.trace, "policy": r.policy, "seed": r.seed, "second": i}
            | {k: getattr(r, k)[i] for k in _PER_SECOND}
            for r in self.runs
            for i in range(len(r.arrived_per_s))
        ]
        _write_rows(out / "per_second.csv", per_second)
        priority = [
            {"trace": r.trace, "policy": r.policy, "seed": r.seed, "second": i, "module_id": m}
            | dict(zip(("hbf_share", "load_factor", "epsilon"), per[i], strict=True))
            for r in self.runs
            for m, per in r.priority_per_s.items()
            for i in range(len(per))
        ]
        if priority:
            _write_rows(out / "priority_per_second.csv", priority)
        if self.ablations:
            _write_rows(out / "ablation_ranking.csv", self.ablation_rows())

    # ---- derived tables -----------------------------------------------------------------

    def target_rows(self) -> list[dict[str, Any]]:
        """PARD against the better baseline on each trace and seed (`target_row`)."""
        return [
            target_row(runs, t) | {"pipeline": self.setup.pipeline, "seed": seed}
            for t in self.traces
            for seed, runs in self.by_seed.items()
        ]

    def target_summary(self) -> list[dict[str, Any]]:
        """`target_rows` over the seeds: each ratio's mean, least and greatest; meets on all."""
        out = []
        for t in self.traces:
            rows = [r for r in self.target_rows() if r["trace"] == t]
            agg: dict[str, Any] = {"pipeline": self.setup.pipeline, "trace": t}
            for k, v in rows[0].items():
                if isinstance(v, float):
                    vals = [r[k] for r in rows]
                    agg[k] = float(np.mean(vals))
                    agg[f"{k}_min"], agg[f"{k}_max"] = min(vals), max(vals)
            agg["goodput_over"] = rows[0]["goodput_over"]
            meets = [r["meets"] for r in rows if r["meets"] is not None]
            agg["meets"] = all(meets) if meets else None
            agg["seeds"] = len(rows)
            out.append(agg)
        return out

    def transient_rows(self) -> list[dict[str, Any]]:
        """Max transient drop rate and least normalised goodput per window size (`transient`)."""
        rows = []
        for t in self.traces:
            for p in self.policies:
                for w in WINDOWS_S:
                    worst, least, drop_there = transient(self.by[(t, p)], w)
                    rows.append(
                        {
                            "trace": t,
                            "policy": p,
                            "window_s": w,
                            "max_drop_rate": worst,
                            "min_norm_goodput": least,
                            "drop_rate_there": drop_there,
                        }
                    )
        return rows

    def priority_rows(self) -> list[dict[str, Any]]:
        """PARD's HBF/LBF state (§4.3) in and out of the overload periods, per trace and module
        (first seed): why an ablation that never switches can drop less on a spiky trace."""
        rows = []
        for t in self.traces:
            r = self.by[(t, "pard")]
            if not r.priority_per_s:
                continue
            seconds = len(r.arrived_per_s)
            over = np.zeros(seconds, dtype=bool)
            for period in r.overload_periods:
                over[int(period.start_s) : math.ceil(period.end_s)] = True
            lost = np.asarray(r.lost_per_s, dtype=float)
            first = next(iter(r.priority_per_s))
            lbf_first = np.array([x[0] < 0.5 for x in r.priority_per_s[first]], dtype=bool)
            for m, per in r.priority_per_s.items():
                hbf, mu, eps = (np.asarray([x[k] for x in per], dtype=float) for k in range(3))

                def mean(x: np.ndarray, where: np.ndarray) -> float:
                    x = x[where & np.isfinite(x)]
                    return float(x.mean()) if len(x) else math.nan

                rows.append(
                    {
                        "trace": t,
                        "module_id": m,
                        "overload_s": int(over.sum()),
                        "hbf_share_in_overload": mean(hbf, over),
                        "hbf_share_elsewhere": mean(hbf, ~over),
                        "mu_above_1_in_overload": mean((mu > 1.0).astype(float), over),
                        "mean_epsilon_in_overload": mean(eps, over),
                        "lost_in_overload": int(lost[over].sum()),
                        "lost_in_overload_first_module_lbf": int(lost[over & lbf_first].sum()),
                    }
                )
        return rows

    def ablation_rows(self) -> list[dict[str, Any]]:
        """Each ablation against PARD on each trace: does it drop more (PARD §5.3)?"""
        rows = []
        for t in self.traces:
            pard = self.by[(t, "pard")]
            for v in self.ablations:
                r = self.by[(t, v)]
                rows.append(
                    {
                        "trace": t,
                        "variant": v,
                        "drop_rate": r.drop_rate,
                        "pard_drop_rate": pard.drop_rate,
                        "drops_more_than_pard": r.drop_rate > pard.drop_rate,
                        "goodput_overload_rps": r.goodput_overload_rps,
                        "pard_goodput_overload_rps": pard.goodput_overload_rps,
                        "invalid_rate": r.invalid_rate,
                    }
                )
        return rows

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
        worst = {}
        for t in traces:
            worst[f"{t}: max transient drop rate"] = {
                _title(p): [(float(w), transient(by[(t, p)], w)[0]) for w in WINDOWS_S]
                for p in pols
            }
            worst[f"{t}: least normalised goodput"] = {
                _title(p): [(float(w), transient(by[(t, p)], w)[1]) for w in WINDOWS_S]
                for p in pols
            }
        plots.line_panels(
            out / "transient.png",
            worst,
            title=f"{name}: worst window against the window size (PARD Figures 2a, 2b, 9)",
            xlabel="window (s)",
            ylabel="share",
            ncols=2,
        )
        scaled = {}
        for t in traces:
            r = by[(t, "pard")]
            xs = [float(i) for i in range(len(r.workers_per_s))]
            scaled[t] = {
                "offered (req/s) / 10": [
                    (x, o / 10.0) for x, (_, o, _) in zip(xs, r.timeline, strict=True)
                ],
                "capacity (req/s) / 10": [
                    (x, c / 10.0) for x, c in zip(xs, r.capacity_per_s, strict=True)
                ],
                "workers (PARD run)": list(zip(xs, r.workers_per_s, strict=True)),
            }
        plots.line_panels(
            out / "workers_over_time.png",
            scaled,
            title=f"{name}: workers, capacity and offered rate over time",
            xlabel="time (s)",
            ylabel="workers; req/s / 10",
            ncols=1,
        )
        if self.ablations:
            variants = ("pard", *self.ablations)
            labels = [ABLATION_TITLES.get(v, ("PARD", ""))[0] for v in variants]
            labels = [
                v if lab.startswith("(") else lab for v, lab in zip(variants, labels, strict=True)
            ]
            drop = {
                lab: [by[(t, v)].drop_rate for t in traces]
                for lab, v in zip(labels, variants, strict=True)
            }
            plots.grouped_bars(
                out / "ablations.png",
                {"drop rate": (traces, drop)},
                title=f"{name}: PARD and its ablations (Table 1): drop rate",
                xlabel="trace",
                ylabel="drop rate",
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
            peak = max(
                (o / c for (_, o, _), c in zip(r.timeline, r.capacity_per_s, strict=True) if c > 0),
                default=math.nan,
            )
            traces.append([t, TRACE_SHAPES.get(t, "replayed"), f"{r.trace_cv:.2f}", r.arrived])
            traces[-1] += [f"{peak:.2f}", r.overload_s, _pct(r.excess_share)]
            traces[-1] += [_periods_text(r.overload_periods)]
        slo = f"{st.slo_s * 1e3:g} ms"
        if st.slo_s != st.spec_slo_s:
            slo += f" (the spec's {st.spec_slo_s * 1e3:g} ms is infeasible on this profile)"
        module_head = ["module", "name", "b_k", "d_k(b_k) ms", "req/s per worker", "workers"]
        trace_head = ["trace", "shape", "CV", "requests", "peak", "overloaded s", "excess"]
        trace_head.append("periods (s)")
        if st.scaling is None:
            workers = (
                "workers ceil(T_med / T_k), fixed for the run, so that every module reaches "
                "the median one-worker throughput"
            )
        else:
            sc = st.scaling
            cluster = "no cap" if sc.total_workers is None else f"{sc.total_workers} in all"
            workers = (
                "workers scaled at run time by the runtime's WorkerScaler (PARD §5.1): "
                f"ceil(rate / T_k x {sc.headroom:g}) over a {sc.rate_window_s:g} s window, "
                f"decided every {sc.period_s:g} s, a new worker serving {sc.cold_start_s:g} s "
                f"later, scale-in held {sc.hold_s:g} s, at most {sc.max_workers} a module and "
                f"{cluster}; the table's workers are the start (what the mean rate needs)"
            )
        return (
            f"## Setup\n\nPipeline `{st.pipeline}` (`{st.spec_path.name}`), profile "
            f"`{st.profile_path.name}` measured on {st.device}. SLO {slo}. b_k by Nexus's "
            f"rule (the largest feasible batch with 2 d_k(b) within the module's SLO share); "
            f"{workers}; mean rate {st.load:.0%} of what ceil(T_med / T_k) workers serve "
            f"= **{st.rate_rps:.0f} req/s**, {st.duration_s:.1f} s per trace. Batch durations "
            f"carry {cfg.duration_cv:.0%} log-normal noise (CV); state exchange every "
            f"{cfg.exchange_period_s:g} s; lambda = {cfg.wait_quantile:g}.\n\n"
            + md_table([*module_head, "capacity req/s", "load"], modules)
            + "\n\nTraces (`loadtests/sim/traces.py`; CV of the per-second request rate; peak: "
            "the highest offered rate over the capacity of its second; overload periods: where "
            "the trace's offered rate exceeds the capacity, the periods that require dropping; "
            "excess: the offered requests above the capacity over all offered, which no "
            "policy serves on time):\n\n" + md_table(trace_head, traces)
        )

    def sections(self) -> list[str]:
        """Setup, the main table (trace x policy) and the ablation table."""
        mods = self.model.modules
        rows = []
        for t in self.traces:
            for p in self.policies:
                r = self.by[(t, p)]
                title = f"**{_title(p)}**" if p == "pard" else _title(p)

                def spread(key: str, fmt: Any, t: str = t, p: str = p) -> str:
                    return _spread(self.over_seeds(t, p, key), fmt)

                rows.append(
                    [t, title, spread("goodput_rps", _rate)]
                    + [spread("goodput_overload_rps", _rate)]
                    + [spread("drop_rate", _pct), spread("invalid_rate", _pct)]
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
        out = [
            self.setup_section(),
            "## Goodput, drop rate, invalid rate\n\nGoodput: on-time requests per second over "
            "the trace; in overload: over the overload periods of the setup's trace table. "
            f"Each figure is the mean over {len(self.seeds)} seed(s) (trace and service "
            "times), with the least and greatest in brackets; `drops at m` is of the first "
            "seed. "
            "Drop rate counts late completions as drops (§5.1); invalid rate: compute spent on "
            "requests that were dropped or late. `drops at m`: the share of the policy's drops "
            "made at module m (names in the setup table).\n\n"
            + md_table([*head, "invalid rate", *(f"drops at {m}" for m in mods)], rows),
            self.targets_section(),
            self.transient_section(),
        ]
        if self.ablations:
            more = [r for r in self.ablation_rows() if r["drops_more_than_pard"]]
            out.append(
                "## Ablations (PARD Table 1)\n\n"
                + md_table(["variant", "Table 1", "key characteristic (Table 1)"], legend)
                + "\n\n"
                + md_table([*ablation_head, "drop rate", "invalid rate"], ablations)
                + f"\n\nAn ablation drops more than PARD in {len(more)} of "
                f"{len(self.ablations) * len(self.traces)} (trace, ablation) pairs (PARD §5.3: "
                "each should); the others: "
                + (
                    ", ".join(
                        f"{r['variant']} on {r['trace']} ({_pct(r['drop_rate'])} vs "
                        f"{_pct(r['pard_drop_rate'])})"
                        for r in self.ablation_rows()
                        if not r["drops_more_than_pard"]
                    )
                    or "none"
                )
                + "."
            )
        prio = [r for r in self.priority_rows() if r["overload_s"]]
        if prio:
            out.append(
                "## PARD's adaptive priority in the overload periods (§4.3)\n\n"
                "Per module, first seed: the share of its serving workers popping HBF (sampled "
                "each second), in the overload seconds and elsewhere; the share of overload "
                "seconds whose mu (the latest closed 1-s bucket's T_in over T_m) was above 1; "
                "the mean eps there (HBF needs mu > 1 + eps); and the requests lost (dropped "
                "or late) in overload seconds, in all and while the first module was mostly "
                "LBF.\n\n"
                + md_table(
                    [
                        *("trace", "module", "overload s", "HBF in overload", "HBF elsewhere"),
                        *("mu > 1 in overload", "eps in overload", "lost in overload"),
                        "of them, first module LBF",
                    ],
                    [
                        [
                            *(r["trace"], r["module_id"], r["overload_s"]),
                            _pct(r["hbf_share_in_overload"]),
                            _pct(r["hbf_share_elsewhere"]),
                            _pct(r["mu_above_1_in_overload"]),
                            f"{r['mean_epsilon_in_overload']:.2f}",
                            r["lost_in_overload"],
                            r["lost_in_overload_first_module_lbf"],
                        ]
                        for r in prio
                    ],
                )
            )
        return out

    def targets_section(self) -> str:
        """PARD against the better of Nexus and Clipper++ per trace (`TARGETS`)."""
        return (
            "## Against the paper's targets\n\nPARD's goodput over the overload periods "
            f"(>= {TARGETS['goodput']:g}x the better of Nexus and Clipper++), drop rate "
            f"(>= {TARGETS['drop']:g}x lower) and invalid rate (>= {TARGETS['invalid']:g}x "
            "lower); excess: the trace's share above the capacity, which no policy serves. "
            f"Mean over {len(self.seeds)} seed(s), least and greatest in brackets; 'all three "
            "targets' must hold on every seed.\n\n" + target_table(self.target_summary())
        )

    def transient_section(self) -> str:
        """The worst windows against the window size (PARD Figures 2a, 2b and 9)."""
        rows = []
        for t in self.traces:
            for p in self.policies:
                cells = []
                for w in WINDOWS_S:
                    worst, least, _ = transient(self.by[(t, p)], w)
                    cells.append(f"{_pct(worst)} / {_pct(least)}")
                rows.append([t, _title(p), *cells])
        return (
            "## Transient drop rate against the window size\n\nFor each window size, the "
            "highest drop rate of any window of the run (its arrivals dropped or late) / the "
            "least normalised goodput of any window (on-time completions over offered "
            "requests), windows sliding by 1 s (PARD Figures 2a, 2b and 9).\n\n"
            + md_table(["trace", "policy", *(f"{w} s" for w in WINDOWS_S)], rows)
        )


def all_sections(reports: Sequence[PardReport], out: Path) -> list[str]:
    """The tables over every pipeline's workloads (PARD §5.2: twelve), with their CSVs in
    `out`: the targets, average drop and invalid rates (Figure 8), the worst windows
    (Figures 2 and 9) and the ablation ranking (§5.3)."""
    targets = [row for rep in reports for row in rep.target_summary()]
    _write_rows(out / "targets.csv", targets)
    met = sum(bool(r["meets"]) for r in targets)
    judged = sum(r["meets"] is not None for r in targets)
    rates, transients, ranking = [], [], []
    for rep in reports:
        for t in rep.traces:
            for p in rep.policies:
                cells = [
                    _spread(rep.over_seeds(t, p, k), _pct) for k in ("drop_rate", "invalid_rate")
                ]
                rates.append([rep.setup.pipeline, t, _title(p), *cells])
                worst = [transient(rep.by[(t, p)], w)[0] for w in WINDOWS_S]
                transients.append(
                    {"pipeline": rep.setup.pipeline, "trace": t, "policy": p}
                    | {f"max_drop_{w}s": x for w, x in zip(WINDOWS_S, worst, strict=True)}
                )
        ranking += [r | {"pipeline": rep.setup.pipeline} for r in rep.ablation_rows()]
    _write_rows(out / "transient.csv", transients)
    _write_rows(out / "ablation_ranking.csv", ranking)
    policies = reports[0].policies if reports else ()
    fig9 = []
    for p in policies:
        cells = []
        for w in WINDOWS_S:
            vals = [
                x
                for r in transients
                if r["policy"] == p and not math.isnan(x := r[f"max_drop_{w}s"])
            ]
            cells.append(f"{np.mean(vals):.1%} / {max(vals):.1%}" if vals else "n/a")
        fig9.append([_title(p), *cells])
    ablations = reports[0].ablations if reports else ()
    rank = []
    for v in ablations:
        rows = [r for r in ranking if r["variant"] == v]
        more = sum(r["drops_more_than_pard"] for r in rows)
        mean = float(np.mean([r["drop_rate"] for r in rows])) if rows else math.nan
        rank.append([v, ABLATION_TITLES.get(v, (v, ""))[0], f"{more} of {len(rows)}", _pct(mean)])
    pard_mean = float(
        np.mean([rep.by[(t, "pard")].drop_rate for rep in reports for t in rep.traces])
    )
    rank.sort(key=lambda row: -float(row[3].rstrip("%")) if row[3] != "n/a" else 0.0)
    n = len(targets)
    return [
        f"## Against the paper's targets, {n} workloads\n\n"
        f"PARD meets all three targets on every seed in **{met} of the {judged}** workloads "
        f"with something to drop ({n - judged} have none). Goodput "
        "over each workload's overload periods; 'best' is the better of Nexus and Clipper++ "
        "(the higher goodput; the lower drop and invalid rate); mean over the seeds with the "
        "least and greatest in brackets; excess: the trace's share above the capacity, which "
        "no policy serves on time. Each pipeline's own report is in its folder.\n\n"
        + target_table(targets, lead=("pipeline",)),
        "## Average drop rate and invalid rate (PARD Figure 8)\n\n"
        + md_table(["pipeline", "trace", "policy", "drop rate", "invalid rate"], rates),
        "## Worst windows (PARD Figures 2 and 9)\n\nThe highest transient drop rate of any "
        "window against the window size: mean over the workloads / the worst workload (first "
        "seed).\n\n" + md_table(["policy", *(f"{w} s" for w in WINDOWS_S)], fig9),
        "## Ablations (PARD §5.3)\n\nHow many workloads each ablation drops more requests "
        f"on than PARD (first seed), and its mean drop rate over them; PARD's: {pard_mean:.1%}."
        "\n\n" + md_table(["variant", "Table 1", "drops more than PARD", "mean drop rate"], rank),
    ]
