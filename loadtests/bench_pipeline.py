"""Benchmark of the live pipeline runtime: module throughput, batching, PARD's overhead inside it.

Run on purpose, not in CI: ``python -m loadtests.bench_pipeline [--pipeline traffic]
[--seconds 8] [--providers auto|cpu|cuda] [--dropper pard] [--emulate]``. Three parts, on
this machine (``--emulate`` swaps the models for sleeps of their profiled durations, which
shows the scheduler's own behaviour without the noise of a shared CPU):

1. Isolated: each module's session alone at every feasible batch size: ms per batch, requests
   per second, and the batching gain (throughput over batch 1's).
2. Saturated: closed-loop clients keep the pipeline full with budgets too large to drop
   anything, through PipelineExecutor (PARD deciding every request). Per module: requests/s
   served, busy share of the wall time, mean batch, and batching gain: the per-request
   cost at batch 1 (part 1) over the per-request model time actually paid in the run
   (b·d(1)/d(b), the "gain" of ``python -m onnx_models profile``). Requests that end in an
   error (a drop or a failure) are counted apart, by error type, not in the latencies.
3. Overload with PARD: open-loop Poisson arrivals at 1.5x the saturated throughput, with the
   pipeline's SLO as budget: goodput, drop and invalid rates, drops per module, and how much
   slower than its profile each module ran (PARD's estimate is only as good as d_k(b);
   ``--profile measured`` gives PARD part 1's figures instead of the spec's profile file).

In 2 and 3 the scheduling overhead is measured inside the runtime: the time on the event
loop spent in DEPQ pushes and ``form_batch`` (pops, eq. (3) decisions, the HBF sweep), summed
over modules per request, as a share of the mean request latency (target: < 1%); the state
exchange (publish, merge, refresh of w_k) is reported apart, amortised per request.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from onnx_models.pipeline_config import pipeline_config
from taskserver.abc import ExecutorError
from taskserver.pard import Profile
from taskserver.pipeline import (
    ModuleConfig,
    OnnxModel,
    PipelineConfig,
    PipelineExecutor,
    default_intra_op_threads,
    resolve_providers,
)


class ProfileSleeper:
    """A stand-in model that sleeps exactly its profiled d_k(b): the scheduler without noise."""

    provider = "emulated"
    output_name = "scores"

    def __init__(self, module: ModuleConfig, profile: Profile) -> None:
        self.module = module
        self.profile = profile
        self.input_shape = (1, 4, 4)
        self.input_dtype = np.dtype(np.float32)

    def run(self, batch: np.ndarray) -> np.ndarray:
        time.sleep(self.profile.duration_ms(self.module.id, len(batch)) / 1e3)
        return np.zeros((len(batch), 4), dtype=np.float32)


def make_executor(config: PipelineConfig, emulate: bool) -> PipelineExecutor:
    """Real sessions, or ProfileSleepers when emulating."""
    if not emulate:
        return PipelineExecutor(config)
    runners = {m.id: ProfileSleeper(m, config.profile) for m in config.modules}
    return PipelineExecutor(config, runners=runners)


def config_for(name: str, providers: str, profile: object = None) -> PipelineConfig:
    """A PipelineConfig from a shipped (or given) spec and its profile file (or `profile`)."""
    config = pipeline_config(name, providers=providers)
    return config if profile is None else dataclasses.replace(config, profile=profile)


def isolated(config: PipelineConfig, repeats: int) -> dict[str, dict[int, float]]:
    """Median ms per batch of each module's session alone, at each feasible batch size."""
    providers = resolve_providers(config.providers)
    threads = config.intra_op_threads or default_intra_op_threads(len(config.modules))
    rng = np.random.default_rng(0)
    table: dict[str, dict[int, float]] = {}
    print(f"1. isolated sessions ({providers[0]}, {threads} intra-op threads each)")
    print("   module                      batch    ms/batch      req/s   gain vs b=1")
    for m in config.modules:
        model = OnnxModel(m, providers, intra_op_threads=threads)
        table[m.id] = {}
        for b in m.batch_sizes:
            x = rng.random((b, *model.input_shape), dtype=np.float32).astype(model.input_dtype)
            for _ in range(2):
                model.run(x)
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model.run(x)
                samples.append(time.perf_counter() - t0)
            ms = statistics.median(samples) * 1e3
            table[m.id][b] = ms
            gain = (b / ms) / (1 / table[m.id][m.batch_sizes[0]])
            print(f"   {m.label:<27} {b:>5} {ms:>11.2f} {b / ms * 1e3:>10.1f} {gain:>12.2f}x")
    return table


async def _client(
    ex: PipelineExecutor, stop_s: float, lat: list[float], errors: Counter[str], seed: int
) -> None:
    i = seed
    while time.perf_counter() < stop_s:
        t0 = time.perf_counter()
        try:
            await ex.execute(json.dumps({"image_seed": i, "budget_ms": 600_000}).encode())
        except ExecutorError as exc:
            errors[type(exc).__name__] += 1
        else:
            lat.append(time.perf_counter() - t0)
        i += 1000


def _overhead(
    ex: PipelineExecutor, requests: int, mean_latency_s: float, loop_cpu_s: float
) -> None:
    sched = ex.snapshot()["scheduling"]
    per_req_us = sched["decide_s"] / max(1, requests) * 1e6
    exchange_us = sched["exchange_s"] / max(1, requests) * 1e6
    print(
        f"   scheduling inside the runtime: DEPQ push + form_batch (eq. 3 decisions) "
        f"{per_req_us:.1f} us per request over all modules "
        f"({sched['decide_us_per_decision']:.2f} us a decision) = "
        f"{per_req_us / (mean_latency_s * 1e6) * 100:.3f}% of the mean latency "
        f"{mean_latency_s * 1e3:.1f} ms (target < 1%)"
    )
    print(
        f"   state exchange (publish, merge, w_k refresh): {sched['exchange_s'] * 1e3:.1f} ms "
        f"in all, {exchange_us:.1f} us per request amortised"
    )
    print(
        f"   event-loop CPU, everything on the loop (load generator, payloads, routing, "
        f"decisions, results): {loop_cpu_s / max(1, requests) * 1e6:.0f} us per request"
    )


async def saturated(
    ex: PipelineExecutor, isolated_ms: dict[str, dict[int, float]], seconds: float, clients: int
) -> float:
    """Closed-loop saturation: per-module throughput and batching gain; returns req/s."""
    try:
        await ex.execute(b"{}")  # warm the sessions up
        latencies: list[float] = []
        errors: Counter[str] = Counter()
        start = time.perf_counter()
        cpu = time.thread_time()
        base = {mid: (w.requests, w.busy_s, w.exec_s) for mid, w in ex.workers.items()}
        await asyncio.gather(
            *(_client(ex, start + seconds, latencies, errors, s) for s in range(clients))
        )
        wall = time.perf_counter() - start
        cpu = time.thread_time() - cpu
        failed = sum(errors.values())
        print(
            f"\n2. saturated: {clients} closed-loop clients for {wall:.1f} s: "
            f"{len(latencies)} completed, {failed} errors"
            + (f" {dict(sorted(errors.items()))}" if failed else "")
        )
        print(
            "   module                      req/s   busy   mean batch   model ms/req   "
            "at b=1         gain   prep ms/req   vs profile   batch sizes"
        )
        for mid, w in ex.workers.items():
            served = w.requests - base[mid][0]
            busy = w.busy_s - base[mid][1]
            model_ms = (w.exec_s - base[mid][2]) / max(1, served) * 1e3
            prep_ms = (busy - (w.exec_s - base[mid][2])) / max(1, served) * 1e3
            b1 = isolated_ms[mid][w.module.batch_sizes[0]] / w.module.batch_sizes[0]
            drift = w.exec_s / w.profiled_s if w.profiled_s else 0.0
            print(
                f"   {w.module.label:<27} {served / wall:>6.1f} {busy / wall:>6.0%} "
                f"{served / max(1, w.batches):>12.2f} {model_ms:>14.2f} {b1:>8.2f} "
                f"{b1 / model_ms if model_ms else 0:>11.2f}x {prep_ms:>13.2f} {drift:>11.2f}x"
                f"   {dict(sorted(w.sizes.items()))}"
            )
        done = len(latencies)
        if not done:
            print("   pipeline: no request completed")
            return 0.0
        mean = statistics.fmean(latencies)
        p99 = sorted(latencies)[int(0.99 * (done - 1))]
        print(
            f"   pipeline: {done / wall:.1f} req/s, latency mean {mean * 1e3:.1f} ms, "
            f"p99 {p99 * 1e3:.1f} ms"
        )
        _overhead(ex, done, mean, cpu)
        return done / wall
    finally:
        await ex.close()


async def overload(ex: PipelineExecutor, rate: float, seconds: float, seed: int) -> None:
    """Open-loop Poisson arrivals at `rate` with the SLO as budget, PARD dropping."""
    config = ex.config
    rng = random.Random(seed)
    latencies: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            await ex.execute(json.dumps({"image_seed": i}).encode())
            latencies.append(time.perf_counter() - t0)
        except ExecutorError:
            pass

    try:
        await ex.execute(b"{}")  # warm-up: whatever became of it is subtracted below
        base = ex.snapshot()
        base_run = ex.metrics.pipeline(config.name, ex.clock())
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        cpu = time.thread_time()
        next_s = start
        i = 0
        while next_s < start + seconds:
            await asyncio.sleep(max(0.0, next_s - time.perf_counter()))
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            next_s += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        cpu = time.thread_time() - cpu
        snap = ex.snapshot()
        run = ex.metrics.pipeline(config.name, ex.clock())
        n = {k: snap[k] - base[k] for k in ("arrived", "on_time", "late", "dropped", "failed")}
        # As the executor's drop rate: failed and cancelled requests count as dropped here.
        finished = (run.on_time + run.late + run.dropped) - (
            base_run.on_time + base_run.late + base_run.dropped
        )
        dropped_or_late = (run.dropped + run.late) - (base_run.dropped + base_run.late)
        compute_s = run.compute_s - base_run.compute_s
        invalid_s = run.invalid_s - base_run.invalid_s
        drops = {
            m: k - base["drops_by_module"].get(m, 0) for m, k in snap["drops_by_module"].items()
        }
        print(
            f"\n3. overload: Poisson {rate:.1f} req/s for {seconds:.0f} s, budget = SLO "
            f"{config.slo_ms:.0f} ms, dropper {config.dropper}"
        )
        print(
            f"   arrived {n['arrived']}, on time {n['on_time']}, late {n['late']}, dropped "
            f"{n['dropped']}, failed {n['failed']} -> goodput {n['on_time'] / wall:.1f} req/s, "
            f"drop rate {dropped_or_late / max(1, finished):.1%}, "
            f"invalid rate {invalid_s / compute_s if compute_s > 0 else 0.0:.1%}"
        )
        print(f"   drops by module: {drops}")
        for mid, m in snap["modules"].items():
            print(
                f"   {m['name']:<24} (id {mid}) ran {m['exec_vs_profile']:.2f}x its profile, "
                f"mean batch {m['mean_batch']}: {m['batch_sizes']}"
            )
        if latencies:
            _overhead(ex, n["arrived"], statistics.fmean(latencies), cpu)
    finally:
        await ex.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the three parts and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="traffic", help="shipped name or spec path")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of parts 2 and 3")
    parser.add_argument("--clients", type=int, default=160, help="closed-loop clients (part 2)")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per cell (part 1)")
    parser.add_argument("--providers", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--overload", type=float, default=1.5, help="part 3 rate / part 2's")
    parser.add_argument(
        "--profile",
        default="file",
        choices=("file", "measured"),
        help="d_k(b) for PARD in parts 2 and 3: the spec's profile file, or part 1's figures",
    )
    parser.add_argument("--dropper", default="pard", help="dropping policy of parts 2 and 3")
    parser.add_argument(
        "--emulate",
        action="store_true",
        help="parts 2 and 3 on models that sleep their profiled d_k(b) (no hardware noise)",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    config = config_for(args.pipeline, args.providers)
    print(f"pipeline {config.name}: {[m.name for m in config.modules]}, SLO {config.slo_ms} ms\n")
    if args.emulate:
        table = {
            m.id: {b: config.profile.duration_ms(m.id, b) for b in m.batch_sizes}
            for m in config.modules
        }
        print("1. skipped: emulated models sleep their profiled durations")
    else:
        table = isolated(config, args.repeats)
    if args.profile == "measured":
        config = config_for(args.pipeline, args.providers, profile=table)
    config = dataclasses.replace(config, dropper=args.dropper)
    rate = asyncio.run(
        saturated(make_executor(config, args.emulate), table, args.seconds, args.clients)
    )
    ex = make_executor(config, args.emulate)
    asyncio.run(overload(ex, rate * args.overload, args.seconds, args.seed))


if __name__ == "__main__":
    main()
