"""Squeeze-and-excitation (SE): channel attention from globally pooled features.

Paper: Hu, Shen, Albanie, Sun and Wu, "Squeeze-and-Excitation Networks", CVPR 2018,
https://arxiv.org/abs/1709.01507.

    z = avgpool(x)                          squeeze:  (B, C, H, W) -> (B, C)
    s = sigmoid(W2 relu(W1 z + b1) + b2)    excite:   W1 (C/r x C), W2 (C x C/r)
    out = x * s                             scale every feature map by its weight

What differs from the paper: the two fully connected layers are 1x1 convolutions on ``(B, C, 1, 1)``
(the same arithmetic and the same parameters, no reshapes); the activation and the gate can be changed
(``act_layer``, ``gate_layer``); ``hidden_channels`` may replace ``channels // reduction``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .. import hooks
from ._common import LayerLike, check_input, check_positive, global_avg_pool, make_layer, reduced_channels

__all__ = ["SqueezeExcite", "scale_channels"]


def scale_channels(x: Tensor, weights: Tensor) -> Tensor:
    """``x (B, C, H, W) * weights (B, C, 1, 1)``: re-weight every feature map."""
    return x * weights


class SqueezeExcite(nn.Module):
    """SE block: ``x * sigmoid(W2 act(W1 avgpool(x)))``.

    Args:
        channels: ``C``, the input and output channels.
        reduction: ``r``; the hidden layer has ``C // r`` units (must be in ``[1, C]``).
        hidden_channels: the hidden width, instead of ``C // r``.
        act_layer: activation between the two layers (default ReLU).
        gate_layer: the gate (default sigmoid).
        bias: biases in both layers (the paper's fully connected layers have them).

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention ``(B, C, 1, 1)`` in the gate's range.
    """

    attention_kind = "channel"  #: what qkv.capture_attention records

    def __init__(self, channels: int, reduction: int = 16, *, hidden_channels: int | None = None,
                 act_layer: LayerLike = nn.ReLU, gate_layer: LayerLike = nn.Sigmoid, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        if hidden_channels is None:
            hidden_channels = reduced_channels(channels, reduction)
        check_positive(channels=channels, hidden_channels=hidden_channels)
        self.channels = channels
        self.fc1 = nn.Conv2d(channels, hidden_channels, 1, bias=bias, **kw)
        self.act = make_layer(act_layer)
        self.fc2 = nn.Conv2d(hidden_channels, channels, 1, bias=bias, **kw)
        self.gate = make_layer(gate_layer)

    def excite(self, z: Tensor) -> Tensor:
        """The excitation MLP before the gate: ``W2 act(W1 z + b1) + b2`` on pooled features ``z (B, C, 1, 1)``."""
        return self.fc2(self.act(self.fc1(z)))

    def attention(self, x: Tensor) -> Tensor:
        """The channel weights ``(B, C, 1, 1)``: the gate of the excitation of the average pool."""
        return self.gate(self.excite(global_avg_pool(x)))

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        weights = self.attention(x)
        if hooks.active():
            hooks.report_map("channel", weights)
        out = scale_channels(x, weights)
        return (out, weights) if return_attention else out
