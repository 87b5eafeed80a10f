"""Benchmark: what running a worker's model in its own process adds to each batch.

Run on purpose, not in CI: ``python -m loadtests.bench_worker_hop [--batches 1000]
[--cases small:1,224:1,224:8,224:32] [--transports shared,pipe]``. A model that does
almost nothing (a mean over each input row: the hop, not the model, is what is timed) runs
in a ProcessRunner child; each batch is built the way a module worker builds it (stacked
straight into the shared input buffer when there is one, else into a new array), then run.
Per batch, the hop is run()'s wall time less the model's own time as the child measured it:
the "run" message, the batch's bytes on the pipe (transport ``pipe``, or shared buffers
when ``shared``), the child's wake-up, the output copied back, the answer and the parent's
wake-up. ``small`` is one 3x32x32 float32 row (12 KB), ``224`` 3x224x224 rows (602 KB each).
The same batches through an in-process OnnxModel give the thread mode's figure for the
stacking and run() call alone, for comparison. Median and p99 over ``--batches`` batches;
figures on a shared or small host are noisy, so the spread is printed with them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from taskserver.pipeline import ModuleConfig, OnnxModel, ProcessRunner
from taskserver.pipeline.sessions import CPU

SHAPES = {"small": (3, 32, 32), "224": (3, 224, 224)}


def mean_model(path: Path, shape: tuple[int, ...]) -> Path:
    """An ONNX model whose output is each input row's mean per channel: (n, C)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    axes = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes")
    node = helper.make_node("ReduceMean", ["image", "axes"], ["means"], keepdims=0)
    graph = helper.make_graph(
        [node],
        "mean",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *shape])],
        [helper.make_tensor_value_info("means", TensorProto.FLOAT, ["batch", shape[0]])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def _stats(us: list[float]) -> str:
    q = np.percentile(us, [50, 99])
    return (
        f"median {q[0]:8.1f} µs  p99 {q[1]:8.1f} µs  mean {statistics.fmean(us):8.1f} µs  "
        f"(n={len(us)}, min {min(us):.1f}, max {max(us):.1f})"
    )


def measure(
    runner: object, rows: list[np.ndarray], batches: int
) -> tuple[list[float], list[float]]:
    """Per batch: (stack + run wall less the model's own time, the model's time), in µs."""
    hop: list[float] = []
    model: list[float] = []
    lend = getattr(runner, "batch_buffer", None)
    for i in range(batches + 10):  # the first 10 warm the path up, not counted
        before = getattr(runner, "exec_ns", None)
        start = time.perf_counter_ns()
        buffer = lend(len(rows)) if lend is not None else None
        batch = np.stack(rows) if buffer is None else np.stack(rows, out=buffer)
        ran = time.perf_counter_ns()
        runner.run(batch)  # type: ignore[attr-defined]
        end = time.perf_counter_ns()
        if before is None:  # in-process: run() is the model, the rest is the stacking
            exec_ns = end - ran
        else:
            exec_ns = runner.exec_ns - before  # type: ignore[attr-defined]
        if i >= 10:
            hop.append((end - start - exec_ns) / 1e3)
            model.append(exec_ns / 1e3)
    return hop, model


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m loadtests.bench_worker_hop", description=__doc__)
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--cases", default="small:1,224:1,224:8,224:32", help="SHAPE:ROWS,...")
    p.add_argument("--transports", default="shared,pipe")
    args = p.parse_args(argv)
    if args.batches < 1:
        p.error(f"--batches: need >= 1, got {args.batches}")
    cases = []
    for item in args.cases.split(","):
        name, _, rows = item.partition(":")
        if name not in SHAPES or not rows.isdigit() or int(rows) < 1:
            p.error(f"--cases: need SHAPE:ROWS with SHAPE in {sorted(SHAPES)}, got {item!r}")
        cases.append((name, int(rows)))
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, n in cases:
            shape = SHAPES[name]
            model = mean_model(Path(tmp) / f"{name}.onnx", shape)
            module = ModuleConfig("1", f"mean_{name}", model, batch_sizes=(1, 2, 4, 8, 16, 32))
            rows = [rng.random(shape, dtype=np.float32) for _ in range(n)]
            mb = n * np.prod(shape) * 4 / 1e6
            print(f"== {name} x {n} ({mb:.2f} MB a batch), {args.batches} batches")
            local = OnnxModel(module, [CPU], intra_op_threads=1)
            hop, ran = measure(local, rows, args.batches)
            print(f"  thread   stack + call  {_stats(hop)}")
            print(f"           model         {_stats(ran)}")
            for transport in transports:
                runner = ProcessRunner(module, [CPU], intra_op_threads=1, transport=transport)
                try:
                    hop, ran = measure(runner, rows, args.batches)
                finally:
                    runner.close()
                print(f"  {transport:<8} stack + hop   {_stats(hop)}")
                print(f"           model         {_stats(ran)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
