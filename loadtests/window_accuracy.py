"""How far a server's online CDF window puts x_p^u from its law's, by window size.

Run on purpose, not in CI: ``python -m loadtests.window_accuracy [--windows 512,1024,...]
[--fanouts 1,10,100,1000] [--seeds 40] [--apps masstree,shore,xapian]``.

A busy server's CDF row holds its window of post-queuing times (``cdf_window`` samples, in
float32), the sorted copy its snapshot shares, and its slot on the solver's grid (17 KiB):
the window's size is most of what a server that takes traffic costs the gateway. This asks
what a smaller window costs in deadline accuracy. For each Tailbench table (the simulator's
law: its quantiles and exponential tail, `taskserver.service_time.QuantileFileServiceTime`),
each seed draws samples with the simulator's own sampler; a window of the last n of them
becomes the snapshot a `CdfBook` row makes once its prior has left the window
(`LatencyCdf.from_samples`: the empirical body, a GPD over the top `tail_fraction`), stored
as the book stores them (float32). For k_f servers of that law, x_p^u is F^-1((p/100)^(1/k))
(TailGuard eq. (2), homogeneous); printed are the window's error against the law's own
x_p^u over the seeds: the median and 90th percentile of |relative error|, and the median
signed error (a bias).

What it is not: the windows are i.i.d. draws of a fixed law, so it measures the estimator's
sampling error alone, not how fast a window follows a law that changes (a smaller window
follows sooner).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import numpy as np

from gateway.cdf import COARSE_CELLS, FINE_STEPS, SAMPLE_DTYPE, LatencyCdf
from gateway.table_cdf import prior_of
from loadtests.sim.tailbench import APPS, table_path
from taskserver.service_time import QuantileFileServiceTime

SLOT_BYTES = (COARSE_CELLS + 1 + COARSE_CELLS * (FINE_STEPS + 1)) * 4
"""A row's slot on the solver's grid: its log F at the coarse and fine points, float32."""


def row_bytes(window: int) -> int:
    """What a busy server's row holds in arrays: its window, the sorted copy, its slot."""
    return 2 * window * np.dtype(SAMPLE_DTYPE).itemsize + SLOT_BYTES


def errors(
    app: str,
    windows: Sequence[int],
    fanouts: Sequence[int],
    seeds: int,
    percentile: float = 99.0,
    tail_fraction: float = 0.05,
) -> dict[tuple[int, int], np.ndarray]:
    """(window, k) -> the relative errors of x_p^u over the seeds."""
    dist = QuantileFileServiceTime.from_file(table_path(app))
    law = prior_of(dist)  # the table as the exact law (a TableCdf)
    truth = {k: law.quantile((percentile / 100.0) ** (1.0 / k)) for k in fanouts}
    out: dict[tuple[int, int], list[float]] = {(n, k): [] for n in windows for k in fanouts}
    longest = max(windows)
    for seed in range(seeds):
        rng = random.Random(seed)
        stream = np.array([dist.sample_ms(rng) for _ in range(longest)], dtype=SAMPLE_DTYPE)
        for n in windows:
            cdf = LatencyCdf.from_samples(stream[-n:], tail_fraction)
            for k in fanouts:
                x = cdf.quantile((percentile / 100.0) ** (1.0 / k))
                out[n, k].append(x / truth[k] - 1.0)
    return {key: np.asarray(v) for key, v in out.items()}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse options, run every app, print one table per app."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="512,1024,2048,4096,8192")
    parser.add_argument("--fanouts", default="1,10,100,1000")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--tail-fraction", type=float, default=0.05)
    args = parser.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",")]
        fanouts = [int(k) for k in args.fanouts.split(",")]
    except ValueError:
        parser.error("--windows and --fanouts: comma-separated integers")
    if min(windows) < 100 or min(fanouts) < 1 or args.seeds < 1:
        parser.error("--windows must be >= 100 (as cdf_window), --fanouts and --seeds >= 1")
    if not 0.0 < args.percentile < 100.0:
        parser.error("--percentile must be in (0, 100)")
    apps = args.apps.split(",")
    for app in apps:
        if app not in APPS:
            parser.error(f"--apps: no shipped Tailbench table {app!r} (known: {', '.join(APPS)})")
    print(
        f"x_{args.percentile:g}^u from a window of n i.i.d. samples (float32, GPD over the top "
        f"{args.tail_fraction:g}) against the law's; {args.seeds} seeds a cell; cells: "
        "|error| p50 / p90, median signed error"
    )
    for app in apps:
        errs = errors(app, windows, fanouts, args.seeds, args.percentile, args.tail_fraction)
        print(f"\n{app}")
        print(f"{'window':>7} {'row KiB':>8}  " + "".join(f"{f'k = {k}':>28}" for k in fanouts))
        for n in windows:
            cells = []
            for k in fanouts:
                e = errs[n, k]
                p50, p90 = np.percentile(np.abs(e), [50, 90])
                cells.append(f"{p50:7.1%} / {p90:6.1%}  {np.median(e):+7.1%}")
            print(f"{n:>7} {row_bytes(n) / 1024:8.1f}  " + "".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    main()
