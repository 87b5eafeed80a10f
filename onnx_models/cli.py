"""The ``profile`` command: measure a pipeline's d_k(b) and write its profile file.

``profile PIPELINE [--batch-sizes 1,2,4] [--warmup N] [--repeats N] [--rounds N]
[--out FILE] [--provider cpu|cuda|auto] [--threads N]``: PIPELINE is a spec file or the
name of a shipped pipeline (traffic, live, ga, dag, dag_dynamic). It prints a table of
module x batch size and writes the profile to ``--out`` (default: ``<pipeline>.profile.json``
in the current directory, so the profiles shipped beside the specs stay as they are) and
prints where.
A missing onnxruntime, a missing file, an invalid spec or an unavailable provider is
reported in one line on stderr, exit status 2.

`add_parser(subparsers)` registers the command under a parent CLI; ``python -m onnx_models``
runs it on its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_parser", "cmd_profile", "format_table", "main"]

# Imports of onnxruntime and numpy sit inside the handler: registering the command must stay
# cheap for a parent CLI that also runs on small devices.


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    return sorted(set(sizes))


def _integer(minimum: int) -> Any:
    """An argparse type: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``profile`` on an argparse subparsers object; return its parser."""
    p = subparsers.add_parser(
        "profile",
        help="measure each module's batch durations d_k(b) of an ONNX pipeline",
        description="Measure each module's execution duration d_k(b) at each batch size with "
        "onnxruntime, print a table and write the profile file (default: "
        "PIPELINE.profile.json in the current directory; a runtime reads it with --profile).",
    )
    p.add_argument("pipeline", help="pipeline spec file (.json/.toml) or shipped name")
    p.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        help="comma-separated batch sizes for every module (default: each module's own)",
    )
    p.add_argument("--warmup", type=_integer(0), default=10, help="untimed runs first (10)")
    p.add_argument("--repeats", type=_integer(1), default=50, help="timed runs per size (50)")
    p.add_argument(
        "--rounds",
        type=_integer(1),
        default=5,
        help="interleaved passes the repeats are split into, against bursts of load (5)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="profile file to write (default: PIPELINE.profile.json in the current directory)",
    )
    p.add_argument(
        "--provider",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="execution provider: cuda when available (auto), or force one",
    )
    p.add_argument(
        "--threads",
        type=_integer(1),
        default=1,
        help="intra-op threads, as the serving session uses (1: one worker per core)",
    )
    p.add_argument(
        "--neighbours",
        type=_integer(0),
        default=0,
        help="CPU only: processes that run the pipeline's modules beside the timed session "
        "for the whole measurement, as the other workers of a scaled-out pipeline share the "
        "host (0: a quiet host)",
    )
    p.set_defaults(func=cmd_profile)
    return p


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile the pipeline, print the table and write the file; 2 on a bad input."""
    from onnx_models.errors import OnnxModelsError
    from onnx_models.profile import profile_pipeline
    from onnx_models.spec import load_pipeline, pipeline_path, shipped_pipelines
    from taskserver.extras import needs

    problem = needs("tailgate profile", "onnxruntime")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    path = pipeline_path(args.pipeline)
    if not path.exists():
        shipped = ", ".join(shipped_pipelines())
        print(
            f"profile: no spec file {args.pipeline!r} and no shipped pipeline of that name "
            f"(shipped: {shipped})",
            file=sys.stderr,
        )
        return 2
    try:
        spec = load_pipeline(path)
        # Never beside the spec by default: that is where the shipped profiles live.
        out = args.out or Path.cwd() / f"{spec.name}.profile.json"
        if not out.parent.is_dir():
            print(f"profile: --out: folder {out.parent} does not exist", file=sys.stderr)
            return 2
        profile = profile_pipeline(
            spec,
            batch_sizes=args.batch_sizes,
            warmup=args.warmup,
            repeats=args.repeats,
            providers=args.provider,
            intra_op_threads=args.threads,
            rounds=args.rounds,
            neighbours=args.neighbours,
            progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
        )
        profile.write(out)
    except OnnxModelsError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"profile: cannot write the profile: {exc}", file=sys.stderr)
        return 2
    format_table(profile, sys.stdout)
    print(f"wrote {out.resolve()}")
    return 0


def format_table(profile: Any, out: TextIO) -> None:
    """Print module x batch size: median and p95 ms, requests/s, batching gain and efficiency.

    gain(b) = throughput(b) / throughput(1) = b·d(1)/d(b): how many times more requests/s a
    batch of b serves than batch 1 (1 = batching buys nothing, b = a batch costs as little
    as one request). eff(b) = gain(b)/b = throughput(b) / (b·throughput(1)) = d(1)/d(b).
    """
    env = profile.environment
    threads = f"{env.intra_op_threads} intra-op thread{'s' if env.intra_op_threads != 1 else ''}"
    print(
        f"{profile.pipeline}: {env.provider} on {env.device}, {threads}, "
        f"onnxruntime {env.onnxruntime}; median and p95 of {profile.repeats} runs "
        f"({profile.rounds} interleaved rounds) after {profile.warmup} warm-up",
        file=out,
    )
    neighbours = getattr(profile, "neighbours", 0)
    if neighbours:
        print(
            f"timed beside {neighbours} busy neighbour{'s' if neighbours != 1 else ''} "
            "(processes running the pipeline's modules: the host as a scaled-out pipeline "
            "shares it)",
            file=out,
        )
    if profile.cpu_share is not None:
        advice = (
            "(below ~90%: the neighbours left it short of a core)"
            if neighbours
            else "(below ~90%: other work competed for the cores; profile again on a quiet host)"
        )
        print(f"the profiler had {profile.cpu_share:.0%} of its threads' time {advice}", file=out)
    columns = ("batch", 5), ("p50 ms", 9), ("p95 ms", 9), ("req/s", 9), ("gain", 6), ("eff", 5)
    header = f"{'module':<28} " + " ".join(f"{name:>{width}}" for name, width in columns)
    print(header, file=out)
    print("-" * len(header), file=out)
    for m in profile.modules:
        base = next((t for t in m.timings if t.batch == 1), None)
        for i, t in enumerate(m.timings):
            label = f"{m.name} ({m.id})" if i == 0 else ""
            rate = t.batch * 1000.0 / t.median_ms
            if base is not None:
                gain = t.batch * base.median_ms / t.median_ms
                extra = f"{gain:6.2f} {gain / t.batch:5.2f}"
            else:
                extra = f"{'-':>6} {'-':>5}"
            timing = f"{t.batch:>5} {t.median_ms:>9.3f} {t.p95_ms:>9.3f} {rate:>9.1f}"
            print(f"{label:<28} {timing} {extra}", file=out)
    print(
        "gain = throughput(b)/throughput(1) = b·d(1)/d(b); eff = gain/b = d(1)/d(b) "
        "(1.00: a batch of b costs one request's time)",
        file=out,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m onnx_models profile …``."""
    parser = argparse.ArgumentParser(prog="python -m onnx_models")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))
