"""The shipped ONNX models: they load, batch and return the documented shapes, and they
still match their PyTorch definitions (the last part only where torch is installed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnx_models.catalog import CATALOG, INPUT_NAME, MODELS_DIR, ModelCard, model_path

NAMES = list(CATALOG)


def _session(card: ModelCard) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(card.path), options, providers=["CPUExecutionProvider"])


def _images(card: ModelCard, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, *card.input_shape)).astype(np.float32)


def test_every_catalog_model_is_shipped_and_nothing_else() -> None:
    shipped = sorted(p.stem for p in MODELS_DIR.glob("*.onnx"))
    assert shipped == sorted(CATALOG)


def test_all_models_together_stay_small() -> None:
    # Twelve models of four pipelines; the five game-analysis ones are ~0.2 MB each.
    total = sum(card.path.stat().st_size for card in CATALOG.values())
    assert total <= 6_000_000, f"{total} bytes of .onnx files"


@pytest.mark.parametrize("name", NAMES)
def test_model_takes_batches_of_1_and_8_with_the_documented_shapes(name: str) -> None:
    card = CATALOG[name]
    session = _session(card)
    (inp,) = session.get_inputs()
    (out,) = session.get_outputs()
    assert (inp.name, out.name) == (INPUT_NAME, card.output_name)
    assert inp.type == "tensor(float)"
    assert inp.shape == ["batch", *card.input_shape]
    images = _images(card, 8)
    (one,) = session.run(None, {INPUT_NAME: images[:1]})
    (eight,) = session.run(None, {INPUT_NAME: images})
    assert one.shape == (1, *card.output_shape)
    assert eight.shape == (8, *card.output_shape)
    assert np.isfinite(eight).all()
    # A request's result must not depend on the batch it was served in.
    np.testing.assert_allclose(eight[:1], one, rtol=1e-4, atol=1e-5)
    # Different images give different results: the weights are not degenerate.
    assert not np.allclose(eight[0], eight[1], atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_model_metadata_names_the_model(name: str) -> None:
    meta = _session(CATALOG[name]).get_modelmeta()
    assert meta.custom_metadata_map["model"] == name
    assert meta.custom_metadata_map["seed"] == str(CATALOG[name].seed)


def test_outputs_have_their_documented_meaning() -> None:
    def run(name: str) -> np.ndarray:
        card = CATALOG[name]
        return _session(card).run(None, {INPUT_NAME: _images(card, 4)})[0]

    embedding = run("face_recognition")
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)
    for detector in ("object_detection", "person_detection"):
        boxes = run(detector)
        assert ((boxes[..., :2] >= 0) & (boxes[..., :2] <= 1)).all()  # centres in the frame
        assert (boxes[..., 2:4] > 0).all()  # widths and heights
        assert ((boxes[..., 4] > 0) & (boxes[..., 4] < 1)).all()  # objectness
    log_probs = run("text_recognition")
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-4)
    gaze = run("eye_tracking")
    assert (np.abs(gaze) <= np.pi / 2).all()
    keypoints = run("pose_recognition")
    assert ((keypoints[..., :2] >= 0) & (keypoints[..., :2] <= 1)).all()
    assert ((keypoints[..., 2] > 0) & (keypoints[..., 2] <= 1)).all()


def test_game_analysis_outputs_have_their_documented_meaning() -> None:
    def run(name: str, batch: int = 4) -> np.ndarray:
        card = CATALOG[name]
        return _session(card).run(None, {INPUT_NAME: _images(card, batch)})[0]

    boxes = run("game_object_detection")
    assert boxes.shape == (4, 6 * 10 * 3, 9)  # a 6x10 grid on a 192x320 frame, 3 anchors
    assert ((boxes[..., :2] >= 0) & (boxes[..., :2] <= 1)).all()
    assert (boxes[..., 2:4] > 0).all() and ((boxes[..., 4] > 0) & (boxes[..., 4] < 1)).all()
    # The box centres cover the whole frame, across as well as down.
    centres = boxes[0, :, :2]
    assert centres[:, 0].max() > 0.9 and centres[:, 1].max() > 0.8
    digits = run("kill_count_detection")
    np.testing.assert_allclose(np.exp(digits).sum(-1), 1.0, rtol=1e-4)  # per digit place
    assert np.isfinite(run("alive_player_recognition")).all()
    fractions = run("health_value_recognition")
    assert ((fractions > 0) & (fractions < 1)).all()
    assert run("icon_recognition").shape == (4, 32)


# --- the shipped files against the definitions (needs torch and onnx) -----------------


@pytest.fixture(scope="module")
def fresh_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="re-exporting the models needs the 'models' extra")
    pytest.importorskip("onnx", reason="re-exporting the models needs the 'models' extra")
    from onnx_models.export import export_all

    out = tmp_path_factory.mktemp("export")
    export_all(out)
    return out


@pytest.mark.slow
def test_shipped_models_match_their_definitions(fresh_export: Path) -> None:
    from onnx_models.export import compare_models

    assert compare_models(MODELS_DIR, fresh_export) == []


@pytest.mark.slow
def test_export_is_deterministic(fresh_export: Path, tmp_path: Path) -> None:
    from onnx_models.export import export_model

    again = export_model("eye_tracking", tmp_path)
    assert again.read_bytes() == model_path("eye_tracking", fresh_export).read_bytes()


@pytest.mark.slow
def test_check_fails_on_a_model_that_drifted(
    fresh_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnx_models.export import main

    shutil.copy(model_path("pose_recognition", MODELS_DIR), tmp_path / "pose_recognition.onnx")
    # A model file that is not what the definition exports (another model's weights).
    shutil.copy(model_path("face_recognition", MODELS_DIR), tmp_path / "eye_tracking.onnx")
    assert main(["--check", "--out", str(tmp_path), "pose_recognition"]) == 0
    assert main(["--check", "--out", str(tmp_path), "eye_tracking", "expression_recognition"]) == 1
    err = capsys.readouterr().err
    assert "eye_tracking" in err
    assert "expression_recognition: missing" in err


def test_export_rejects_an_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    from onnx_models.export import main

    with pytest.raises(SystemExit) as exc:
        main(["--check", "no_such_model"])
    assert exc.value.code == 2
    assert "unknown model(s) no_such_model" in capsys.readouterr().err


class _CountingSession:
    """An InferenceSession's stand-in that records the batch shapes it is run with."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.shapes: list[tuple[int, ...]] = []

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        (batch,) = feeds.values()
        self.shapes.append(batch.shape)
        return self.inner.run(outputs, feeds)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("provider", "expected"), [("CPUExecutionProvider", [1]), ("CUDAExecutionProvider", [1, 2, 4])]
)
def test_warm_up_runs_the_batch_sizes_the_provider_compiles_for(
    provider: str, expected: list[int]
) -> None:
    from taskserver.pipeline.config import ModuleConfig
    from taskserver.pipeline.sessions import OnnxModel

    card = CATALOG["eye_tracking"]
    module = ModuleConfig(id="1", name="eye_tracking", model=card.path, batch_sizes=(1, 2, 4))
    model = OnnxModel(module, ["CPUExecutionProvider"])
    counting = _CountingSession(model._session)
    model._session = counting
    # Which sizes are warmed follows the provider the session got (CUDA: one set of kernels
    # per shape); the runs themselves are real CPU inference here.
    model.provider = provider
    assert model.warm_up() >= 0.0
    assert [shape[0] for shape in counting.shapes] == expected
    assert all(shape[1:] == model.input_shape for shape in counting.shapes)


def test_a_short_batch_runs_padded_on_the_session_of_the_next_feasible_size() -> None:
    from taskserver.pipeline.config import ModuleConfig
    from taskserver.pipeline.sessions import OnnxModel

    card = CATALOG["eye_tracking"]
    module = ModuleConfig(id="1", name="eye_tracking", model=card.path, batch_sizes=(1, 2, 4))
    model = OnnxModel(module, ["CPUExecutionProvider"])
    assert model._by_size == {}  # the CPU provider: one session, batches at their own size
    # As on CUDA: one session per feasible size (real CPU sessions behind the counters).
    by_size = {b: _CountingSession(model._session) for b in (1, 2, 4)}
    model._by_size = by_size
    batch = _images(card, 3)
    out = model.run(batch)
    assert [s.shapes for s in by_size.values()] == [[], [], [(4, *card.input_shape)]]
    assert out.shape[0] == 3
    np.testing.assert_allclose(out, model._session.run(None, {INPUT_NAME: batch})[0], rtol=1e-5)
    # a batch beyond the largest feasible size runs on the first session, unpadded
    assert model.run(_images(card, 5)).shape[0] == 5
