"""PARD experiments on the shipped pipelines: ``pard-traffic``, ``-live``, ``-ga``, ``-dag``.

Each runs one pipeline (``onnx_models/pipelines/NAME.json`` with its offline profile
``NAME.profile.json``) through the periodic, bursty and spiky traces (`loadtests.sim.traces`)
under PARD and the baselines of PARD §5.1 (no dropping, Nexus, Clipper++), then under PARD's
ablations (Table 1), and reports goodput over time, drop rate, invalid rate and where requests
were dropped. Setup, from the profile (printed in the report):

- b_k: Nexus's rule (`nexus_batch_sizes`): the largest feasible size with 2 d_k(b) within the
  module's share of the SLO.
- Workers (PARD §5.1 resource scaling, done once before the run): T_k = b_k / d_k(b_k) is one
  worker's throughput; every module gets ceil(T_med / T_k) workers, T_med being the median
  T_k, so that no module is far below the others and queues can build anywhere on the path.
- Rate: the trace's mean rate is `LOAD` (90%) of the pipeline's capacity min_k W_k T_k, so
  the bottleneck runs at 90% on average and the bursts go above it: dropping is needed.
  Requests per trace (``--queries``) set the duration, at least `MIN_DURATION_S`.
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
from loadtests.sim.pard_report import PardReport, goodput_over
from loadtests.sim.pard_runs import RunDigest, Setup
from loadtests.sim.pipeline import simulate_pipeline
from loadtests.sim.pipeline_model import PipelineModel, nexus_batch_sizes
from loadtests.sim.progress import format_duration
from loadtests.sim.traces import MIN_DURATION_S, make_trace, overload_periods
from taskserver.pard import ScalingConfig

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
"""Mean rate as a share of the pipeline's capacity."""
TRACE_SEED = 1


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
    spec_path: Path, profile_path: Path, requests: int, *, scaling: ScalingConfig | None = None
) -> Setup:
    """Batch sizes, workers, rate and SLO of one pipeline by the rules of the module docstring;
    with `scaling`, the workers follow the rate at run time from there (PARD §5.1)."""
    model = load_model(spec_path, profile_path)
    floor_s = 2.0 * max(
        sum(2.0 * model.duration_s(m, model.batch_sizes[m][0]) for m in path)
        for path in model.graph.paths
    )
    spec_slo_s = model.slo_s
    slo_s = model.slo_s = max(spec_slo_s, floor_s)
    max_batch = nexus_batch_sizes(model)
    worker_rps = {m: max_batch[m] / model.duration_s(m, max_batch[m]) for m in model.modules}
    median = statistics.median(worker_rps.values())
    workers = {m: max(1, math.ceil(median / t - 1e-9)) for m, t in worker_rps.items()}
    capacity = min(workers[m] * worker_rps[m] for m in model.modules)
    rate = LOAD * capacity
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
        duration_s=max(MIN_DURATION_S, requests / rate),
        scaling=scaling,
    )


# --- One run (module level: it runs in a worker process) ---------------------------------


def _run(job: int, setup: Setup, trace_name: str, policy: str) -> RunDigest:
    """Simulate one (trace, policy)."""
    model = setup.model
    trace = make_trace(trace_name, setup.duration_s, setup.rate_rps, seed=TRACE_SEED)
    run = simulate_pipeline(model, trace.arrivals_s, policy, setup.config())
    _tick(job)
    offered = trace.counts()
    good = np.zeros(len(offered))
    for p in run.timeline:  # goodput window 1 s: on-time completions in (t - 1, t]
        if 1 <= round(p.time_s) <= len(good):
            good[round(p.time_s) - 1] = p.goodput_rps
    periods = overload_periods(trace, setup.capacity_rps)  # the periods that require dropping
    timeline = [(t + 1.0, float(offered[t]), float(good[t])) for t in range(len(good))]
    sizes: dict[str, list[int]] = {m: [] for m in model.modules}
    for b in run.batches:
        sizes[b.module_id].append(b.size)
    s, mods = run.summary, run.modules
    return RunDigest(
        trace=trace_name,
        policy=policy,
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
    )


# --- The experiment body -----------------------------------------------------------------


def pipeline_experiment(st: Any, setup: Setup) -> list[str]:
    """Every trace under every policy and ablation: CSV, PNG and the markdown sections."""
    model = setup.model
    pool = st.pool(setup.pipeline)
    for trace in st.apps:
        for policy in (*POLICIES, *ABLATIONS):
            pool.add(_run, (setup, trace, policy), 1)
    report = PardReport(setup, model, tuple(st.apps), POLICIES, ABLATIONS, tuple(pool.run()))
    report.write_csvs(st.out_dir)
    report.write_plots(st.out_dir)
    return report.sections()


def run_pipeline_experiment(
    exp: Any,
    out: str | Path,
    data_dir: str | Path | None = None,
    queries: int | None = None,
    traces: Any = None,
    *,
    workers: int = 2,
    quiet: bool = False,
) -> Path:
    """Run a pipeline experiment into OUT/NAME/ and print its tables; the markdown file's path.

    `data_dir` holds the spec and profile (default: the shipped ``onnx_models/pipelines``);
    `queries` is the number of requests per trace; `traces` a subset of the experiment's.
    """
    from onnx_models.spec import PIPELINES_DIR

    chosen = tuple(t.strip().lower() for t in traces) if traces else exp.apps
    unknown = [t for t in chosen if t not in exp.apps]
    if unknown:
        raise ValueError(
            f"apps: {exp.name} runs the traces {', '.join(exp.apps)}, got {', '.join(unknown)}"
        )
    n = exp.queries if queries is None else queries
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"queries: must be an int >= 1, got {n!r}")
    folder = Path(data_dir) if data_dir is not None else PIPELINES_DIR
    setup = plan_setup(folder / f"{exp.pipeline}.json", folder / f"{exp.pipeline}.profile.json", n)
    st = Settings(
        out_dir=Path(out) / exp.name,
        data_dir=folder,
        apps=chosen,
        queries=n,
        tol=0.0,
        workers=max(1, workers),
        budget=False,
        quiet=quiet,
    )
    st.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    sections = exp.body(st, setup)
    wall_s = time.monotonic() - t0
    files = sorted(p.name for p in st.out_dir.iterdir() if p.suffix in (".csv", ".png"))
    head = [
        f"# {exp.name}: {exp.title}",
        "",
        f"- Traces: {', '.join(chosen)}; {n:,} requests per trace; policies "
        f"{', '.join(POLICIES)}; ablations {', '.join(ABLATIONS)}",
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


EXPERIMENTS = tuple(
    Experiment(
        f"pard-{pipeline}",
        f"PARD vs no dropping, Nexus and Clipper++ on the {pipeline} pipeline "
        "(periodic, bursty, spiky traces)",
        15_000,
        ("periodic", "bursty", "spiky"),
        pipeline_experiment,
        pipeline=pipeline,
        searches_max_load=False,
    )
    for pipeline in ("traffic", "live", "ga", "dag")
)
"""PARD §5's comparisons on the shipped pipelines."""
