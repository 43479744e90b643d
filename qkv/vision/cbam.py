"""Convolutional block attention module (CBAM): channel attention ("what"), then spatial attention ("where").

Paper: Woo, Park, Lee and Kweon, "CBAM: Convolutional Block Attention Module", ECCV 2018,
https://arxiv.org/abs/1807.06521.

    M_c(x) = sigmoid(MLP(avgpool(x)) + MLP(maxpool(x)))           (B, C, 1, 1), one MLP shared by both pools
    x' = M_c(x) * x
    M_s(x') = sigmoid(conv_7x7([mean_c(x'); max_c(x')]))         (B, 1, H, W), pools across channels
    out = M_s(x') * x'

The two parts are modules of their own (:class:`ChannelAttention`, :class:`SpatialAttention`) and can be
used alone.

:class:`ChannelAttention` is :class:`~qkv.vision.SqueezeExcite` with the max pool added: the same MLP
(``fc1``, ``act``, ``fc2``), applied to both pools and summed before the gate.

What differs from the paper: the MLP's layers are 1x1 convolutions (same parameters); the official code
adds a batch norm after the 7x7 convolution and orders the spatial pools ``[max; mean]``: here the
paper's formula is followed (``[mean; max]``, no norm) and ``norm_layer=nn.BatchNorm2d`` adds the norm.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .. import hooks
from ._common import LayerLike, check_input, check_positive, global_avg_pool, global_max_pool, make_layer
from .squeeze_excite import SqueezeExcite

__all__ = ["ChannelAttention", "SpatialAttention", "CBAM", "CBAMAttention", "channel_pool"]


def channel_pool(x: Tensor) -> Tensor:
    """``(B, C, H, W) -> (B, 2, H, W)``: the mean and the maximum across channels at every position."""
    return torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)


class CBAMAttention(NamedTuple):
    """The two maps of a CBAM block: ``channel (B, C, 1, 1)`` and ``spatial (B, 1, H, W)``."""

    channel: Tensor
    spatial: Tensor


class ChannelAttention(SqueezeExcite):
    """CBAM's channel part: ``x * sigmoid(MLP(avgpool(x)) + MLP(maxpool(x)))``, SE's block with a second pool.

    The shared MLP is :meth:`SqueezeExcite.excite` (``fc1``, ``act``, ``fc2``), applied to both pools.

    Args:
        channels: ``C``.  reduction: ``r``, hidden width ``C // r``.  hidden_channels: instead of ``C // r``.
        act_layer: activation inside the MLP.  gate_layer: the gate.  bias: biases of the MLP.

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention ``(B, C, 1, 1)``.
    """

    def attention(self, x: Tensor) -> Tensor:
        return self.gate(self.excite(global_avg_pool(x)) + self.excite(global_max_pool(x)))


class SpatialAttention(nn.Module):
    """CBAM's spatial part: ``x * sigmoid(conv([mean_c(x); max_c(x)]))``.

    Args:
        channels: ``C`` (checked against the input; the map itself has no per-channel parameters).
        kernel_size: of the convolution (odd; the paper finds 7 best).
        gate_layer: the gate.  bias: a bias in the convolution (the paper has none).
        norm_layer: optional norm after the convolution (``nn.BatchNorm2d`` as in the official code).

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention ``(B, 1, H, W)``.
    """

    attention_kind = "spatial"  #: what qkv.capture_attention records

    def __init__(self, channels: int, kernel_size: int = 7, *, gate_layer: LayerLike = nn.Sigmoid,
                 bias: bool = False, norm_layer: type[nn.Module] | None = None, device=None, dtype=None):
        super().__init__()
        check_positive(channels=channels, kernel_size=kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd so the map keeps the input's size, got {kernel_size}")
        kw = {"device": device, "dtype": dtype}
        self.channels = channels
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=bias, **kw)
        self.norm = norm_layer(1, **kw) if norm_layer is not None else nn.Identity()
        self.gate = make_layer(gate_layer)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        check_input(x, self.channels, type(self).__name__)
        weights = self.gate(self.norm(self.conv(channel_pool(x))))
        if hooks.active():
            hooks.report_map("spatial", weights)
        out = x * weights
        return (out, weights) if return_attention else out


class CBAM(nn.Module):
    """CBAM block: :class:`ChannelAttention` then :class:`SpatialAttention`.

    Args:
        channels: ``C``.  reduction: of the channel MLP.  kernel_size: of the spatial convolution.
        act_layer, gate_layer, bias: as in :class:`ChannelAttention` (``bias`` is the MLP's; the spatial
            convolution has none, as in the paper).  norm_layer: for the spatial part.

    Shapes: ``x (B, C, H, W) -> (B, C, H, W)``; attention :class:`CBAMAttention` ``(channel, spatial)``.
    """

    def __init__(self, channels: int, reduction: int = 16, kernel_size: int = 7, *,
                 act_layer: LayerLike = nn.ReLU, gate_layer: LayerLike = nn.Sigmoid, bias: bool = True,
                 norm_layer: type[nn.Module] | None = None, device=None, dtype=None):
        super().__init__()
        self.channel = ChannelAttention(channels, reduction, act_layer=act_layer, gate_layer=gate_layer, bias=bias,
                                        device=device, dtype=dtype)
        self.spatial = SpatialAttention(channels, kernel_size, gate_layer=gate_layer, norm_layer=norm_layer,
                                        device=device, dtype=dtype)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, CBAMAttention]:
        x, channel = self.channel(x, return_attention=True)
        out, spatial = self.spatial(x, return_attention=True)
        return (out, CBAMAttention(channel, spatial)) if return_attention else out
