"""`python -m loadtests.saas`: drive a running gateway (`run`), or find each policy's highest
passing rate (`maxrate`, loadtests.saas_maxrate).

The driver itself is `loadtests.saas`; this module only parses the command line, so the
driver and the max-rate search import nothing of each other's entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from loadtests.saas import GatewayClassesError, drive, format_report
from loadtests.saas_maxrate import Search, Testbed, find_max_rates
from loadtests.saas_search import RateBisection
from taskserver.queues import QueuePolicy

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadtests.saas`."""
    p = argparse.ArgumentParser(
        prog="python -m loadtests.saas",
        description="Sensing-as-a-Service load: drive a gateway, or find max rates",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="drive a running gateway at one rate")
    run.add_argument("--gateway", default="http://127.0.0.1:8080")
    run.add_argument("--agents", type=int, default=32, help="agents behind it (for utilisation)")
    mx = sub.add_parser(
        "maxrate",
        help="per policy and seed, start the dense testbed and bisect the highest passing rate",
    )
    mx.add_argument("--policies", default="fifo,priq,t-edfq,tf-edfq")
    mx.add_argument(
        "--seeds",
        default="1,2,3",
        help="seeds: each picks the query mix, arrivals and agents' profile draws (1,2,3)",
    )
    mx.add_argument("--agents", type=int, default=32)
    mx.add_argument(
        "--agents-per-process", type=int, default=8, help="emulated agents per process (8)"
    )
    mx.add_argument(
        "--read-sample",
        type=float,
        default=0.05,
        help="share of range tasks that read the store; the rest sleep their draw (0.05)",
    )
    mx.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run the testbed this many times slower; rates are reported unscaled (1)",
    )
    mx.add_argument("--low", type=float, default=4.0, help="lowest rate probed, q/s (4)")
    mx.add_argument("--high", type=float, default=64.0, help="highest rate probed, q/s (64)")
    mx.add_argument("--resolution", type=float, default=1.0, help="stop within this, q/s (1)")
    mx.add_argument("--max-probes", type=int, default=8, help="probes per policy and seed (8)")
    mx.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    for q in (run, mx):
        q.add_argument("--duration", type=float, default=60.0, help="measured seconds per rate")
        q.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds first")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--rate", type=float, required=True, help="queries per second")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0:
        p.error("--duration must be > 0 and --warmup >= 0")
    if args.cmd == "run":
        if not args.rate > 0:
            p.error("--rate must be > 0")
        try:
            r = asyncio.run(
                drive(args.gateway, args.rate, args.duration, seed=args.seed, warmup_s=args.warmup)
            )
        except GatewayClassesError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(format_report(r, args.agents))
        print(json.dumps(r.to_json(args.agents)))
        return 0
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        p.error(f"--seeds: not a comma-separated list of integers: {args.seeds!r}")
    if not seeds or not all(1 <= s <= 1_000_000 for s in seeds) or len(set(seeds)) != len(seeds):
        p.error(f"--seeds: need distinct seeds in 1..1000000, got {args.seeds!r}")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    try:
        for policy in policies:
            QueuePolicy.parse(policy, "--policies")
        testbed = Testbed(args.agents, args.agents_per_process, args.read_sample, args.time_scale)
        search = Search(
            args.low, args.high, args.resolution, args.max_probes, args.duration, args.warmup
        )
        RateBisection(search.low, search.high, search.resolution, search.max_probes)
    except ValueError as exc:
        p.error(str(exc))
    if not policies:
        p.error("--policies: need at least one policy")
    return find_max_rates(policies, seeds, testbed, search, args.json)


if __name__ == "__main__":
    sys.exit(main())
