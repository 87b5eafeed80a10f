"""Print an autoscaled pool's state over time, from GET /v1/autoscaler and /v1/servers.

    python -m loadtests.watch_autoscaler --url http://127.0.0.1:8080 --seconds 200

One line every ``--every`` seconds: the pool's offered rate (this gateway's and, with
Swayam, all front ends'), the rate Swayam predicted t_setup ahead, the backends it requires
and uses (n), the servers registered and up, the scaling actions and SLA violations so far;
with ``--jsonl FILE`` each sample is also written as one JSON object. A poll that fails is
reported and retried; the watch never stops the gateway.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from typing import Any

__all__ = ["main", "sample"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2.0) as r:
        return json.loads(r.read())


def sample(url: str, pool: str, t_s: float) -> dict[str, Any]:
    """One row: the autoscaler's and the pool's state now."""
    a = _get(url + "/v1/autoscaler")
    servers = [s for s in _get(url + "/v1/servers")["servers"] if s["pool"] == pool]
    ps = a.get("policy_state") or {}
    last = (ps.get("decisions") or [{}])[-1]
    return {
        "t_s": round(t_s, 1),
        "local_rate_per_s": ps.get("local_rate_per_s"),
        "global_rate_per_s": ps.get("global_rate_per_s"),
        "predicted_per_s": last.get("predicted_rate_per_s"),
        "required": last.get("required"),
        "in_use": ps.get("in_use"),
        "registered": len(servers),
        "up": sum(1 for s in servers if s["state"] == "up"),
        "actions": len(a.get("actions") or []),
        "violations": ps.get("violations"),
    }


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    """Watch until --seconds have passed (or Ctrl-C)."""
    p = argparse.ArgumentParser(prog="python -m loadtests.watch_autoscaler", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway")
    p.add_argument("--pool", default="default", help="the autoscaled pool (default)")
    p.add_argument("--seconds", type=float, default=120.0, help="how long to watch (120)")
    p.add_argument("--every", type=float, default=2.0, help="seconds between samples (2)")
    p.add_argument("--jsonl", help="also write every sample to this file")
    args = p.parse_args(argv)
    if not (args.seconds > 0 and args.every > 0):
        p.error("--seconds and --every must be > 0")
    out = open(args.jsonl, "w", encoding="utf-8") if args.jsonl else None
    keys = ["t_s", "local_rate_per_s", "global_rate_per_s", "predicted_per_s", "required",
            "in_use", "registered", "up", "actions", "violations"]  # fmt: skip
    heads = ["t s", "rate/s", "all FEs/s", "predicted/s", "n_B", "n", "servers", "up",
             "actions", "SLA misses"]  # fmt: skip
    print(" ".join(f"{h:>11}" for h in heads))
    t0 = time.monotonic()
    try:
        while (now := time.monotonic() - t0) < args.seconds:
            try:
                row = sample(args.url.rstrip("/"), args.pool, now)
            except (OSError, ValueError, KeyError) as exc:
                print(f"poll failed: {exc}", file=sys.stderr)
            else:
                print(" ".join(f"{_fmt(row[k]):>11}" for k in keys), flush=True)
                if out is not None:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
            time.sleep(args.every)
    except KeyboardInterrupt:
        pass
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
