"""The built-in models, twins of trainers/pytorch/models.py: same layers, same parameter count,
Glorot-uniform weights and zero biases (Keras' defaults). The last layer computes in float32 under
a mixed-precision policy, as the Keras mixed-precision guide advises."""
from __future__ import annotations

import keras
from keras import layers


def mlp(num_classes: int = 10) -> keras.Model:
    """784-256-128-10 with ReLU and Dropout 0.3, the seed question's MLP."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Flatten(),
        layers.Dense(256, activation="relu"),
        layers.Dropout(0.3),
        layers.Dense(128, activation="relu"),
        layers.Dense(num_classes, dtype="float32"),
    ], name="digits_mlp")


def cnn(num_classes: int = 10) -> keras.Model:
    """Two 3x3 conv (32, 64) + max-pool blocks, dense 128, Dropout 0.3."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dropout(0.3),
        layers.Dense(num_classes, dtype="float32"),
    ], name="digits_cnn")
