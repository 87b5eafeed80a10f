"""From a pipeline spec file and its profile to the task server's PipelineConfig.

`onnx_models` reads and checks spec and profile files; `taskserver` runs pipelines from
plain data and imports nothing else of ours, so this adapter lives here, on the spec's
side: the CLI, the live pipeline benchmarks and the tests all build a pipeline's config
with it, and loadtests needs nothing of `deploy` for it.
"""

from __future__ import annotations

from pathlib import Path

from onnx_models.profile import default_profile_path, load_profile
from onnx_models.spec import load_pipeline, pipeline_path
from taskserver.pard import ScalingConfig
from taskserver.pipeline import PipelineConfig

__all__ = ["pipeline_config"]


def pipeline_config(
    spec: str | Path,
    *,
    profile: str | Path | None = None,
    dropper: str = "pard",
    providers: str = "auto",
    local: tuple[str, ...] = (),
    peers: dict[str, str] | None = None,
    workers: int | ScalingConfig = 1,
) -> PipelineConfig:
    """The PipelineConfig of a spec (a shipped name such as "traffic", or a file path).

    The profile defaults to the one written next to the spec by `tailgate profile`. `local`
    and `peers` make it one stage of a pipeline split across task servers; `workers` is a
    fixed count per module or the settings of run-time scaling.
    Raises PipelineSpecError / ProfileError / PipelineConfigError (all ValueErrors) naming
    the file and field that is wrong.
    """
    s = load_pipeline(pipeline_path(spec))
    prof = load_profile(profile if profile is not None else default_profile_path(s), s)
    return PipelineConfig(
        name=s.name,
        slo_ms=s.slo_ms,
        modules=s.modules,  # the spec's modules are already the task server's schema
        profile=prof,
        dropper=dropper,
        providers=providers,
        local=local,
        peers=peers or {},
        workers=workers,
    )
