"""The built-in models, twins of trainers/pytorch/models.py: same layers, same parameter count,
Glorot-uniform weights and zero biases (Keras' defaults). The last layer computes in float32 under
a mixed-precision policy, as the Keras mixed-precision guide advises."""
from __future__ import annotations

from typing import Any

import keras
from keras import layers, ops


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


def _conv_bn(x: Any, filters: int, kernel: int, stride: int) -> Any:
    # epsilon and momentum as PyTorch's BatchNorm2d defaults (eps 1e-5, momentum 0.1 = Keras' 0.9)
    x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False)(x)
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)


def _residual_block(x: Any, filters: int, stride: int) -> Any:
    shortcut = _conv_bn(x, filters, 1, stride) if stride != 1 or x.shape[-1] != filters else x
    body = layers.ReLU()(_conv_bn(x, filters, 3, stride))
    return layers.ReLU()(layers.Add()([_conv_bn(body, filters, 3, 1), shortcut]))


def resnet(width: int = 16, blocks: int = 1, num_classes: int = 10) -> keras.Model:
    """A 3x3 stem, three stages of ``blocks`` residual blocks (width, 2x, 4x; the last two
    stride 2) on the digits zero-padded to 32x32, global average pooling, dense."""
    inputs = keras.Input((28, 28, 1))
    x = layers.ReLU()(_conv_bn(layers.ZeroPadding2D(2)(inputs), width, 3, 1))
    for stage in range(3):
        for block in range(blocks):
            x = _residual_block(x, width << stage, 2 if stage and not block else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, dtype="float32")(x), name="digits_resnet")


class CausalSelfAttention(layers.Layer):
    """Multi-head causal self-attention: one fused q/k/v projection, keras.ops' dot-product
    attention (cuDNN flash attention where it applies), an output projection."""

    def __init__(self, width: int, heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width, self.heads = width, heads
        self.qkv = layers.Dense(3 * width)
        self.proj = layers.Dense(width)

    def build(self, input_shape: Any) -> None:
        self.qkv.build(input_shape)
        self.proj.build(input_shape)

    def call(self, x: Any) -> Any:
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        qkv = ops.reshape(self.qkv(x), (batch, length, 3, self.heads, self.width // self.heads))
        out = ops.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True)
        return self.proj(ops.reshape(out, (batch, length, self.width)))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "width": self.width, "heads": self.heads}


class TokenAndPosition(layers.Layer):
    """Token embeddings plus learned position embeddings."""

    def __init__(self, vocab: int, context: int, width: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab, self.context, self.width = vocab, context, width
        self.tokens = layers.Embedding(vocab, width)
        self.positions = layers.Embedding(context, width)

    def build(self, input_shape: Any) -> None:
        self.tokens.build(input_shape)
        self.positions.build((input_shape[1],))

    def call(self, tokens: Any) -> Any:
        return self.tokens(tokens) + self.positions(ops.arange(ops.shape(tokens)[1]))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "vocab": self.vocab, "context": self.context, "width": self.width}


def charlm(vocab: int, context: int, depth: int, width: int, heads: int) -> keras.Model:
    """The GPT-style character LM, twin of trainers/pytorch/models.py's CharLM: pre-norm blocks of
    causal self-attention and a 4x GELU MLP, a final LayerNorm, a dense head over the vocabulary."""
    inputs = keras.Input((context,), dtype="int32")
    x = TokenAndPosition(vocab, context, width)(inputs)
    for _ in range(depth):
        x = layers.Add()([x, CausalSelfAttention(width, heads)(layers.LayerNormalization(epsilon=1e-5)(x))])
        hidden = layers.Dense(4 * width, activation=keras.activations.gelu)(layers.LayerNormalization(epsilon=1e-5)(x))
        x = layers.Add()([x, layers.Dense(width)(hidden)])
    x = layers.LayerNormalization(epsilon=1e-5)(x)
    return keras.Model(inputs, layers.Dense(vocab, dtype="float32")(x), name="charlm")
