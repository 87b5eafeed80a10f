"""Benchmark of the x_p^u solver: CdfBook.solve and DeadlineEstimator.plan latencies.

Run on purpose, not in CI: ``python -m loadtests.bench_solve [--repeats N]``. It builds a
book of servers that each own a distinct CDF (lognormal priors with varied parameters), then
times solve() for fresh random server choices per call (no cache can help) and plan() for a
repeated composition (the cache-hit path). The product target is p50 <= 100 us at k_f = 1000.

``--against DIR`` compares this solver with another checkout's (DIR/gateway/cdf.py, e.g. a
``git worktree`` of an earlier commit): the same book built in both, the same picks solved
by each in turn, alternating which goes first, so a machine whose speed drifts slows both
alike; it prints both p50/p99, their ratio and the largest relative difference of x_p^u.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from gateway.cdf import CdfBook
from gateway.deadlines import DeadlineEstimator


def build_book(
    n_servers: int,
    samples: int,
    rng: np.random.Generator,
    book_type: type = CdfBook,
    ids: Sequence[str] | None = None,
) -> CdfBook:
    """A book whose servers each own a distinct lognormal prior (median 0.4-2.7 ms),
    registered under `ids` (these string objects) or srv-0, srv-1, ..."""
    book = book_type(window_size=samples)
    for i in range(n_servers):
        prior_ms = rng.lognormal(rng.uniform(-1.0, 1.0), rng.uniform(0.3, 0.9), samples)
        book.add_server(f"srv-{i}" if ids is None else ids[i], prior_ms)
    return book


def fresh_picks(
    rng: np.random.Generator, ids: Sequence[str], k: int, repeats: int
) -> list[list[str]]:
    """`repeats` choices of k distinct servers each."""
    return [[ids[j] for j in rng.choice(len(ids), k, replace=False)] for _ in range(repeats)]


def time_calls_us(calls: Sequence[Callable[[], object]]) -> np.ndarray:
    """Wall time of each call in microseconds (perf_counter_ns around each)."""
    out = np.empty(len(calls))
    for i, call in enumerate(calls):
        start = time.perf_counter_ns()
        call()
        out[i] = (time.perf_counter_ns() - start) / 1e3
    return out


def report(label: str, us: np.ndarray) -> None:
    """Print p50/p99/mean of a timing sample."""
    p50, p99 = np.percentile(us, [50, 99])
    print(f"{label:<44} p50 {p50:8.1f} us   p99 {p99:8.1f} us   mean {us.mean():8.1f} us")


def load_other_cdf(checkout: str) -> object:
    """Another checkout's gateway.cdf as a module of its own. It imports that checkout's
    built C extension (gateway/_hotpath*.so) where there is one, whose functions may differ
    from ours; its other imports are ours."""
    path = Path(checkout) / "gateway" / "cdf.py"
    if not path.is_file():
        raise SystemExit(f"--against: no {path}")
    spec = importlib.util.spec_from_file_location("_other_cdf", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    built = sorted(path.parent.glob("_hotpath*.so"))
    ours = sys.modules.get("gateway._hotpath")
    if built:
        ext = importlib.util.spec_from_file_location("gateway._hotpath", built[0])
        if ext is None or ext.loader is None:
            raise SystemExit(f"--against: cannot load {built[0]}")
        sys.modules["gateway._hotpath"] = importlib.util.module_from_spec(ext)
    try:
        spec.loader.exec_module(module)
    finally:
        if ours is not None:
            sys.modules["gateway._hotpath"] = ours
        else:
            sys.modules.pop("gateway._hotpath", None)
    return module


def compare(args: argparse.Namespace, fanouts: Sequence[int]) -> None:
    """Solve the same picks with this checkout's book and another's, alternating."""
    other = load_other_cdf(args.against)
    books = {
        side: build_book(
            args.servers,
            args.samples,
            np.random.default_rng(args.seed),  # the same priors in both books
            CdfBook if module is None else module.CdfBook,  # type: ignore[attr-defined]
        )
        for side, module in (("this", None), ("other", other))
    }
    ids = [f"srv-{i}" for i in range(args.servers)]
    rng = np.random.default_rng(args.seed + 1)
    p = args.percentile
    for k in fanouts:
        if k > args.servers:
            continue
        picks = fresh_picks(rng, ids, k, args.repeats)
        for chosen in picks[:50]:  # warm-up
            for book in books.values():
                book.solve(chosen, p)
        times: dict[str, list[float]] = {"this": [], "other": []}
        worst = 0.0
        for i, chosen in enumerate(picks):
            x = {}
            for side in ("this", "other") if i % 2 else ("other", "this"):
                start = time.perf_counter_ns()
                x[side] = books[side].solve(chosen, p).unloaded_ms
                times[side].append((time.perf_counter_ns() - start) / 1e3)
            worst = max(worst, abs(x["this"] - x["other"]) / x["other"])
        this50, this99 = np.percentile(times["this"], [50, 99])
        other50, other99 = np.percentile(times["other"], [50, 99])
        print(
            f"k={k:<5} this p50 {this50:7.1f} us p99 {this99:7.1f} us | other p50 "
            f"{other50:7.1f} us p99 {other99:7.1f} us | this / other p50 "
            f"{this50 / other50:.2f} | largest relative difference of x {worst:.1e}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Build the book, time the solver and the estimator, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000, help="servers, each its own CDF")
    parser.add_argument("--samples", type=int, default=4096, help="prior samples per server")
    parser.add_argument("--repeats", type=int, default=2000, help="timed calls per figure")
    parser.add_argument("--fanouts", default="1,10,100,1000", help="comma-separated k_f")
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="compare solve() with another checkout's, call by call (module docstring)",
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    fanouts = [int(k) for k in args.fanouts.split(",")]
    if args.against:
        compare(args, fanouts)
        return

    start = time.perf_counter()
    registered = [f"srv-{i}" for i in range(args.servers)]
    book = build_book(args.servers, args.samples, rng, ids=registered)
    print(
        f"built {args.servers} servers x {args.samples} samples in "
        f"{time.perf_counter() - start:.2f} s"
    )
    ids = [f"srv-{i}" for i in range(args.servers)]
    p = args.percentile

    # `ids` are equal strings, not the objects registered: the book's index compares each by
    # its bytes. A gateway's links pass the very strings they registered
    # (gateway.server_registry), which the index matches by identity: timed second.
    for pool, what in ((ids, "fresh servers each call"), (registered, "the same, registered ids")):
        for k in fanouts:
            if k > args.servers:
                continue
            picks = fresh_picks(rng, pool, k, args.repeats)
            for chosen in picks[:50]:  # warm-up
                book.solve(chosen, p)
            us = time_calls_us([partial(book.solve, chosen, p) for chosen in picks])
            report(f"solve x_{p:g}^u  k={k} ({what})", us)

    for k in fanouts:
        if k > args.servers:
            continue
        chosen = [ids[j] for j in rng.choice(args.servers, k, replace=False)]
        estimator = DeadlineEstimator(book)
        estimator.plan(chosen, p, 1e6)
        us = time_calls_us([partial(estimator.plan, chosen, p, 1e6)] * args.repeats)
        report(f"plan (cache hit)          k={k}", us)
        assert estimator.cache_hits == args.repeats

    for k in fanouts:
        if k > args.servers:
            continue
        picks = fresh_picks(rng, ids, k, args.repeats)
        # No cache: every call pays composition_key + solve (k = all servers would hit).
        estimator = DeadlineEstimator(book, cache_size=0)
        us = time_calls_us([partial(estimator.plan, chosen, p, 1e6) for chosen in picks])
        report(f"plan (cache miss)         k={k}", us)
        assert estimator.cache_misses == args.repeats

    n_obs = 64 * args.repeats
    values = rng.lognormal(0.0, 0.6, n_obs).tolist()
    targets = [ids[j] for j in rng.integers(0, args.servers, n_obs)]
    start = time.perf_counter_ns()
    for server_id, value in zip(targets, values, strict=True):
        book.observe(server_id, value)
    per_obs_us = (time.perf_counter_ns() - start) / 1e3 / n_obs
    print(f"{'observe (amortised, incl. snapshot refresh)':<44} mean {per_obs_us:8.2f} us")


if __name__ == "__main__":
    main()
