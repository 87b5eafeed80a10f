"""Model runners: one onnxruntime InferenceSession per module, behind a small protocol.

onnxruntime is imported when a session is built, not when this module is imported, so a
config can be checked (and a test can run fake runners) without it. Its errors become
PipelineConfigError while loading and InferenceFailed while running.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from taskserver.pipeline.config import ModuleConfig
from taskserver.pipeline.errors import InferenceFailed, PipelineConfigError

__all__ = [
    "CPU",
    "CUDA",
    "ModelRunner",
    "OnnxModel",
    "default_intra_op_threads",
    "resolve_providers",
    "usable_cpus",
]

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

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
        try:
            self._session: Any = ort.InferenceSession(
                str(module.model), sess_options=options, providers=list(providers)
            )
        except Exception as exc:  # onnxruntime raises its own pybind types: translate all
            raise PipelineConfigError(
                f"module {module.label} model: cannot load {module.model}: {exc}"
            ) from exc
        self.provider: str = self._session.get_providers()[0]
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

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch; InferenceFailed on any onnxruntime error."""
        try:
            return self._session.run([self.output_name], {self.input_name: batch})[0]
        except Exception as exc:  # onnxruntime's pybind errors: translate at the boundary
            raise InferenceFailed(f"module {self.module.label}: inference failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"OnnxModel({self.module.label}, provider={self.provider!r})"
