"""ONNX inference pipelines: model definitions, exported models, pipeline specs, profiles.

Layout::

    catalog.py     what each shipped model takes and returns (no torch needed)
    models.py      the PyTorch definitions (``models`` extra)
    export.py      ``python -m onnx_models.export [--out DIR] [--check]``
    models/        the exported ``<model>.onnx`` files
    spec.py        pipeline specs (PARD §5.1): modules with pres/subs, validated as a DAG
    pipelines/     the shipped specs (traffic, live, ga, dag, dag_dynamic) and their profiles
    profile.py     offline profiling of d_k(b) per module and batch size with onnxruntime
    pipeline_config.py  a spec and its profile -> the task server's PipelineConfig
    cli.py         the ``profile`` command

Errors::

    Exception
     └── OnnxModelsError
          ├── PipelineSpecError   (also a ValueError) invalid spec: names module and field
          ├── ProfileError        profiling failed, or a profile file is invalid or stale
          └── ExportError         a model could not be exported or checked

Importing this package loads neither torch nor onnxruntime.
"""

from onnx_models.catalog import CATALOG, ModelCard, model_path
from onnx_models.errors import ExportError, OnnxModelsError, PipelineSpecError, ProfileError
from onnx_models.profile import (
    BatchTiming,
    ModuleProfile,
    Profile,
    ProfileEnvironment,
    default_profile_path,
    load_profile,
    profile_pipeline,
)
from onnx_models.spec import (
    DEFAULT_BATCH_SIZES,
    ModuleConfig,
    PipelineSpec,
    load_pipeline,
    pipeline_path,
    shipped_pipelines,
)

__all__ = [
    "CATALOG",
    "DEFAULT_BATCH_SIZES",
    "BatchTiming",
    "ExportError",
    "ModelCard",
    "ModuleConfig",
    "ModuleProfile",
    "OnnxModelsError",
    "PipelineSpec",
    "PipelineSpecError",
    "Profile",
    "ProfileEnvironment",
    "ProfileError",
    "default_profile_path",
    "load_pipeline",
    "load_profile",
    "model_path",
    "pipeline_path",
    "profile_pipeline",
    "shipped_pipelines",
]
