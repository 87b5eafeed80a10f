"""PARD live: one trace through a real ONNX pipeline per dropping policy, beside the simulator.

    python -m loadtests.pard_live [--pipeline traffic] [--trace bursty|tweet|...]
        [--workers 1|N|auto] [--max-workers 4] [--total-workers N] [--cold-start-s 2]
        [--worker-mode auto|process|thread]
        [--headroom 1.2] [--profile PATH] [--providers cpu|cuda] [--rate R | --load 0.9]
        [--seconds 40] [--droppers pard,nexus,clipper++,none] [--no-sim] [--out pard-live]

The same trace (`loadtests.sim.traces`, seeded; ``wiki``, ``tweet`` and ``azure`` name the
periodic, bursty and spiky shapes) is replayed open loop into a fresh `PipelineExecutor` per
policy: real onnxruntime sessions on this machine, each request's deadline its trace time
plus the SLO (the driver hands the executor the SLO less how late it sent the request). With
``--sim`` (the default) the very same arrivals then run through `simulate_pipeline` under
the same policy, SLO, batch sizes and worker settings, with the profile's durations, and
the two sides are printed side by side: goodput, drop rate (dropped plus late over all),
invalid rate, serving workers over time, and the live/sim gap with PASS/FAIL against
``--tolerance`` (10%). OUT/ gets the markdown, CSVs and PNGs (`loadtests.pard_live_report`).

Setup, from the profile (``--profile``, default the shipped ``NAME.profile.json``: measure
one on the machine that runs the replay, ``python -m onnx_models profile NAME --out FILE``,
or the simulator side runs another machine's durations; a profile whose environment does
not look like this machine's is warned about loudly):

- SLO and b_k as the simulator experiments set them (`plan_setup`: the spec's SLO, raised to
  the floor a lone request needs; b_k by Nexus's rule). The live modules' feasible batch
  sizes are cut at b_k, as the simulator's are, and each session runs the profile's
  intra-op threads, so a live batch costs what the profile says it does.
- Workers: ``N`` per module, fixed; or ``auto``: the WorkerScaler (taskserver.pard.scaling)
  on both sides, from ``min_workers`` (1) per module up to ``--max-workers`` each and
  ``--total-workers`` over the pipeline (default the CPUs this process may use, at least one
  per module), a started worker serving ``--cold-start-s`` after the decision. Each
  worker's session runs in a process of its own or in a thread of the replay's process
  (``--worker-mode``; auto: processes on the CPU from 4 usable CPUs, threads on CUDA and
  smaller hosts; taskserver.pipeline.sessions.resolve_worker_mode), as PARD gives each
  worker a container (§4.1, §5.1); the per-module table shows what the process hop added
  to each live batch.
- Rate (unless ``--rate``): ``--load`` (0.9, as the simulator experiments) times the
  pipeline's capacity at the workers it can reach. One worker serves mu_k = b_k / d_k(b_k)
  requests per second; from the starting workers, one worker at a time goes to the module
  of least capacity n_k mu_k while that module is below its maximum and the pipeline below
  its total; the capacity is then min_k n_k mu_k (with fixed workers, n_k = N). The mean
  rate so keeps the scaled-out pipeline near its limit, and the trace's rises go above what
  the starting workers (and, in bursts, the cap) can serve: dropping is needed.

Validity of a live run: the driver's lateness (when it sent each request against its trace
time; p99 and max) and the process's CPU use are reported; a run whose p99 lateness exceeds
``--lateness-bound`` of the SLO (1%) is INVALID, its comparison not judged: the host could
not keep up with the trace (a 2-core machine will not, at the derived rate).

Decision overhead, live: the time each worker spends in PARD's decision calls (DEPQ push,
the planner's context, ``form_batch`` and the recheck's ``decide``; `ModuleWorker.decide_ns`),
shared among the requests each call decided and summed over modules, against the request's
end-to-end latency (trace time to answer): mean and p99 over completed requests, and the
total over all requests (dropped ones until their drop). The state exchange and w_k
refreshes run on the loop between requests, not in a request's path; they are shown apart.

A policy named ``NAME@profile`` runs NAME live with the offline profile's d_k alone (PARD's
own setting, ``adapt_durations = false``), as the simulator always does; plain names follow
the measured batch times live, in eq. (3) and in the scaler's mu_k, so a host that runs the
batches slower than profiled (the per-module table shows measured / profiled time) scales
out further live than simulated. What else differs from the simulator, and stays: its
docstring (`loadtests.sim.pipeline`), chiefly the published batch size (live: the target of
each launch, starting at the smallest feasible size; sim: the mean of the last exchange
period), noise drawn around the profile instead of measured, and one queue per module live
against one per worker in the simulator when a module has several workers; a live worker
serves after its cold start or once its session is built and warmed, whichever is later (on
CUDA a worker builds one session per feasible batch size, and runs a short batch padded to
the next size); and the live side pays for its event loop and threads, which the simulator
does not model (the validity table shows what they used).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.pard_live_report import (
    LiveSetup,
    Overhead,
    PolicyResult,
    SideDigest,
    Validity,
    write_report,
)
from loadtests.sim.pard_experiments import LOAD, plan_setup
from loadtests.sim.pipeline import DROPPED, LATE, ON_TIME, simulate_pipeline
from loadtests.sim.pipeline_model import SimConfig
from loadtests.sim.traces import MIN_DURATION_S, TRACE_ALIASES, TRACE_NAMES, make_trace
from onnx_models.pipeline_config import pipeline_config
from onnx_models.profile import CPU, CUDA, Profile, ProfileError, device_name
from onnx_models.spec import load_pipeline, pipeline_path
from taskserver.abc import ExecutorError, TaskDropped
from taskserver.pard import ScalingConfig, StatePlanner, create_dropper
from taskserver.pipeline import PipelineConfig, PipelineExecutor
from taskserver.pipeline.sessions import (
    resolve_providers,
    resolve_worker_mode,
    usable_cpus,
)

__all__ = ["LiveSetup", "live_config", "main", "plan_live", "replay_live", "simulate_side"]

SIM_SEED = 1
"""Seed of the simulator's service-time draws."""
SAMPLE_S = 0.5
"""How often the live run samples each module's serving workers."""


def _reach(
    worker_rps: dict[str, float], first: int, most: int, total: int | None
) -> dict[str, int]:
    """Workers per module when each next one goes to the module of least capacity."""
    n = dict.fromkeys(worker_rps, first)
    while total is None or sum(n.values()) < total:
        low = min(n, key=lambda m: n[m] * worker_rps[m])
        if n[low] >= most:
            break  # the bottleneck cannot grow: more workers elsewhere serve nothing more
        n[low] += 1
    return n


def profile_warnings(profile: Profile, providers: str) -> list[str]:
    """How the environment a profile was taken in differs from this machine's (empty: none)."""
    env = profile.environment
    want = CUDA if providers == "cuda" else CPU
    out = []
    if want not in env.provider.split(","):
        out.append(f"it was taken on {env.provider}, this run uses {want}")
    here = device_name(want)
    if env.device != here:
        out.append(f"it was taken on {env.device!r}, this machine has {here!r}")
    if env.platform and env.platform != platform.platform():
        out.append(f"its platform is {env.platform!r}, this one's is {platform.platform()!r}")
    try:
        import onnxruntime as ort
    except ImportError:  # the live side cannot run; the executor will say so
        ort = None
    if ort is not None and env.onnxruntime != ort.__version__:
        out.append(f"it used onnxruntime {env.onnxruntime}, this run {ort.__version__}")
    if profile.cpu_share is not None and profile.cpu_share < 0.9:
        out.append(f"the profiler had only {profile.cpu_share:.0%} of its threads' time")
    return out


def plan_live(
    pipeline: str,
    *,
    profile: str | Path | None = None,
    workers: int | ScalingConfig = 1,
    providers: str = "cpu",
    rate_rps: float | None = None,
    load: float = LOAD,
    worker_mode: str = "auto",
) -> LiveSetup:
    """The setup of the module docstring; ValueError (naming the file or field) if it fails."""
    spec_path = pipeline_path(pipeline)
    if not spec_path.is_file():
        raise ValueError(f"--pipeline: no spec file or shipped pipeline {pipeline!r}")
    spec = load_pipeline(spec_path)
    profile_path = (
        Path(profile) if profile is not None else spec_path.with_name(f"{spec.name}.profile.json")
    )
    try:
        plan = plan_setup(spec_path, profile_path, 1)  # SLO, b_k and mu_k; its rate is not ours
    except ProfileError as exc:  # b_k (Nexus's rule) needs d_k at every feasible size
        raise ValueError(
            f"--profile {profile_path}: {exc}: profile every batch size the pipeline runs "
            "(onnx_models profile without --batch-sizes)"
        ) from exc
    first = workers.min_workers if isinstance(workers, ScalingConfig) else workers
    if isinstance(workers, ScalingConfig):
        reach = _reach(plan.worker_rps, first, workers.max_workers, workers.total_workers)
    else:
        reach = dict.fromkeys(plan.worker_rps, first)
    capacity = min(reach[m] * plan.worker_rps[m] for m in reach)
    prof: Profile = plan.model.profile  # type: ignore[assignment]
    return LiveSetup(
        pipeline=spec.name,
        spec_path=spec_path,
        profile_path=profile_path,
        profile=prof,
        model=plan.model,
        slo_s=plan.slo_s,
        max_batch=dict(plan.max_batch),
        worker_rps=dict(plan.worker_rps),
        workers=workers,
        reach=reach,
        capacity_rps=capacity,
        rate_rps=rate_rps if rate_rps is not None else load * capacity,
        load=None if rate_rps is not None else load,
        providers=providers,
        warnings=tuple(profile_warnings(prof, providers)),
        worker_mode=resolve_worker_mode(
            worker_mode, [CUDA, CPU] if providers == "cuda" else [CPU], usable_cpus()
        ),
    )


def live_config(setup: LiveSetup, dropper: str) -> PipelineConfig:
    """The executor's config: the setup's profile, SLO, b_k, workers and threads."""
    name, _, variant = dropper.partition("@")
    config = pipeline_config(
        setup.spec_path,
        profile=setup.profile_path,
        dropper=name,
        providers=setup.providers,
        workers=setup.workers,
    )
    modules = tuple(
        dataclasses.replace(
            m, batch_sizes=tuple(b for b in m.batch_sizes if b <= setup.max_batch[m.id])
        )
        for m in config.modules
    )
    knobs = config.pard
    if variant == "profile":
        knobs = dataclasses.replace(knobs, adapt_durations=False)
    return dataclasses.replace(
        config,
        modules=modules,
        slo_ms=setup.slo_s * 1000.0,
        intra_op_threads=setup.profile.environment.intra_op_threads,
        pard=knobs,
        worker_mode=setup.worker_mode,
    )


def sim_config(setup: LiveSetup) -> SimConfig:
    """The simulator's settings: the same b_k, workers and scaling as the live executor."""
    scaling = setup.workers if isinstance(setup.workers, ScalingConfig) else None
    return SimConfig(
        workers=setup.first_workers, scaling=scaling, max_batch=setup.max_batch, seed=SIM_SEED
    )


def tree_cpu_s() -> float:
    """CPU seconds of this process, of its children that ended, and of those still running.

    Worker processes (``--worker-mode process``) do the model work outside this process, so
    its own CPU time alone would show the replay all but idle. The running children's times
    come from /proc (Linux); elsewhere they are left out.
    """
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = time.process_time() + ended.ru_utime + ended.ru_stime
    me = str(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile (or no /proc)
            continue
        if fields[1] == me:  # ppid; then utime and stime in clock ticks
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _workers(ex: PipelineExecutor) -> dict[str, int]:
    return {mid: w.workers for mid, w in ex.workers.items()}


@dataclass(slots=True)
class _Live:
    """What the driver records of each request (index = trace order)."""

    n: int
    outcome: np.ndarray = field(init=False)
    end_s: np.ndarray = field(init=False)
    late_s: np.ndarray = field(init=False)
    bodies: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcome = np.zeros(self.n, dtype=np.int8)  # ON_TIME, LATE or DROPPED
        self.end_s = np.full(self.n, np.nan)
        self.late_s = np.zeros(self.n)


async def replay_live(
    setup: LiveSetup,
    dropper: str,
    arrivals_s: Sequence[float],
    seconds: float,
    *,
    lateness_bound: float = 0.01,
) -> tuple[SideDigest, Validity, Overhead, dict[str, Any]]:
    """Replay arrivals into a new executor with this dropper: its digest, the driver's
    validity figures (INVALID above `lateness_bound` x SLO at p99), the decision overhead
    and the executor's last snapshot."""
    config = live_config(setup, dropper)
    ex = PipelineExecutor(config)
    slo_s = setup.slo_s
    n = len(arrivals_s)
    rec = _Live(n)
    payloads = [json.dumps({"image_seed": i}).encode() for i in range(n)]
    clock = time.perf_counter
    samples: list[tuple[float, dict[str, int]]] = []
    failed = 0

    async def one(i: int, t_arrival: float, start: float) -> None:
        nonlocal failed
        late_s = clock() - start - t_arrival
        rec.late_s[i] = late_s
        budget_ms = max((slo_s - late_s) * 1000.0, 1e-3)  # the deadline is trace time + SLO
        try:
            body = await ex.execute(payloads[i], budget_ms=budget_ms)
        except TaskDropped:
            rec.outcome[i] = DROPPED
        except ExecutorError:
            rec.outcome[i] = DROPPED
            failed += 1
        else:
            rec.bodies[i] = body
        rec.end_s[i] = clock() - start
        if not rec.outcome[i]:
            rec.outcome[i] = ON_TIME if rec.end_s[i] - t_arrival <= slo_s else LATE

    async def sample(start: float) -> None:
        while True:
            samples.append((clock() - start, _workers(ex)))
            await asyncio.sleep(SAMPLE_S)

    try:
        await ex.execute(b"{}")  # sessions loaded and warm before the clock starts
        base = {
            mid: (w.decide_ns, w.batches, w.requests, w.exec_s, w.profiled_s, w.hop_s)
            for mid, w in ex.workers.items()
        }
        exchange0 = ex.exchange_s
        for w in ex.workers.values():
            w.decide_ns_by_request = {}
        cpu0, own0, loop0 = tree_cpu_s(), time.process_time(), time.thread_time()
        start = clock()
        sampler = asyncio.create_task(sample(start))
        tasks = []
        for i, t in enumerate(arrivals_s):
            delay = start + t - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, t, start)))
        await asyncio.gather(*tasks)
        wall = clock() - start
        cpu_s, loop_s = tree_cpu_s() - cpu0, time.thread_time() - loop0
        own_s = time.process_time() - own0
        sampler.cancel()
        snap = ex.snapshot()
    finally:
        await ex.close()
    arrivals = np.asarray(arrivals_s, dtype=float)
    per_s = np.zeros(int(seconds))
    good = rec.outcome == ON_TIME
    ends = rec.end_s[good]
    np.add.at(per_s, ends[ends < len(per_s)].astype(int), 1)  # within the trace, as the sim
    mods = snap["modules"]
    delta = {
        mid: tuple(
            now - before
            for now, before in zip(
                (w.decide_ns, w.batches, w.requests, w.exec_s, w.profiled_s, w.hop_s),
                base[mid],
                strict=True,
            )
        )
        for mid, w in ex.workers.items()
    }
    digest = SideDigest(
        side="live",
        policy=dropper,
        requests=n,
        on_time=int(good.sum()),
        late=int((rec.outcome == LATE).sum()),
        dropped=int((rec.outcome == DROPPED).sum()),
        failed=failed,
        invalid_rate=snap["invalid_rate"],
        seconds=seconds,
        per_second=per_s.tolist(),
        workers=samples,
        drops_by_module=dict(snap["drops_by_module"]),
        mean_batch={m: d[2] / d[1] if d[1] else 0.0 for m, d in delta.items()},
        exec_vs_profile={m: d[3] / d[4] if d[4] else 0.0 for m, d in delta.items()},
        hop_ms={m: d[5] / d[1] * 1000.0 if d[1] else 0.0 for m, d in delta.items()},
        scaling_actions={
            m: (v["scaling_actions"]["start"], v["scaling_actions"]["stop"])
            for m, v in mods.items()
        },
    )
    validity = Validity(
        lateness_p99_s=float(np.percentile(rec.late_s, 99)) if n else 0.0,
        lateness_max_s=float(rec.late_s.max()) if n else 0.0,
        bound_s=lateness_bound * slo_s,
        wall_s=wall,
        cpu_s=cpu_s,
        loop_cpu_s=loop_s,
        own_cpu_s=own_s,
        cpus=usable_cpus(),
        lateness_by_second=_p99_by_second(arrivals, rec.late_s, seconds),
    )
    overhead = _overhead(
        ex, rec, arrivals, sum(d[0] for d in delta.values()), ex.exchange_s - exchange0
    )
    return digest, validity, overhead, snap


def _overhead(
    ex: PipelineExecutor, rec: _Live, arrivals: np.ndarray, decide_ns: int, exchange_s: float
) -> Overhead:
    """Decision time per request (summed over modules) against its end-to-end latency."""
    by_request: dict[int, int] = {}
    for w in ex.workers.values():
        for rid, ns in (w.decide_ns_by_request or {}).items():
            by_request[rid] = by_request.get(rid, 0) + ns
    ratios = []
    for i, body in rec.bodies.items():
        rid = json.loads(body)["request"]
        ratios.append(by_request.get(rid, 0) / 1e9 / (rec.end_s[i] - arrivals[i]))
    e2e = rec.end_s - arrivals
    return Overhead(
        completed=len(ratios),
        mean_ratio=float(np.mean(ratios)) if ratios else 0.0,
        p99_ratio=float(np.percentile(ratios, 99)) if ratios else 0.0,
        decide_s=decide_ns / 1e9,
        e2e_s=float(np.nansum(e2e)),
        requests=len(arrivals),
        exchange_s=exchange_s,
    )


def _p99_by_second(arrivals_s: np.ndarray, late_s: np.ndarray, seconds: float) -> tuple[float, ...]:
    """p99 of `late_s` over the requests arriving in each whole second (0.0 for none)."""
    second = arrivals_s.astype(int)
    return tuple(
        float(np.percentile(late_s[second == t], 99)) if (second == t).any() else 0.0
        for t in range(int(seconds))
    )


def simulate_side(
    setup: LiveSetup, dropper: str, arrivals_s: Sequence[float], seconds: float
) -> SideDigest:
    """The same arrivals through `simulate_pipeline` with the setup's profile and settings."""
    name = dropper.partition("@")[0]
    run = simulate_pipeline(
        setup.model, np.asarray(arrivals_s, dtype=float), name, sim_config(setup)
    )
    s = run.summary
    per_s = [0.0] * int(seconds)
    for p in run.timeline:  # goodput window 1 s: on-time completions in (t - 1, t]
        k = round(p.time_s) - 1
        if 0 <= k < len(per_s):
            per_s[k] = p.goodput_rps
    first = setup.first_workers
    workers = [(0.0, dict.fromkeys(setup.model.modules, first))]
    workers += [(d.now, {p.module_id: p.ready for p in d.modules}) for d in run.scaling]
    sizes: dict[str, list[int]] = {m: [] for m in setup.model.modules}
    for b in run.batches:
        sizes[b.module_id].append(b.size)
    actions: dict[str, tuple[int, int]] = {m: (0, 0) for m in setup.model.modules}
    for d in run.scaling:
        for p in d.modules:
            a = actions[p.module_id]
            actions[p.module_id] = (a[0] + p.start, a[1] + p.stop)
    return SideDigest(
        side="sim",
        policy=dropper,
        requests=s.arrived,
        on_time=s.on_time,
        late=s.late,
        dropped=s.dropped,
        failed=0,
        invalid_rate=s.invalid_rate,
        seconds=seconds,
        per_second=per_s,
        workers=workers,
        drops_by_module=run.drops_by_module(),
        mean_batch={m: float(np.mean(v)) if v else 0.0 for m, v in sizes.items()},
        exec_vs_profile={},
        scaling_actions=actions,
    )


def _workers_arg(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    auto = ScalingConfig()
    p = argparse.ArgumentParser(
        prog="python -m loadtests.pard_live",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pipeline", default="traffic", help="shipped name or spec file (traffic)")
    p.add_argument(
        "--trace", default="bursty", choices=[*TRACE_NAMES, *TRACE_ALIASES], help="(bursty)"
    )
    p.add_argument("--rate", type=float, help="mean requests per second (default: --load rule)")
    p.add_argument("--load", type=float, default=LOAD, help=f"mean rate / capacity ({LOAD})")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--droppers", default="pard,nexus,clipper++,none")
    p.add_argument("--seed", type=int, default=1, help="the trace's seed (1)")
    p.add_argument(
        "--workers", type=_workers_arg, default=1, help="per module: N fixed, or auto (1)"
    )
    p.add_argument("--max-workers", type=int, default=auto.max_workers)
    p.add_argument("--total-workers", type=int, help="cap over the pipeline (default: usable CPUs)")
    p.add_argument("--cold-start-s", type=float, default=auto.cold_start_s)
    p.add_argument(
        "--worker-mode",
        choices=["auto", "process", "thread"],
        default="auto",
        help="each worker's session in a process of its own or a thread of this one; auto: "
        "process on the CPU from 4 usable CPUs, thread on CUDA and smaller hosts (auto)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=auto.headroom,
        help="auto: workers wanted = ceil(rate / mu x headroom)",
    )
    p.add_argument("--profile", type=Path, help="offline profile (default: the shipped one)")
    p.add_argument("--providers", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--sim", action=argparse.BooleanOptionalAction, default=True, help="simulate too"
    )
    p.add_argument("--tolerance", type=float, default=0.10, help="live/sim gap for PASS (0.10)")
    p.add_argument(
        "--lateness-bound",
        type=float,
        default=0.01,
        help="driver p99 lateness over the SLO above which a run is INVALID (0.01)",
    )
    p.add_argument("--out", default="pard-live")
    return p


def _scaling(args: argparse.Namespace, modules: int) -> ScalingConfig:
    total = args.total_workers
    if total is None:
        total = max(usable_cpus(), modules)  # one serving worker per module at least
    elif total < modules:
        raise ValueError(f"--total-workers: need one per module ({modules}) at least, got {total}")
    return ScalingConfig(
        max_workers=args.max_workers,
        total_workers=total,
        cold_start_s=args.cold_start_s,
        headroom=args.headroom,
    )


def _check_droppers(setup: LiveSetup, droppers: list[str]) -> str | None:
    """None, or what is wrong with a --droppers entry."""
    source = setup.model.source
    for d in droppers:
        name, _, variant = d.partition("@")
        if variant not in ("", "profile"):
            return f"unknown variant {variant!r} in {d!r} (profile)"
        try:
            create_dropper(name, StatePlanner(source, setup.model.graph, setup.profile))
        except ValueError as exc:
            return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = _parser()
    args = p.parse_args(argv)
    if not (args.seconds >= MIN_DURATION_S and math.isfinite(args.seconds)):
        p.error(f"--seconds: need at least {MIN_DURATION_S:g}, got {args.seconds:g}")
    if args.rate is not None and not (args.rate > 0 and math.isfinite(args.rate)):
        p.error(f"--rate: need a finite number > 0, got {args.rate:g}")
    if not 0 < args.load <= 10:
        p.error(f"--load: need a share of the capacity in (0, 10], got {args.load:g}")
    droppers = [d.strip() for d in args.droppers.split(",") if d.strip()]
    if not droppers:
        p.error("--droppers: name at least one policy")
    try:
        modules = len(load_pipeline(pipeline_path(args.pipeline)).modules)
        workers = args.workers if args.workers != "auto" else _scaling(args, modules)
        setup = plan_live(
            args.pipeline,
            profile=args.profile,
            workers=workers,
            providers=args.providers,
            rate_rps=args.rate,
            load=args.load,
            worker_mode=args.worker_mode,
        )
        live_config(setup, droppers[0].partition("@")[0])  # the spec, profile and b_k agree
        resolve_providers(args.providers)  # cuda without onnxruntime-gpu: say so now
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    problem = _check_droppers(setup, droppers)
    if problem:
        p.error(f"--droppers: {problem}")
    if setup.warnings:
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: the profile {setup.profile_path} may not hold on this machine:",
            file=sys.stderr,
        )
        for w in setup.warnings:
            print(f"  - {w}", file=sys.stderr)
        print(
            "the simulator side runs its durations, not this machine's: profile here with "
            f"`python -m onnx_models profile {setup.pipeline} --out FILE`, then --profile FILE"
            f"\n{bar}",
            file=sys.stderr,
            flush=True,
        )
    trace = make_trace(args.trace, args.seconds, setup.rate_rps, seed=args.seed)
    arrivals = trace.arrivals_s.tolist()
    results = []
    for d in droppers:
        live, validity, overhead, snap = asyncio.run(
            replay_live(setup, d, arrivals, args.seconds, lateness_bound=args.lateness_bound)
        )
        sim = simulate_side(setup, d, arrivals, args.seconds) if args.sim else None
        r = PolicyResult(d, live, sim, validity, overhead, snap)
        results.append(r)
        print(r.line(args.tolerance), flush=True)
    md = write_report(Path(args.out), setup, trace, args, results)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
