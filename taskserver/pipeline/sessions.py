"""Model runners: one onnxruntime InferenceSession per module, behind a small protocol.

onnxruntime is imported when a session is built, not when this module is imported, so a
config can be checked (and a test can run fake runners) without it. Its errors become
PipelineConfigError while loading and InferenceFailed while running.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from taskserver.pipeline.config import ModuleConfig
from taskserver.pipeline.errors import InferenceFailed, PipelineConfigError

__all__ = [
    "CPU",
    "CUDA",
    "PROCESS_MIN_CPUS",
    "ModelRunner",
    "OnnxModel",
    "default_intra_op_threads",
    "resolve_providers",
    "resolve_worker_mode",
    "usable_cpus",
]

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
PROCESS_MIN_CPUS = 4
"""Usable CPUs from which ``worker_mode = "auto"`` runs CPU workers in their own processes."""

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}


@runtime_checkable
class ModelRunner(Protocol):
    """What a module worker needs of a model: one input, one output, a batch axis first."""

    provider: str  # the execution provider actually used
    input_shape: tuple[int, ...]  # without the batch axis
    input_dtype: np.dtype
    output_name: str

    def run(self, batch: np.ndarray) -> np.ndarray:
        """The model's output for `batch` (shape ``(n, *input_shape)``); thread-safe."""
        ...


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_intra_op_threads(modules: int) -> int:
    """Usable CPUs shared among the modules, at least 1 each (modules run concurrently)."""
    return max(1, usable_cpus() // max(1, modules))


def resolve_providers(choice: str) -> list[str]:
    """onnxruntime providers for ``auto``, ``cpu`` or ``cuda``."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if choice == "cpu":
        return [CPU]
    if choice == "cuda" and CUDA not in available:
        raise PipelineConfigError(
            f"pipeline providers: 'cuda' but onnxruntime {ort.__version__} has only "
            f"{', '.join(available)} (install onnxruntime-gpu)"
        )
    if choice in ("auto", "cuda") and CUDA in available:
        return [CUDA, CPU]
    return [CPU]


def resolve_worker_mode(mode: str, providers: Sequence[str], cpus: int) -> str:
    """``process`` or ``thread`` for a configured `mode` (``auto``, ``process``, ``thread``).

    ``auto``: thread when the first provider is CUDA, since onnxruntime CUDA sessions in
    several processes on one GPU each hold their own CUDA context and memory arena (hundreds
    of MB each, times workers and feasible batch sizes) and time-share the GPU without MPS,
    while the GPU's kernels run outside the GIL anyway; else process from
    ``PROCESS_MIN_CPUS`` usable CPUs, where workers in one process contend for its GIL
    (PARD gives each worker its own container, §4.1, §5.1), and thread on smaller hosts,
    where a child per worker adds memory and a hop per batch for cores that are not there.
    """
    if mode in ("process", "thread"):
        return mode
    if mode != "auto":
        raise PipelineConfigError(
            f"pipeline worker_mode: must be auto, process or thread, got {mode!r}"
        )
    if providers and providers[0] == CUDA:
        return "thread"
    return "process" if cpus >= PROCESS_MIN_CPUS else "thread"


class OnnxModel:
    """One module's InferenceSession: its single input and its first output."""

    def __init__(
        self,
        module: ModuleConfig,
        providers: Sequence[str],
        *,
        intra_op_threads: int = 1,
        allow_spinning: bool = False,
    ) -> None:
        import onnxruntime as ort

        self.module = module
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        # Modules run concurrently on shared cores: an idle pool that spins steals them from
        # the module that is running (measured in loadtests/bench_pipeline.py).
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if allow_spinning else "0"
        )

        def load() -> Any:
            try:
                return ort.InferenceSession(
                    str(module.model), sess_options=options, providers=list(providers)
                )
            except Exception as exc:  # onnxruntime raises its own pybind types: translate all
                raise PipelineConfigError(
                    f"module {module.label} model: cannot load {module.model}: {exc}"
                ) from exc

        self._session: Any = load()
        self.provider: str = self._session.get_providers()[0]
        # On CUDA, one session per feasible batch size, each always run with one shape.
        # onnxruntime's CUDA convolutions keep the set-up of the last input shape only: a
        # session that sees batch 32 and then batch 1 sets up again, 60-540 ms per module
        # on an H200 (cuDNN's exhaustive algorithm search; 15-230 ms with the heuristic
        # one) where the run itself takes 0.3-2 ms. So a module that batches dynamically
        # paid that on most batches. A short batch is padded to the next feasible size
        # (a few hundred µs more on a GPU, where batch 32 costs ~2-6x batch 1), as fixed
        # batch shapes are served on GPUs elsewhere. The CPU provider sets up per run at
        # no such cost, so it keeps one session and runs batches at their own size.
        self._by_size: dict[int, Any] = {}
        if self.provider == CUDA:
            sizes = module.batch_sizes
            self._by_size = {size: load() for size in sizes[1:]}
            self._by_size[sizes[0]] = self._session
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise PipelineConfigError(
                f"module {module.label} model: needs exactly one input, has {names}"
            )
        (inp,) = inputs
        self.input_name: str = inp.name
        self.input_dtype = np.dtype(module.input_dtype or _DTYPES.get(inp.type, "float32"))
        if module.input_shape is not None:
            self.input_shape: tuple[int, ...] = module.input_shape
        else:
            dims = inp.shape[1:]
            if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
                raise PipelineConfigError(
                    f"module {module.label} input_shape: the model's input {inp.name!r} has "
                    f"shape {inp.shape}; give input_shape (without the batch axis)"
                )
            self.input_shape = tuple(dims)
        self.output_name: str = self._session.get_outputs()[0].name

    def warm_up(self) -> float:
        """Run the session once per batch size it will see; the seconds it took.

        The first run of a shape pays the provider's lazy set-up: on CUDA, memory arenas
        and cuDNN's algorithm search, 0.5 s for object detection's first batch on an H200
        where a warm batch takes 0.4 ms. Paid by a request, that is a drop (PARD sees a
        module 1,000x slower than its profile) and a duration scale learnt from an outlier.
        So a server pays it before it takes tasks, as Triton's model warm-up does: on
        CUDA every feasible batch size (each its own kernels), on the CPU the smallest.
        """
        sizes = self.module.batch_sizes if self.provider == CUDA else self.module.batch_sizes[:1]
        start = time.perf_counter()
        for size in sizes:
            self.run(np.zeros((size, *self.input_shape), dtype=self.input_dtype))
        return time.perf_counter() - start

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch; InferenceFailed on any onnxruntime error."""
        n = len(batch)
        session = self._session
        if self._by_size:
            size = next((b for b in self.module.batch_sizes if b >= n), None)
            if size is not None:  # beyond the largest feasible size: the first session
                session = self._by_size[size]
                if size > n:
                    pad = np.zeros((size - n, *batch.shape[1:]), dtype=batch.dtype)
                    batch = np.concatenate([batch, pad])
        try:
            return session.run([self.output_name], {self.input_name: batch})[0][:n]
        except Exception as exc:  # onnxruntime's pybind errors: translate at the boundary
            raise InferenceFailed(f"module {self.module.label}: inference failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"OnnxModel({self.module.label}, provider={self.provider!r})"
