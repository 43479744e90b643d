"""Efficient channel attention (ECA): a 1-D convolution across channels instead of SE's two layers.

Paper: Wang, Wu, Zhu, Li, Zuo and Hu, "ECA-Net: Efficient Channel Attention for Deep Convolutional Neural
Networks", CVPR 2020, https://arxiv.org/abs/1910.03151.

    y = avgpool(x)                          (B, C)
    w = sigmoid(conv1d_k(y))                k weights shared by all channels, zero padding, no bias
    out = x * w
    k = |log2(C) / gamma + b / gamma|_odd   adaptive kernel size (gamma = 2, b = 1)

What differs from the paper: nothing in the formula. "Nearest odd" is computed as the official code does
(truncate, then add one when even). The paper's code also ships fixed sizes (k = 3); pass ``kernel_size``
to use one. The gate can be changed (``gate_layer``).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from .. import hooks
from ._common import LayerLike, check_input, check_positive, global_avg_pool, make_layer
from .squeeze_excite import scale_channels

__all__ = ["ECA", "eca_kernel_size"]


def eca_kernel_size(channels: int, gamma: float = 2.0, b: float = 1.0) -> int:
    """The paper's adaptive kernel size ``|log2(C)/gamma + b/gamma|_odd`` (at least 1)."""
    check_positive(channels=channels)
    if gamma <= 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    t = int(abs((math.log2(channels) + b) / gamma))
    return max(t if t % 2 else t + 1, 1)


class ECA(nn.Module):
    """ECA block: ``x * sigmoid(conv1d_k(avgpool(x)))`` with a kernel sliding over channels.

    Args:
        channels: ``C``.
        kernel_size: ``k`` (odd); by default :func:`eca_kernel_size` of ``C``, ``gamma`` and ``b``.
        gamma, b: the constants of the adaptive kernel size.
        gate_layer: the gate (default sigmoid).
        bias: a bias in the 1-D convolution (the paper has none).

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention ``(B, C, 1, 1)``.
    """

    attention_kind = "channel"  #: what qkv.capture_attention records

    def __init__(self, channels: int, kernel_size: int | None = None, *, gamma: float = 2.0, b: float = 1.0,
                 gate_layer: LayerLike = nn.Sigmoid, bias: bool = False, device=None, dtype=None):
        super().__init__()
        if kernel_size is None:
            kernel_size = eca_kernel_size(channels, gamma, b)
        check_positive(channels=channels, kernel_size=kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd so that channel i stays centred, got {kernel_size}")
        self.channels = channels
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(1, 1, kernel_size, padding=kernel_size // 2, bias=bias, device=device, dtype=dtype)
        self.gate = make_layer(gate_layer)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        b, c = x.shape[:2]
        y = global_avg_pool(x).view(b, 1, c)
        weights = self.gate(self.conv(y)).view(b, c, 1, 1)
        if hooks.active():
            hooks.report_map("channel", weights)
        out = scale_channels(x, weights)
        return (out, weights) if return_attention else out

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}"
