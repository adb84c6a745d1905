"""The built-in models. Glorot-uniform weights and zero biases (Keras' defaults), so the
TensorFlow twins start from the same initialisation scheme."""
from __future__ import annotations

from torch import nn


def _glorot(module: nn.Module) -> nn.Module:
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return module


def mlp(num_classes: int = 10) -> nn.Module:
    """The MLP of the "PyTorch 10x slower than TensorFlow" question: 784-256-128-10, dropout 0.3."""
    return _glorot(
        nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, 256),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )
    )


def cnn(num_classes: int = 10) -> nn.Module:
    """A small conv net (two 3x3 conv + max-pool blocks, then 128-unit dense): where cuDNN,
    AMP, channels_last and compilation matter."""
    return _glorot(
        nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(128, num_classes),
        )
    )
