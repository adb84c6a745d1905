"""The built-in models. Glorot-uniform weights, zero biases and embeddings uniform in +-0.05
(Keras' defaults), so the TensorFlow twins start from the same initialisation scheme."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _glorot(module: nn.Module) -> nn.Module:
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.Embedding):
            nn.init.uniform_(layer.weight, -0.05, 0.05)
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


def _conv_bn(cin: int, cout: int, kernel: int, stride: int) -> list[nn.Module]:
    # BatchNorm's eps and momentum are Keras' twin's (epsilon 1e-5, momentum 0.9)
    return [nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class ResidualBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers and a shortcut (a 1x1 conv + BatchNorm where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, 3, stride), nn.ReLU(), *_conv_bn(cout, cout, 3, 1))
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout \
            else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def resnet(width: int = 16, blocks: int = 1, num_classes: int = 10) -> nn.Module:
    """A small ResNet at 32x32 (the 28x28 digits zero-padded by 2): a 3x3 stem, three stages of
    ``blocks`` residual blocks at ``width``, 2x and 4x channels (the last two halve the size),
    global average pooling, a dense classifier."""
    layers: list[nn.Module] = [nn.ZeroPad2d(2), *_conv_bn(1, width, 3, 1), nn.ReLU()]
    cin = width
    for stage in range(3):
        for block in range(blocks):
            cout = width << stage
            layers.append(ResidualBlock(cin, cout, 2 if stage and not block else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return _glorot(nn.Sequential(*layers))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one fused q/k/v projection, scaled dot-product attention
    (flash or memory-efficient kernels where the device has them), an output projection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class TransformerBlock(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + MLP(norm(x)) with a 4x GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    """A GPT-style character language model: token + learned position embeddings, ``depth``
    pre-norm transformer blocks, a final LayerNorm and a dense head over the vocabulary."""

    def __init__(self, vocab: int, context: int, depth: int, width: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(TransformerBlock(width, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.tokens(tokens) + self.positions(positions))))


def charlm(vocab: int, context: int, depth: int, width: int, heads: int) -> nn.Module:
    """The charlm model, initialised as its Keras twin."""
    return _glorot(CharLM(vocab, context, depth, width, heads))
