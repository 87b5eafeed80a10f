"""PARD experiments on the shipped pipelines: ``pard-traffic``, ``-live``, ``-ga``, ``-dag``.

Each runs one pipeline (``onnx_models/pipelines/NAME.json`` with its offline profile
``NAME.profile.json``) through the periodic, bursty and spiky traces (`loadtests.sim.traces`)
under PARD and the baselines of PARD §5.1 (no dropping, Nexus, Clipper++), then under PARD's
ablations (Table 1), and reports goodput over time, drop rate, invalid rate and where requests
were dropped. Setup, from the profile (printed in the report):

- b_k: Nexus's rule (`nexus_batch_sizes`): the largest feasible size with 2 d_k(b) within the
  module's share of the SLO.
- Rate: T_k = b_k / d_k(b_k) is one worker's throughput; with ceil(T_med / T_k) workers per
  module (T_med the median T_k) the pipeline serves C = min_k W_k T_k, and the trace's mean
  rate is `LOAD` (90%) of C. The rate only sets the scale: what matters is how the workers
  follow it.
- Workers (PARD §5.1: "adjusts the number of workers per module based on request rate and
  per-worker throughput at runtime"), the default: a WorkerScaler (taskserver.pard.scaling,
  the live runtime's) starts each module with the workers the mean rate needs
  (ceil(r / T_k x headroom)) and follows each module's rate, a new worker serving after its
  cold start; the cluster holds `CLUSTER` (2x) the workers the mean rate needs over all
  modules (`total_workers`; the paper's cluster is fixed too, 64 GPUs). Dropping is then
  needed where scaling lags a rise (cold start, rate window) or the trace goes above the
  cluster. With ``scaling=False`` (``--fixed-workers``) the ceil(T_med / T_k) workers stay
  fixed and the bursts run into sustained overload.
- Trace length: `TRACE_S` (300 s) of trace time unless a request count is given. The paper's
  traces run for many minutes (its lv-tweet burst is at t = 850 s), and the time scale
  matters: a trace compressed into a minute turns every rise into a step that no cold start
  follows.
- Capacity over time and the periods that require dropping (PARD §5.1 reports goodput over
  them): a WorkerScaler fed the trace's arrivals at every module (every request offered to
  every module, as without drops) gives the workers each second, and so the capacity
  min_k n_k(t) T_k; the periods are the runs of seconds whose offered rate is above it. The
  same periods hold for every policy of a trace. The offered requests above that capacity,
  over all offered, is the trace's excess: no policy serves those on time.
- SLO: the spec's, unless the profile makes it infeasible (below 2 sum 2 d_k(b_1) on the
  longest path: twice a lone request's worst case), in which case it is raised to that.

Every policy of one trace sees the same arrivals (same seeds).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.sim.experiments import Experiment, Settings, _tick
from loadtests.sim.pard_report import PardReport, all_sections, goodput_over, target_row
from loadtests.sim.pard_runs import RunDigest, Setup
from loadtests.sim.pipeline import simulate_pipeline
from loadtests.sim.pipeline_model import PipelineModel, nexus_batch_sizes
from loadtests.sim.progress import format_duration
from loadtests.sim.traces import MIN_DURATION_S, Trace, make_trace, overload_periods
from taskserver.pard import ScalingConfig, WorkerScaler

POLICIES = ("none", "nexus", "clipper++", "pard")
ABLATIONS = (
    "back",
    "sf",
    "oc",
    "split",
    "wcl",
    "lower",
    "upper",
    "fcfs",
    "hbf-only",
    "lbf-only",
    "instant-switch",
)
"""PARD Table 1's ten ablations in its order (names: `pard_report.ABLATION_TITLES`), then
instant-switch, which Table 1 does not list (§4.3's delayed transition turned off)."""
LOAD = 0.9
"""Mean rate as a share of the fixed provisioning's capacity."""
TRACE_SEED = 1
PIPELINE_NAMES = ("traffic", "live", "ga", "dag")
"""PARD's four pipelines, as shipped: tm, lv, ga and da (``pard-dag_dynamic`` runs da with
request-specific paths beside them)."""
TRACE_S = 300.0
"""Seconds of trace per run when no request count is given."""
CLUSTER = 2.0
"""With scaling, the cluster holds this many times the workers the mean rate needs."""


def load_model(spec_path: Path, profile_path: Path) -> PipelineModel:
    """The pipeline model from its spec and profile; a missing profile says how to make one."""
    from onnx_models.errors import OnnxModelsError
    from onnx_models.profile import load_profile
    from onnx_models.spec import load_pipeline

    if not spec_path.is_file():
        raise ValueError(f"pipeline spec not found: {spec_path} (--data-dir)")
    spec = load_pipeline(spec_path)
    if not profile_path.is_file():
        raise ValueError(
            f"no profile of pipeline {spec.name!r} at {profile_path}: measure one with "
            f"`python -m onnx_models profile {spec_path}` (it writes that file)"
        )
    try:
        profile = load_profile(profile_path)
    except OnnxModelsError as exc:
        raise ValueError(f"profile {profile_path}: {exc}") from exc
    ids = {(m.id, m.name) for m in spec.modules}
    if profile.pipeline != spec.name or {(str(m.id), m.name) for m in profile.modules} != ids:
        raise ValueError(f"profile {profile_path} is not of pipeline {spec.name!r}: profile again")
    return PipelineModel.from_spec(spec, profile)


def plan_setup(
    spec_path: Path,
    profile_path: Path,
    requests: int | None = None,
    *,
    scaling: ScalingConfig | bool | None = None,
    slo_scale: float = 1.0,
    rate_rps: float | None = None,
) -> Setup:
    """Batch sizes, workers, rate and SLO of one pipeline by the rules of the module docstring.

    `requests` per trace set its length (None: `TRACE_S` seconds). `scaling`: True for the
    run-time worker scaling of the module docstring, a ScalingConfig for other settings of it,
    None or False for fixed workers. `slo_scale` multiplies the spec's SLO (the sensitivity
    runs: tighter and looser), before b_k is chosen for it; `rate_rps` replaces the mean rate
    (so that the sensitivity runs offer the same trace whatever the SLO).
    """
    model = load_model(spec_path, profile_path)
    if not (math.isfinite(slo_scale) and slo_scale > 0):
        raise ValueError(f"slo_scale: must be a finite number > 0, got {slo_scale!r}")
    floor_s = 2.0 * max(
        sum(2.0 * model.duration_s(m, model.batch_sizes[m][0]) for m in path)
        for path in model.graph.paths
    )
    spec_slo_s = model.slo_s * slo_scale
    slo_s = model.slo_s = max(spec_slo_s, floor_s)
    max_batch = nexus_batch_sizes(model)
    worker_rps = {m: max_batch[m] / model.duration_s(m, max_batch[m]) for m in model.modules}
    median = statistics.median(worker_rps.values())
    workers = {m: max(1, math.ceil(median / t - 1e-9)) for m, t in worker_rps.items()}
    capacity = min(workers[m] * worker_rps[m] for m in model.modules)
    rate = LOAD * capacity if rate_rps is None else rate_rps
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate_rps: must be a finite number > 0, got {rate_rps!r}")
    if scaling is True:
        headroom = ScalingConfig().headroom
        workers = {m: max(1, math.ceil(rate / t * headroom - 1e-9)) for m, t in worker_rps.items()}
        cluster = math.ceil(CLUSTER * sum(workers.values()))
        scaling = ScalingConfig(max_workers=cluster, total_workers=cluster)
        capacity = min(workers[m] * worker_rps[m] for m in model.modules)
    elif isinstance(scaling, ScalingConfig):
        workers = {
            m: min(max(n, scaling.min_workers), scaling.max_workers) for m, n in workers.items()
        }
    else:
        scaling = None
    if requests is None:
        duration_s = TRACE_S
    elif isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ValueError(f"requests: must be an int >= 1, got {requests!r}")
    else:
        duration_s = max(MIN_DURATION_S, requests / rate)
    env = getattr(model.profile, "environment", None)
    where = [getattr(env, "provider", ""), getattr(model.profile, "created_utc", "")]
    device = getattr(env, "device", "an unknown device")
    return Setup(
        pipeline=model.name,
        model=model,
        spec_path=spec_path,
        profile_path=profile_path,
        device=f"{device} ({', '.join(w for w in where if w)})" if any(where) else device,
        slo_s=slo_s,
        spec_slo_s=spec_slo_s,
        max_batch=max_batch,
        workers=workers,
        worker_rps=worker_rps,
        capacity_rps=capacity,
        load=LOAD,
        rate_rps=rate,
        duration_s=duration_s,
        scaling=scaling,
    )


def capacity_per_second(setup: Setup, trace: Trace) -> np.ndarray:
    """Requests per second the pipeline can serve in each second of `trace` (module docstring).

    Fixed workers: `Setup.capacity_rps` throughout. With scaling: a WorkerScaler with the run's
    settings, deciding every ``period_s`` from the trace's arrivals offered to every module
    (none dropped), and min_k n_k T_k of its serving workers, averaged over the decisions
    in each second.
    """
    seconds = len(trace.rate_curve)
    if setup.scaling is None:
        return np.full(seconds, setup.capacity_rps)
    cfg, modules = setup.scaling, setup.model.modules
    scaler = WorkerScaler(cfg, modules, initial=setup.workers)
    arrivals = np.sort(trace.arrivals_s)
    sums, counts = np.zeros(seconds), np.zeros(seconds)
    t, done = cfg.period_s, 0
    while t < seconds:
        upto = int(np.searchsorted(arrivals, t, side="right"))
        for m in modules:
            scaler.record_arrivals(m, upto - done, t)
        done = upto
        decision = scaler.decide(t, setup.worker_rps)
        second = min(int(t), seconds - 1)
        sums[second] += min(p.ready * setup.worker_rps[p.module_id] for p in decision.modules)
        counts[second] += 1
        t += cfg.period_s
    first = min(setup.workers[m] * setup.worker_rps[m] for m in modules)
    out = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    out[0] = first if np.isnan(out[0]) else out[0]
    for i in range(1, seconds):  # a second without a decision keeps the last capacity
        if np.isnan(out[i]):
            out[i] = out[i - 1]
    return out


# --- One run (module level: it runs in a worker process) ---------------------------------


def _run(job: int, setup: Setup, trace_name: str, policy: str, seed: int = TRACE_SEED) -> RunDigest:
    """Simulate one (trace, policy, seed): the seed draws the trace and the service times."""
    from loadtests.sim.pipeline import DROPPED, LATE

    model = setup.model
    trace = make_trace(trace_name, setup.duration_s, setup.rate_rps, seed=seed)
    run = simulate_pipeline(model, trace.arrivals_s, policy, setup.config(seed))
    _tick(job)
    offered = trace.counts()
    seconds = len(offered)
    good = np.zeros(seconds)
    for p in run.timeline:  # goodput window 1 s: on-time completions in (t - 1, t]
        if 1 <= round(p.time_s) <= seconds:
            good[round(p.time_s) - 1] = p.goodput_rps
    capacity = capacity_per_second(setup, trace)
    periods = overload_periods(trace, capacity)  # the periods that require dropping
    curve = np.asarray(trace.rate_curve, dtype=float)
    excess = float(np.maximum(curve - capacity, 0.0).sum() / curve.sum()) if curve.sum() else 0.0
    second = np.minimum(run.arrivals_s.astype(int), seconds - 1)
    lost = (run.outcome == DROPPED) | (run.outcome == LATE)
    arrived_per_s = np.bincount(second, minlength=seconds)[:seconds]
    lost_per_s = np.bincount(second[lost], minlength=seconds)[:seconds]
    workers = np.full(seconds, float(sum(setup.workers.values())))
    if run.scaling:
        sums, counts = np.zeros(seconds), np.zeros(seconds)
        for d in run.scaling:
            if d.now < seconds:
                sums[int(d.now)] += sum(m.ready for m in d.modules)
                counts[int(d.now)] += 1
        for i in range(seconds):
            workers[i] = sums[i] / counts[i] if counts[i] else workers[i - 1] if i else workers[i]
    timeline = [(t + 1.0, float(offered[t]), float(good[t])) for t in range(seconds)]
    priority: dict[str, list[tuple[float, float, float]]] = {}
    for ps in run.priority:  # one sample per module at the end of each second
        i = round(ps.time_s) - 1
        if 0 <= i < seconds:
            per = priority.setdefault(ps.module_id, [(math.nan, math.nan, math.nan)] * seconds)
            per[i] = (round(ps.hbf_share, 4), round(ps.load_factor, 4), round(ps.epsilon, 4))
    sizes: dict[str, list[int]] = {m: [] for m in model.modules}
    for b in run.batches:
        sizes[b.module_id].append(b.size)
    s, mods = run.summary, run.modules
    return RunDigest(
        trace=trace_name,
        policy=policy,
        seed=seed,
        arrived=s.arrived,
        on_time=s.on_time,
        late=s.late,
        dropped=s.dropped,
        goodput_rps=s.on_time / trace.duration_s,
        goodput_overload_rps=goodput_over(timeline, periods),
        overload_s=round(sum(p.duration_s for p in periods)),
        drop_rate=s.drop_rate,
        invalid_rate=s.invalid_rate,
        trace_cv=trace.cv(),
        wall_s=run.wall_s,
        drops=run.drops_by_module(),
        batches={m: x.batches for m, x in mods.items()},
        mean_batch={m: float(np.mean(v)) if v else 0.0 for m, v in sizes.items()},
        compute_s={m: x.compute_s for m, x in mods.items()},
        invalid_s={m: x.invalid_s for m, x in mods.items()},
        timeline=timeline,
        overload_periods=periods,
        arrived_per_s=arrived_per_s.tolist(),
        lost_per_s=lost_per_s.tolist(),
        capacity_per_s=[
            round(float(capacity[min(i, len(capacity) - 1)]), 3) for i in range(seconds)
        ],
        workers_per_s=[round(float(w), 3) for w in workers],
        excess_share=excess,
        pipeline=setup.pipeline,
        priority_per_s=priority,
    )


# --- The experiment body -----------------------------------------------------------------


def _seeds(st: Any) -> tuple[int, ...]:
    return tuple(st.seeds)


def _jobs(pool: Any, setup: Setup, traces: Any, seeds: tuple[int, ...], ablations: bool) -> None:
    """Every trace under every policy on every seed, and the ablations on the first seed."""
    for trace in traces:
        for seed in seeds:
            for policy in POLICIES:
                pool.add(_run, (setup, trace, policy, seed), 1)
        for policy in ABLATIONS if ablations else ():
            pool.add(_run, (setup, trace, policy, seeds[0]), 1)


def pipeline_experiment(st: Any, setup: Setup) -> list[str]:
    """Every trace under every policy and ablation: CSV, PNG and the markdown sections."""
    pool = st.pool(setup.pipeline)
    _jobs(pool, setup, st.apps, _seeds(st), True)
    report = PardReport(setup, setup.model, tuple(st.apps), POLICIES, ABLATIONS, tuple(pool.run()))
    report.write_csvs(st.out_dir)
    report.write_plots(st.out_dir)
    return report.sections()


def all_pipelines_experiment(st: Any, setups: list[Setup]) -> list[str]:
    """The twelve workloads (four pipelines x three traces): each pipeline's report in its own
    folder, and the tables over all twelve (PARD §5.2's Figures 8 and 9 and its targets)."""
    pool = st.pool("pard-all")
    for setup in setups:
        _jobs(pool, setup, st.apps, _seeds(st), True)
    runs = tuple(pool.run())
    reports = []
    for setup in setups:
        mine = tuple(r for r in runs if r.pipeline == setup.pipeline)
        report = PardReport(setup, setup.model, tuple(st.apps), POLICIES, ABLATIONS, mine)
        folder = st.out_dir / setup.pipeline
        folder.mkdir(parents=True, exist_ok=True)
        report.write_csvs(folder)
        report.write_plots(folder)
        (folder / f"{setup.pipeline}.md").write_text(
            "\n\n".join(report.sections()) + "\n", encoding="utf-8"
        )
        reports.append(report)
    return all_sections(reports, st.out_dir)


SLO_SCALES = (0.8, 1.0, 1.2)
"""Tighter and looser SLOs of the sensitivity runs (PARD §5.4), as multiples of the spec's."""
LAMBDAS = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)
"""The quantile lambda of w_k (PARD §4.2; 0.1 its default, Figure 14c)."""
QUEUE_WINDOWS_S = (1.0, 2.0, 5.0, 10.0, 20.0)
"""The q_i window (PARD footnote 4; 5 s its default)."""


def sensitivity_experiment(st: Any, setups: list[Setup]) -> list[str]:
    """PARD §5.4 on each pipeline and trace: tighter and looser SLOs (every policy, the same
    trace and rate), and PARD alone under other lambdas and queueing windows."""
    from dataclasses import replace

    from loadtests.sim.output import md_table, write_csv

    seeds, pool = _seeds(st), st.pool("pard-sensitivity")
    keys: list[tuple[str, str, float, str]] = []
    for base in setups:
        for scale in SLO_SCALES:
            setup = plan_setup(
                base.spec_path,
                base.profile_path,
                None if st.queries == 0 else st.queries,
                scaling=base.scaling is not None,
                slo_scale=scale,
                rate_rps=base.rate_rps,
            )
            for trace in st.apps:
                for seed in seeds:
                    for policy in POLICIES:
                        pool.add(_run, (setup, trace, policy, seed), 1)
                        keys.append((base.pipeline, "slo", scale, policy))
        for lam in LAMBDAS:
            for trace in st.apps:
                for seed in seeds:
                    pool.add(_run, (replace(base, wait_quantile=lam), trace, "pard", seed), 1)
                    keys.append((base.pipeline, "lambda", lam, "pard"))
        for window in QUEUE_WINDOWS_S:
            for trace in st.apps:
                for seed in seeds:
                    pool.add(_run, (replace(base, queue_window_s=window), trace, "pard", seed), 1)
                    keys.append((base.pipeline, "window", window, "pard"))
    runs = list(pool.run())
    rows = [
        {"pipeline": k[0], "knob": k[1], "value": k[2]}
        | {"trace": r.trace, "policy": r.policy, "seed": r.seed, "arrived": r.arrived}
        | {"goodput_rps": r.goodput_rps, "goodput_overload_rps": r.goodput_overload_rps}
        | {"drop_rate": r.drop_rate, "invalid_rate": r.invalid_rate}
        for k, r in zip(keys, runs, strict=True)
    ]
    write_csv(st.out_dir / "sensitivity.csv", list(rows[0]), [list(r.values()) for r in rows])

    def cell(pipeline: str, knob: str, value: float, trace: str, policy: str, key: str) -> str:
        vals = [
            r[key]
            for r in rows
            if (r["pipeline"], r["knob"], r["value"], r["trace"], r["policy"])
            == (pipeline, knob, value, trace, policy)
        ]
        fmt = "{:.1%}" if "rate" in key and "rps" not in key else "{:.1f}"
        vals = [v for v in vals if not math.isnan(v)]
        if not vals:
            return "n/a"
        mean = float(np.mean(vals))
        return f"{fmt.format(mean)} [{fmt.format(min(vals))}-{fmt.format(max(vals))}]"

    slo_rows, knob_rows = [], []
    for base in setups:
        for trace in st.apps:
            for scale in SLO_SCALES:
                by = {
                    (trace, r.policy): r
                    for k, r in zip(keys, runs, strict=True)
                    if k[:3] == (base.pipeline, "slo", scale)
                    and r.trace == trace
                    and r.seed == seeds[0]
                }
                for policy in POLICIES:
                    slo = f"{scale:g}x ({base.spec_slo_s * scale * 1e3:g} ms)"
                    good = cell(base.pipeline, "slo", scale, trace, policy, "goodput_overload_rps")
                    drop = cell(base.pipeline, "slo", scale, trace, policy, "drop_rate")
                    slo_rows.append([base.pipeline, trace, slo, policy, good, drop])
                ratio = target_row(by, trace)["goodput_ratio"]
                slo_rows[-1].append(f"{ratio:.2f}x")
            for knob, values in (("lambda", LAMBDAS), ("window", QUEUE_WINDOWS_S)):
                for v in values:
                    figures = [
                        cell(base.pipeline, knob, v, trace, "pard", key)
                        for key in ("goodput_overload_rps", "drop_rate", "invalid_rate")
                    ]
                    knob_rows.append([base.pipeline, trace, knob, f"{v:g}", *figures])
    for row in slo_rows:
        row += [""] * (7 - len(row))
    return [
        "## Setup\n\n"
        + "\n".join(
            f"- `{b.pipeline}`: spec SLO {b.spec_slo_s * 1e3:g} ms, mean rate {b.rate_rps:.0f} "
            f"req/s, {b.duration_s:g} s per trace, workers "
            + ("scaled at run time" if b.scaling else "fixed")
            for b in setups
        )
        + f"\n\nEvery figure: mean over {len(seeds)} seed(s), least and greatest in brackets.",
        "## SLO (PARD §5.4: tighter and looser)\n\nThe same trace and rate under each SLO; "
        "b_k chosen for it by Nexus's rule. The last column: PARD's goodput over the overload "
        "periods against the better of Nexus and Clipper++ (first seed).\n\n"
        + md_table(
            [
                "pipeline",
                "trace",
                "SLO",
                "policy",
                "goodput in overload",
                "drop rate",
                "PARD / best",
            ],
            slo_rows,
        ),
        "## lambda and the queueing window (PARD alone)\n\nlambda: the quantile of w_k "
        "(§4.2, default 0.1); window: the q_i window (footnote 4, default 5 s).\n\n"
        + md_table(
            ["pipeline", "trace", "knob", "value", "goodput in overload", "drop rate", "invalid"],
            knob_rows,
        ),
    ]


def run_pipeline_experiment(
    exp: Any,
    out: str | Path,
    data_dir: str | Path | None = None,
    queries: int | None = None,
    traces: Any = None,
    *,
    workers: int = 2,
    quiet: bool = False,
    scaling: bool = True,
    seeds: int = 1,
) -> Path:
    """Run a pipeline experiment into OUT/NAME/ and print its tables; the markdown file's path.

    `data_dir` holds the spec and profile (default: the shipped ``onnx_models/pipelines``);
    `queries` is the number of requests per trace (None: the experiment's default, `TRACE_S`
    seconds of trace when that is 0); `traces` a subset of the experiment's; `scaling` False
    keeps the workers fixed (module docstring); `seeds` the number of seeds (trace and
    service times) of every main run.
    """
    from onnx_models.spec import PIPELINES_DIR

    chosen = tuple(t.strip().lower() for t in traces) if traces else exp.apps
    unknown = [t for t in chosen if t not in exp.apps]
    if unknown:
        raise ValueError(
            f"apps: {exp.name} runs the traces {', '.join(exp.apps)}, got {', '.join(unknown)}"
        )
    n = (exp.queries or None) if queries is None else queries
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"queries: must be an int >= 1, got {n!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: must be an int >= 1, got {seeds!r}")
    folder = Path(data_dir) if data_dir is not None else PIPELINES_DIR
    names = PIPELINE_NAMES if exp.pipeline == "*" else tuple(exp.pipeline.split(","))
    setups = [
        plan_setup(folder / f"{p}.json", folder / f"{p}.profile.json", n, scaling=scaling)
        for p in names
    ]
    st = Settings(
        out_dir=Path(out) / exp.name,
        data_dir=folder,
        apps=chosen,
        queries=n or 0,
        tol=0.0,
        workers=max(1, workers),
        budget=False,
        quiet=quiet,
        seeds=tuple(TRACE_SEED + i for i in range(seeds)),
    )
    st.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    sections = exp.body(st, setups if len(names) > 1 or exp.pipeline == "*" else setups[0])
    wall_s = time.monotonic() - t0
    files = sorted(
        str(p.relative_to(st.out_dir))
        for p in st.out_dir.rglob("*")
        if p.suffix in (".csv", ".png", ".md") and p.name != f"{exp.name}.md"
    )
    size = f"{n:,} requests per trace" if n else f"{setups[0].duration_s:g} s of trace each"
    workers_text = "scaled at run time (PARD §5.1)" if scaling else "fixed (no run-time scaling)"
    head = [
        f"# {exp.name}: {exp.title}",
        "",
        f"- Traces: {', '.join(chosen)}; {size}; workers {workers_text}; {seeds} seed(s)",
        f"- Command: `tailgate sim experiment {exp.name}"
        + (f" --queries {n}" if queries is not None else "")
        + ("" if scaling else " --fixed-workers")
        + f" --seeds {seeds}"
        + (f" --apps {','.join(chosen)}" if traces else "")
        + "`",
        f"- Wall time: {format_duration(wall_s)} with {st.workers} worker process(es)",
    ]
    text = (
        "\n".join(head)
        + "\n\n"
        + "\n\n".join([*sections, "## Files\n\n" + ", ".join(f"`{f}`" for f in files)])
        + "\n"
    )
    md = st.out_dir / f"{exp.name}.md"
    md.write_text(text, encoding="utf-8")
    if not quiet:
        print(text)
    return md


EXPERIMENTS = (
    *(
        Experiment(
            f"pard-{pipeline}",
            f"PARD vs no dropping, Nexus and Clipper++ on the {pipeline} pipeline "
            "(periodic, bursty, spiky traces), and PARD's ablations",
            0,
            ("periodic", "bursty", "spiky"),
            pipeline_experiment,
            pipeline=pipeline,
            searches_max_load=False,
        )
        for pipeline in (*PIPELINE_NAMES, "dag_dynamic")
    ),
    Experiment(
        "pard-all",
        "PARD's twelve workloads (four pipelines x three traces) against Nexus, Clipper++ and "
        "no dropping, and the ablations",
        0,
        ("periodic", "bursty", "spiky"),
        all_pipelines_experiment,
        pipeline="*",
        searches_max_load=False,
    ),
    Experiment(
        "pard-sensitivity",
        "PARD's sensitivity to the SLO, lambda and the queueing window (traffic and live, "
        "bursty trace)",
        0,
        ("bursty",),
        sensitivity_experiment,
        pipeline="traffic,live",
        searches_max_load=False,
    ),
)
"""PARD §5's comparisons on the shipped pipelines."""
