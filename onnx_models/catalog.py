"""The model catalog: what each shipped ONNX model takes and returns (no torch needed).

Every model has one float32 input named ``image`` (NCHW, dynamic batch axis ``batch``) and
one float32 output whose shape is documented here; `models.py` holds the PyTorch
definitions and `export.py` writes them to ``onnx_models/models/<name>.onnx``. Pipelines
(``onnx_models/pipelines/*.json``) refer to these files; a model shared by several
pipelines (face recognition) is one file. The game-analysis pipeline has its own detector
(`game_object_detection`): game frames and classes are not the traffic detector's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = ["CATALOG", "INPUT_NAME", "MODELS_DIR", "OPSET", "ModelCard", "model_path"]

MODELS_DIR = Path(__file__).resolve().parent / "models"
INPUT_NAME = "image"
OPSET = 17


@dataclass(frozen=True)
class ModelCard:
    """One shipped model: its input and output, without the batch axis."""

    name: str
    """File stem of the model (``models/<name>.onnx``)."""
    task: str
    """What the model computes, in one line."""
    input_shape: tuple[int, ...]
    """Input shape without the batch axis (C, H, W)."""
    output_name: str
    """Name of the single output."""
    output_shape: tuple[int, ...]
    """Output shape without the batch axis."""
    seed: int
    """`torch.manual_seed` used before the weights are built."""

    @property
    def path(self) -> Path:
        """The shipped ``.onnx`` file of this model."""
        return model_path(self.name)


def model_path(name: str, models_dir: Path = MODELS_DIR) -> Path:
    """Path of the ``.onnx`` file of a catalog model."""
    return models_dir / f"{name}.onnx"


_CARDS = (
    ModelCard(
        name="object_detection",
        task="vehicles and pedestrians on a 224x224 frame: 7x7 grid x 3 anchors, rows "
        "(cx, cy, w, h, objectness, 4 class logits: car, bus, person, bike)",
        input_shape=(3, 224, 224),
        output_name="detections",
        output_shape=(147, 9),
        seed=101,
    ),
    ModelCard(
        name="person_detection",
        task="people on a 192x192 frame: 6x6 grid x 3 anchors, rows (cx, cy, w, h, objectness)",
        input_shape=(3, 192, 192),
        output_name="detections",
        output_shape=(108, 5),
        seed=102,
    ),
    ModelCard(
        name="face_recognition",
        task="128-d L2-normalised face embedding of a 112x112 face crop (residual CNN)",
        input_shape=(3, 112, 112),
        output_name="embedding",
        output_shape=(128,),
        seed=103,
    ),
    ModelCard(
        name="text_recognition",
        task="plate/sign text of a 48x192 crop: log-probabilities of 48 columns over "
        "37 symbols (CTC blank, 0-9, A-Z) from a CNN + bidirectional GRU (CRNN)",
        input_shape=(3, 48, 192),
        output_name="log_probs",
        output_shape=(48, 37),
        seed=104,
    ),
    ModelCard(
        name="expression_recognition",
        task="7 facial-expression logits of a 64x64 grey face crop (VGG-style CNN)",
        input_shape=(1, 64, 64),
        output_name="logits",
        output_shape=(7,),
        seed=105,
    ),
    ModelCard(
        name="eye_tracking",
        task="gaze direction (pitch, yaw) in radians of a 36x60 grey eye patch",
        input_shape=(1, 36, 60),
        output_name="gaze",
        output_shape=(2,),
        seed=106,
    ),
    ModelCard(
        name="pose_recognition",
        task="17 body keypoints (x, y in [0, 1], confidence) of a 128x96 person crop "
        "by soft-argmax over 32x24 heatmaps",
        input_shape=(3, 128, 96),
        output_name="keypoints",
        output_shape=(17, 3),
        seed=107,
    ),
    ModelCard(
        name="game_object_detection",
        task="players and objects on a 192x320 game frame: 6x10 grid x 3 anchors, rows "
        "(cx, cy, w, h, objectness, 4 class logits: player, weapon, vehicle, supply)",
        input_shape=(3, 192, 320),
        output_name="detections",
        output_shape=(180, 9),
        seed=108,
    ),
    ModelCard(
        name="kill_count_detection",
        task="kill counter of a 32x96 grey HUD crop: log-probabilities of 3 digit places "
        "(hundreds, tens, units) over 11 symbols (blank, 0-9)",
        input_shape=(1, 32, 96),
        output_name="log_probs",
        output_shape=(3, 11),
        seed=109,
    ),
    ModelCard(
        name="alive_player_recognition",
        task="squad panel of 64x128: logits of (alive, knocked, eliminated) for each of "
        "4 player rows",
        input_shape=(3, 64, 128),
        output_name="logits",
        output_shape=(4, 3),
        seed=110,
    ),
    ModelCard(
        name="health_value_recognition",
        task="health and shield bars of a 24x160 HUD crop: fill fractions in (0, 1)",
        input_shape=(3, 24, 160),
        output_name="fractions",
        output_shape=(2,),
        seed=111,
    ),
    ModelCard(
        name="icon_recognition",
        task="32 weapon/item class logits of a 64x64 icon (residual CNN)",
        input_shape=(3, 64, 64),
        output_name="logits",
        output_shape=(32,),
        seed=112,
    ),
)

CATALOG: MappingProxyType[str, ModelCard] = MappingProxyType({c.name: c for c in _CARDS})
"""Every shipped model, by name."""
