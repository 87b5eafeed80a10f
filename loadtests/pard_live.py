"""PARD live: one trace through a real ONNX pipeline under each dropping policy.

    python -m loadtests.pard_live [--pipeline traffic] [--trace bursty] [--rate 120]
        [--seconds 40] [--droppers pard,nexus,clipper++,none] [--out pard-live]

The same trace (`loadtests.sim.traces`, seeded) is replayed open-loop into a fresh
`PipelineExecutor` per policy: real onnxruntime sessions on this machine, each request's
budget the pipeline's SLO. It prints, and writes to OUT/ as markdown, CSV and PNG: goodput
(requests finished within the SLO per second) over time and overall, drop rate (dropped
plus late over all), invalid rate (model time spent on requests finally dropped or late,
over all model time) and where the drops happened, by module.

A policy named ``NAME@profile`` runs NAME with the offline profile's d_k alone (PARD's
own setting, ``adapt_durations = false``); plain names follow the measured batch times.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.sim.traces import make_trace
from onnx_models.pipeline_config import pipeline_config
from taskserver.abc import ExecutorError, TaskDropped
from taskserver.pipeline import PipelineExecutor


async def run_policy(
    spec: str, dropper: str, arrivals_s: Sequence[float], seconds: float
) -> dict[str, Any]:
    """Replay arrivals into a new executor with this dropper; per-second goodput and totals."""
    name, _, variant = dropper.partition("@")
    config = pipeline_config(spec, dropper=name, providers="cpu")
    if variant == "profile":
        knobs = dataclasses.replace(config.pard, adapt_durations=False)
        config = dataclasses.replace(config, pard=knobs)
    elif variant:
        raise SystemExit(f"--droppers: unknown variant {variant!r} in {dropper!r} (profile)")
    ex = PipelineExecutor(config)
    slo_s = config.slo_ms / 1000.0
    per_s = [0] * (int(seconds) + 1)
    outcome = {"on_time": 0, "late": 0, "dropped": 0, "failed": 0}

    async def one(i: int, t_arrival: float, start: float) -> None:
        try:
            await ex.execute(json.dumps({"image_seed": i}).encode())
        except TaskDropped:
            outcome["dropped"] += 1
            return
        except ExecutorError:
            outcome["failed"] += 1
            return
        done = time.perf_counter() - start
        if done - t_arrival <= slo_s:
            outcome["on_time"] += 1
            per_s[min(int(done), len(per_s) - 1)] += 1
        else:
            outcome["late"] += 1

    try:
        await ex.execute(b"{}")  # sessions loaded and warm before the clock starts
        start = time.perf_counter()
        tasks = []
        for i, t in enumerate(arrivals_s):
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, t, start)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        snap = ex.snapshot()
    finally:
        await ex.close()
    total = len(arrivals_s)
    return {
        "dropper": dropper,
        "requests": total,
        "goodput_rps": outcome["on_time"] / seconds,
        "drop_rate": (outcome["dropped"] + outcome["late"] + outcome["failed"]) / total,
        "invalid_rate": snap["invalid_rate"],
        "drops_by_module": snap["drops_by_module"],
        "per_second": per_s[: int(seconds)],
        "wall_s": wall,
        **outcome,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m loadtests.pard_live", description=__doc__)
    p.add_argument("--pipeline", default="traffic")
    p.add_argument("--trace", default="bursty", choices=["periodic", "bursty", "spiky"])
    p.add_argument("--rate", type=float, default=120.0, help="mean requests per second")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--droppers", default="pard,nexus,clipper++,none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="pard-live")
    args = p.parse_args(argv)
    if args.rate <= 0 or args.seconds < 5:
        p.error("--rate must be > 0 and --seconds >= 5")
    trace = make_trace(args.trace, args.seconds, args.rate, seed=args.seed)
    droppers = [d.strip() for d in args.droppers.split(",") if d.strip()]
    results = []
    for d in droppers:
        r = asyncio.run(run_policy(args.pipeline, d, trace.arrivals_s.tolist(), args.seconds))
        results.append(r)
        print(
            f"{d:10} goodput {r['goodput_rps']:6.1f} req/s  drop rate {r['drop_rate']:6.1%}  "
            f"invalid {r['invalid_rate']:6.1%}  drops by module {r['drops_by_module']}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = (
        "| policy | goodput req/s | drop rate | invalid rate | on time | late | dropped "
        "| drops by module |"
    )
    rows = [
        f"| {r['dropper']} | {r['goodput_rps']:.1f} | {r['drop_rate']:.1%} | "
        f"{r['invalid_rate']:.1%} | {r['on_time']} | {r['late']} | {r['dropped']} | "
        f"{r['drops_by_module']} |"
        for r in results
    ]
    md = (
        f"# PARD live: {args.pipeline}, {args.trace} trace\n\n"
        f"{len(trace)} requests in {args.seconds:g} s (mean {args.rate:g} req/s), real "
        "onnxruntime inference on this machine (CPU), budget = the pipeline's SLO.\n\n"
        + "\n".join([header, "|---|---|---|---|---|---|---|---|", *rows])
        + "\n"
    )
    (out / "pard-live.md").write_text(md, encoding="utf-8")
    with (out / "goodput_over_time.csv").open("w", encoding="utf-8") as f:
        f.write("second," + ",".join(r["dropper"] for r in results) + ",offered\n")
        offered = trace.counts()
        for s in range(int(args.seconds)):
            row = [str(r["per_second"][s]) for r in results]
            f.write(f"{s}," + ",".join(row) + f",{int(offered[s]) if s < len(offered) else 0}\n")
    from loadtests.sim import plots

    series = {
        r["dropper"]: [(float(s), float(v)) for s, v in enumerate(r["per_second"])] for r in results
    }
    series["offered"] = [(float(s), float(v)) for s, v in enumerate(trace.counts())]
    plots.line_panels(
        out / "goodput_over_time.png",
        {f"{args.pipeline}, {args.trace}": series},
        title="Goodput (within SLO) per second, live",
        xlabel="time (s)",
        ylabel="requests / s",
        ncols=1,
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
