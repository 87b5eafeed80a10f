"""Benchmark: what splitting a pipeline across two task servers costs per request.

Run on purpose, not in CI: ``python -m loadtests.bench_stages [--pipeline traffic]
[--split 2] [--requests 200] [--providers cpu]``. Two task servers in one event loop, on
loopback, speak the real wire to each other: the first runs the modules before ``--split``,
the second the rest. The same sequential requests (one at a time, so no batching or
queueing mixes in) run through the whole pipeline in one executor and through the two
stages; the difference of the latencies is the hand-off: the box of the frame the later
modules read encoded into a task payload, a loopback round trip over Thrift, the payload
parsed by the next stage. The cost of encoding and parsing a hand-off payload alone is
timed apart.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence

import numpy as np

from onnx_models.pipeline_config import pipeline_config
from taskserver.config import TaskServerConfig
from taskserver.pipeline import PipelineExecutor, parse_payload
from taskserver.pipeline.tensors import handoff_payload
from taskserver.server import build_service


async def _latencies(ex: PipelineExecutor, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        await ex.execute(json.dumps({"image_seed": i % 16, "budget_ms": 60_000}).encode())
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def _summary(ms: list[float]) -> str:
    q = np.percentile(ms, [50, 99])
    return f"mean {statistics.fmean(ms):7.2f} ms  p50 {q[0]:7.2f} ms  p99 {q[1]:7.2f} ms"


async def run(pipeline: str, split: str, n: int, providers: str) -> None:
    """Measure whole vs split latency and the hand-off payload's own cost."""
    # One intra-op thread per session everywhere: a stage with fewer modules would otherwise
    # give each more threads, and the comparison would measure that, not the hand-off.
    base = dataclasses.replace(pipeline_config(pipeline, providers=providers), intra_op_threads=1)
    ids = [m.id for m in base.modules]
    if split not in ids[1:]:
        raise SystemExit(f"--split: need a module id of {ids[1:]}, got {split!r}")
    head_ids, tail_ids = ids[: ids.index(split)], ids[ids.index(split) :]
    exits = {s for m in base.modules if m.id in head_ids for s in m.subs if s in tail_ids}
    whole = PipelineExecutor(base)
    tail = PipelineExecutor(dataclasses.replace(base, local=tuple(tail_ids)))
    service = build_service(TaskServerConfig(server_id="tail", slots=256), None, tail)
    server = await asyncio.get_running_loop().create_server(
        service.protocol_factory, "127.0.0.1", 0
    )
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    head = PipelineExecutor(
        dataclasses.replace(base, local=tuple(head_ids), peers=dict.fromkeys(exits, address))
    )
    try:
        await _latencies(whole, 10)  # warm-up: sessions, threads, the connection
        await _latencies(head, 10)
        one = await _latencies(whole, n)
        two = await _latencies(head, n)
    finally:
        await head.close()
        await whole.close()
        server.close()
        await service.close()
    frame = np.random.default_rng(0).random(base.source.input_shape, dtype=np.float32)
    reps = 200
    start = time.perf_counter()
    for _ in range(reps):
        raw = handoff_payload(frame, {split: (0.1, 0.1, 0.6, 0.7)}, 100.0, 3)
    encode_ms = (time.perf_counter() - start) * 1000.0 / reps
    start = time.perf_counter()
    for _ in range(reps):
        parse_payload(raw)
    parse_ms = (time.perf_counter() - start) * 1000.0 / reps
    print(f"pipeline {pipeline}: stage 1 = modules {head_ids}, stage 2 = modules {tail_ids}")
    print(f"  one process   {_summary(one)}")
    print(f"  two stages    {_summary(two)}")
    extra = statistics.median(two) - statistics.median(one)
    print(f"  hand-off: +{extra:.2f} ms per request at the median")
    print(
        f"  hand-off payload of a {list(frame.shape)} float32 frame "
        f"({frame.nbytes / 1024:.0f} KiB) entering a region of 50% x 60% of it: "
        f"{len(raw) / 1024:.0f} KiB, encode {encode_ms:.2f} ms, parse {parse_ms:.2f} ms"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", default="traffic")
    p.add_argument("--split", default="2", help="first module id of the second stage")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--providers", default="cpu", choices=["auto", "cpu", "cuda"])
    args = p.parse_args(argv)
    asyncio.run(run(args.pipeline, args.split, args.requests, args.providers))


if __name__ == "__main__":
    main()
