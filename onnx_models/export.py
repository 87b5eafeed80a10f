"""Export the catalog models to ONNX: ``python -m onnx_models.export [--out DIR] [--check]``.

Writes ``<DIR>/<name>.onnx`` (default: the shipped ``onnx_models/models/``) for every
catalog model, opset 17, with a dynamic batch axis ``batch`` on the input ``image`` and on
the output. Exporting is deterministic: the weights are seeded (`models.build_model`).

``--check`` exports into a temporary folder instead and compares each fresh model with the
one in DIR by running both under onnxruntime on the same seeded input; it exits 1 when a
file is missing or an output differs, so the shipped files cannot drift from the code.
Needs the ``models`` extra (torch, onnx) and onnxruntime.

Errors: `ExportError` (see `onnx_models.errors`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from onnx_models.catalog import CATALOG, INPUT_NAME, MODELS_DIR, OPSET, ModelCard, model_path
from onnx_models.errors import ExportError

__all__ = ["compare_models", "export_all", "export_model", "main"]

# The fixed input of --check: this batch size (not 1, so batching is exercised) and seed.
_CHECK_BATCH = 3
_CHECK_SEED = 20240501
_RTOL = 1e-4
_ATOL = 1e-5


def export_model(name: str, out_dir: Path) -> Path:
    """Export catalog model `name` to ``out_dir/<name>.onnx`` and return the path."""
    import onnx
    import torch

    from onnx_models.models import build_model

    card = CATALOG[name]
    model = build_model(name)
    path = model_path(name, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(1, *card.input_shape)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of torch.export, but it is the
        # one that writes opset 17 without the extra onnxscript dependency.
        warnings.simplefilter("ignore", DeprecationWarning)
        # Tracing the GRU reads tensor values as Python booleans (input checks in
        # torch.nn.GRU); they hold for every input this model takes.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # The GRU's initial state is not an input: onnxruntime makes zeros of the run's
        # batch size, which the batch-1/batch-8 model test checks.
        warnings.filterwarnings("ignore", message=".*batch_size other than 1.*")
        try:
            torch.onnx.export(
                model,
                (example,),
                str(path),
                dynamo=False,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[card.output_name],
                dynamic_axes={INPUT_NAME: {0: "batch"}, card.output_name: {0: "batch"}},
                do_constant_folding=True,
            )
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise ExportError(f"{name}: torch.onnx.export failed: {first_line}") from exc
    proto = onnx.load(str(path))
    proto.doc_string = card.task
    del proto.metadata_props[:]
    for key, value in (("model", name), ("seed", str(card.seed)), ("task", card.task)):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def export_all(out_dir: Path = MODELS_DIR, names: Iterable[str] | None = None) -> list[Path]:
    """Export every catalog model (or just `names`) into `out_dir`."""
    return [export_model(name, out_dir) for name in (names or CATALOG)]


def _run(path: Path, card: ModelCard) -> np.ndarray:
    import onnxruntime as ort

    rng = np.random.default_rng(_CHECK_SEED)
    image = rng.standard_normal((_CHECK_BATCH, *card.input_shape)).astype(np.float32)
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (out,) = session.run([card.output_name], {INPUT_NAME: image})
    except Exception as exc:  # onnxruntime raises its own unexported exception types
        raise ExportError(f"{path}: onnxruntime cannot run it: {exc}") from exc
    return np.asarray(out)


def compare_models(
    reference_dir: Path, candidate_dir: Path, names: Iterable[str] | None = None
) -> list[str]:
    """Compare models of two folders on a seeded input; return one line per mismatch."""
    problems = []
    for name in names or CATALOG:
        card = CATALOG[name]
        reference, candidate = model_path(name, reference_dir), model_path(name, candidate_dir)
        missing = [str(p) for p in (reference, candidate) if not p.is_file()]
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        try:
            want, got = _run(candidate, card), _run(reference, card)
        except ExportError as exc:
            problems.append(str(exc))
            continue
        if want.shape != got.shape:
            problems.append(f"{name}: output shape {got.shape}, the definitions give {want.shape}")
        elif not np.allclose(got, want, rtol=_RTOL, atol=_ATOL):
            worst = float(np.max(np.abs(got - want)))
            problems.append(f"{name}: outputs differ from the definitions (max |diff| {worst:.3g})")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Export (or with --check, verify) the catalog models; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m onnx_models.export", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=MODELS_DIR, help="model folder (default: the shipped one)"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare a fresh export with the files in --out"
    )
    parser.add_argument("models", nargs="*", help="models to export (default: all)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in CATALOG]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(CATALOG)}")
    names = args.models or list(CATALOG)
    from taskserver.extras import needs

    # Before the first export: torch and onnx export, onnxruntime checks (--check).
    problem = needs("export", "torch", "onnx", *(["onnxruntime"] if args.check else []))
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                export_all(Path(tmp), names)
                problems = compare_models(args.out, Path(tmp), names)
            for line in problems:
                print(f"mismatch: {line}", file=sys.stderr)
            if problems:
                return 1
            print(f"{len(names)} models in {args.out} match their definitions")
            return 0
        for path in export_all(args.out, names):
            print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    except ExportError as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
