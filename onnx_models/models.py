"""PyTorch definitions of the catalog models (needs the ``models`` extra: torch).

Small but real vision networks built from the ops that production models use (conv,
batch norm, ReLU, pooling, depthwise-separable blocks, residual blocks, a bidirectional
GRU, soft-argmax) for the traffic, live-video and game-analysis pipelines, sized so that
one CPU call at batch 1 takes a few milliseconds and the cost grows with the batch. The
weights are random but deterministic: each model is built after
`torch.manual_seed(card.seed)`, and its batch-norm statistics are then calibrated on seeded
random images, so activations stay in a realistic range instead of collapsing.

The shapes each model takes and returns are documented in `catalog.py`; `build_model`
returns a model in eval mode that honours them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from onnx_models.catalog import CATALOG, ModelCard

__all__ = ["build_model"]

# Batch-norm calibration: this many seeded random batches of this size, in train mode.
_CALIBRATION_BATCHES = 4
_CALIBRATION_BATCH_SIZE = 16


def _conv_bn_relu(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def _separable(cin: int, cout: int, stride: int) -> nn.Module:
    """Depthwise 3x3 then pointwise 1x1 (MobileNet block)."""
    return nn.Sequential(
        _conv_bn_relu(cin, cin, 3, stride=stride, groups=cin),
        _conv_bn_relu(cin, cout, 1),
    )


class _Residual(nn.Module):
    """Two 3x3 conv-bn layers with a (projected) shortcut (ResNet basic block)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class Detector(nn.Module):
    """Single-scale anchor detector (YOLO-style head, stride 32) on a small conv backbone.

    `input_size` is the side of a square frame or its (height, width); `widths` are the
    backbone's channel counts at strides 2, 2, 4, 8 and 16-32.
    """

    def __init__(
        self,
        input_size: int | tuple[int, int],
        num_classes: int,
        widths: tuple[int, int, int, int, int] = (16, 32, 48, 96, 128),
    ) -> None:
        super().__init__()
        anchors = ((0.10, 0.15), (0.25, 0.35), (0.50, 0.70))  # (w, h) as image fractions
        w1, w2, w3, w4, w5 = widths
        # Full 3x3 convolutions while the maps are large (detail), depthwise-separable
        # blocks once they are small and wide (MobileNet-style), as detectors do.
        self.backbone = nn.Sequential(
            _conv_bn_relu(3, w1, stride=2),  # /2
            _conv_bn_relu(w1, w2),
            _conv_bn_relu(w2, w3, stride=2),  # /4
            _conv_bn_relu(w3, w3),
            _separable(w3, w4, stride=2),  # /8
            _conv_bn_relu(w4, w4),
            _separable(w4, w5, stride=2),  # /16
            _separable(w5, w5, stride=2),  # /32
        )
        height, width = (input_size, input_size) if isinstance(input_size, int) else input_size
        self.rows, self.cols = height // 32, width // 32
        self.columns = 5 + num_classes
        self.head = nn.Conv2d(w5, len(anchors) * self.columns, 1)
        gy, gx, a = self.rows, self.cols, len(anchors)
        ys, xs = torch.meshgrid(torch.arange(gy), torch.arange(gx), indexing="ij")
        cells = torch.stack([xs, ys], dim=-1).float().reshape(gy * gx, 1, 2).expand(gy * gx, a, 2)
        self.register_buffer("cells", cells.reshape(gy * gx * a, 2).clone())
        self.register_buffer("anchor_wh", torch.tensor(anchors).repeat(gy * gx, 1))
        self.register_buffer("grid", torch.tensor([float(gx), float(gy)]))  # cells per (x, y)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        raw = self.head(self.backbone(image))  # (N, A*C, GY, GX)
        n = raw.shape[0]
        raw = raw.reshape(n, -1, self.columns, self.rows, self.cols)
        raw = raw.permute(0, 3, 4, 1, 2).reshape(n, -1, self.columns)  # (N, GY*GX*A, C)
        xy = (torch.sigmoid(raw[..., 0:2]) + self.cells) / self.grid
        wh = torch.exp(raw[..., 2:4].clamp(max=4.0)) * self.anchor_wh
        objectness = torch.sigmoid(raw[..., 4:5])
        return torch.cat([xy, wh, objectness, raw[..., 5:]], dim=-1)


class FaceEmbedder(nn.Module):
    """Residual CNN to an L2-normalised 128-d embedding (ArcFace-style 112x112 input)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 16, stride=2),  # 56x56
            _conv_bn_relu(16, 24),
            _Residual(24, 32),
            _Residual(32, 48, stride=2),  # 28x28
            _Residual(48, 64, stride=2),  # 14x14
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.project = nn.Linear(64, 128)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.project(self.features(image)), dim=1)


class TextRecognizer(nn.Module):
    """CRNN: a CNN reduces the crop to a 48-step sequence, a bidirectional GRU reads it."""

    def __init__(self, symbols: int = 37) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 24),
            _conv_bn_relu(24, 24),
            nn.MaxPool2d(2),  # 24x96
            _conv_bn_relu(24, 48),
            nn.MaxPool2d(2),  # 12x48
            _conv_bn_relu(48, 64),
            _conv_bn_relu(64, 64),
            nn.MaxPool2d((2, 1)),  # 6x48
            _conv_bn_relu(64, 96),
            nn.MaxPool2d((6, 1)),  # 1x48
        )
        self.rnn = nn.GRU(96, 48, batch_first=True, bidirectional=True)
        self.classify = nn.Linear(96, symbols)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        seq = self.features(image).squeeze(2).permute(0, 2, 1)  # (N, 48, 96)
        out, _ = self.rnn(seq)
        return F.log_softmax(self.classify(out), dim=-1)


class ExpressionClassifier(nn.Module):
    """VGG-style CNN over a grey face crop to 7 expression logits (FER-style)."""

    def __init__(self, classes: int = 7) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(1, 32),
            _conv_bn_relu(32, 32),
            nn.MaxPool2d(2),  # 32x32
            _conv_bn_relu(32, 64),
            _conv_bn_relu(64, 64),
            nn.MaxPool2d(2),  # 16x16
            _conv_bn_relu(64, 96),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classify = nn.Sequential(
            nn.Dropout(0.3), nn.Linear(96, 64), nn.ReLU(inplace=True), nn.Linear(64, classes)
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(image))


class GazeEstimator(nn.Module):
    """CNN over a grey eye patch to (pitch, yaw) in radians (GazeNet-style)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(1, 32),
            _conv_bn_relu(32, 32),
            nn.MaxPool2d(2),  # 18x30
            _conv_bn_relu(32, 48),
            _conv_bn_relu(48, 48),
            nn.MaxPool2d(2),  # 9x15
            _conv_bn_relu(48, 64),
            nn.AdaptiveAvgPool2d((3, 3)),
            nn.Flatten(),
        )
        self.regress = nn.Sequential(nn.Linear(64 * 9, 64), nn.ReLU(inplace=True))
        self.angles = nn.Linear(64, 2)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.angles(self.regress(self.features(image)))) * (math.pi / 2)


class PoseEstimator(nn.Module):
    """Residual CNN to 17 keypoint heatmaps, read out by soft-argmax (SimpleBaseline-style)."""

    def __init__(self, keypoints: int = 17) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 24, stride=2),  # 64x48
            _Residual(24, 48, stride=2),  # 32x24
            _Residual(48, 48),
            _Residual(48, 64),
        )
        self.heatmaps = nn.Conv2d(64, keypoints, 1)
        h, w = 32, 24
        ys, xs = torch.meshgrid(
            (torch.arange(h).float() + 0.5) / h, (torch.arange(w).float() + 0.5) / w, indexing="ij"
        )
        self.register_buffer("xs", xs.reshape(1, 1, h * w))
        self.register_buffer("ys", ys.reshape(1, 1, h * w))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        maps = self.heatmaps(self.features(image))
        probs = torch.softmax(maps.flatten(2), dim=-1)  # (N, K, H*W)
        x = (probs * self.xs).sum(-1)
        y = (probs * self.ys).sum(-1)
        confidence = probs.amax(-1)
        return torch.stack([x, y, confidence], dim=-1)


class DigitReader(nn.Module):
    """CNN over a grey HUD counter crop to per-place digit log-probabilities (kill count)."""

    def __init__(self, places: int = 3, symbols: int = 11) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(1, 16),
            _conv_bn_relu(16, 24),
            nn.MaxPool2d(2),  # 16x48
            _conv_bn_relu(24, 32),
            _conv_bn_relu(32, 48),
            nn.MaxPool2d(2),  # 8x24
            _conv_bn_relu(48, 64),
            nn.AdaptiveAvgPool2d((1, places)),  # one column per digit place
        )
        self.classify = nn.Conv2d(64, symbols, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        logits = self.classify(self.features(image)).squeeze(2).permute(0, 2, 1)  # (N, P, S)
        return F.log_softmax(logits, dim=-1)


class SquadStatusClassifier(nn.Module):
    """CNN over the squad panel to (alive, knocked, eliminated) logits per player row."""

    def __init__(self, players: int = 4, states: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 16),
            _conv_bn_relu(16, 32),
            nn.MaxPool2d(2),  # 32x64
            _Residual(32, 48, stride=2),  # 16x32
            nn.AdaptiveAvgPool2d((players, 1)),  # one row per player, stacked top to bottom
        )
        self.classify = nn.Conv2d(48, states, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(image)).squeeze(3).permute(0, 2, 1)  # (N, P, S)


class BarGauge(nn.Module):
    """CNN over a wide HUD bar crop to fill fractions in (0, 1) (health and shield)."""

    def __init__(self, gauges: int = 2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 16),
            _conv_bn_relu(16, 24),
            nn.MaxPool2d(2),  # 12x80
            _conv_bn_relu(24, 32),
            nn.MaxPool2d(2),  # 6x40
            _conv_bn_relu(32, 48),
            nn.AdaptiveAvgPool2d((1, 8)),  # the bar read in 8 segments from left to right
            nn.Flatten(),
        )
        self.regress = nn.Sequential(nn.Linear(48 * 8, 32), nn.ReLU(inplace=True))
        self.fill = nn.Linear(32, gauges)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fill(self.regress(self.features(image))))


class IconClassifier(nn.Module):
    """Residual CNN over an item icon to class logits (weapons, items)."""

    def __init__(self, classes: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 16),
            _Residual(16, 32, stride=2),  # 32x32
            _Residual(32, 48, stride=2),  # 16x16
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classify = nn.Linear(48, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(image))


_FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "object_detection": lambda: Detector(224, num_classes=4),
    "person_detection": lambda: Detector(192, num_classes=0),
    "face_recognition": FaceEmbedder,
    "text_recognition": TextRecognizer,
    "expression_recognition": ExpressionClassifier,
    "eye_tracking": GazeEstimator,
    "pose_recognition": PoseEstimator,
    "game_object_detection": lambda: Detector((192, 320), 4, widths=(16, 24, 32, 48, 64)),
    "kill_count_detection": DigitReader,
    "alive_player_recognition": SquadStatusClassifier,
    "health_value_recognition": BarGauge,
    "icon_recognition": IconClassifier,
}


def _calibrate_batch_norm(model: nn.Module, card: ModelCard) -> None:
    """Set batch-norm running statistics from seeded random images (cumulative average)."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over the calibration batches
    generator = torch.Generator().manual_seed(card.seed)
    model.train()
    with torch.no_grad():
        for _ in range(_CALIBRATION_BATCHES):
            model(torch.randn(_CALIBRATION_BATCH_SIZE, *card.input_shape, generator=generator))
    model.eval()


def build_model(name: str) -> nn.Module:
    """Build catalog model `name` with its seeded weights, in eval mode."""
    try:
        card = CATALOG[name]
        factory = _FACTORIES[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(CATALOG)}") from None
    torch.manual_seed(card.seed)
    model = factory()
    _calibrate_batch_norm(model, card)
    return model
