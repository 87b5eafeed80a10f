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
from loadtests.saas_maxrate import find_max_rates

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
    mx = sub.add_parser("maxrate", help="start up per policy and find the highest passing rate")
    mx.add_argument("--rates", default="2,4,6,8,10,12,14,16,20,24")
    mx.add_argument("--policies", default="fifo,priq,t-edfq,tf-edfq")
    mx.add_argument("--agents", type=int, default=32)
    mx.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    for q in (run, mx):
        q.add_argument("--duration", type=float, default=60.0, help="measured seconds per rate")
        q.add_argument("--warmup", type=float, default=10.0, help="unmeasured seconds first")
        q.add_argument("--seed", type=int, default=1)
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
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--rates: not a comma-separated list of numbers: {args.rates!r}")
    if not rates or any(r <= 0 for r in rates):
        p.error("--rates: need rates > 0")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    return find_max_rates(policies, sorted(rates), args)


if __name__ == "__main__":
    sys.exit(main())
