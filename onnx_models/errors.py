"""The exceptions of `onnx_models`.

Errors::

    Exception
     └── OnnxModelsError          base of everything this package raises on bad input
          ├── PipelineSpecError   (also a ValueError) a pipeline spec file is invalid; the
          │                       message names the file, the module and the field
          ├── ProfileError        profiling failed (provider unavailable, onnxruntime error)
          │                       or a profile file is invalid or does not fit its pipeline
          └── ExportError         a model could not be exported or checked

onnxruntime's own exceptions are translated to these at the boundary (`raise … from exc`).
"""

from __future__ import annotations

__all__ = ["ExportError", "OnnxModelsError", "PipelineSpecError", "ProfileError"]


class OnnxModelsError(Exception):
    """Base of the errors raised by `onnx_models`."""


class PipelineSpecError(OnnxModelsError, ValueError):
    """A pipeline spec is invalid; the message names the module and the field."""


class ProfileError(OnnxModelsError):
    """Profiling failed, or a profile file is invalid or stale for its pipeline."""


class ExportError(OnnxModelsError):
    """A model could not be exported, or the exported files could not be compared."""
